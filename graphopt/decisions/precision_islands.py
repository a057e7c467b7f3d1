"""fp32 islands: ops whose numerics reduced precision does not bound, each with its reason.

Both backends keep these ops in fp32 when the model runs in bf16/fp16: the torch pass by ATen
name, the ONNX pass through its map from ONNX ops to these names (the reasons are shared, so
the report says the same thing for the same op on either backend).

Sources:
  [AUTOCAST] PyTorch AMP docs, "Autocast Op Reference": the CUDA ops that autocast always runs
             in float32 (softmax, log_softmax, layer_norm, group_norm, exp, log, pow, rsqrt,
             reciprocal, sum, prod, cumsum, norm, ...).
  [IEEE]     IEEE 754 binary16 (fp16): 11 significant bits, max 65504; bfloat16: 8 significant
             bits, fp32's 8-bit exponent (max ~3.4e38).
"""

from __future__ import annotations

__all__ = ["ISLAND_OPS", "SIGNIFICAND_BITS"]

#: significant bits (mantissa + implicit 1) [IEEE]. A running sum of n equal terms stops growing
#: once n exceeds 2**bits (the next term is below half an ulp of the sum), which bounds how many
#: elements a mean may reduce in that format without a fp32 accumulator.
SIGNIFICAND_BITS: dict[str, int] = {"bf16": 8, "fp16": 11}

_SOFTMAX = ("softmax: exp of a logit above ln(65504) ~ 11 overflows fp16, and the normalising "
            "sum needs more than bf16's 8 significant bits")
_NORM = ("normalisation: the mean of squares overflows fp16 (65504) once activations pass ~256, "
         "and the variance subtracts nearly equal numbers")
_EXP = "exp overflows fp16 above ~11 and amplifies input rounding by its own value"
_LOG = "log/log1p near 1 turn the input's rounding error into a large relative error"
_POW = "powers square the range: |x| > 256 overflows fp16 (x^2 > 65504), as in x.pow(2).mean()"
_RECIP = "1/x and 1/sqrt(x) of small values overflow fp16 (1/x > 65504 for x < 1.5e-5)"
_SUM = "sums grow with the element count: fp16 overflows, and bf16 stalls past 256 terms"
_TRIG = "sin/cos of large angles (RoPE positions) keep no correct digits with 8-11 bits"
_LOSS = "losses and distances reduce differences of nearly equal numbers"

#: ops kept as fp32 islands, each with the reason the report shows [AUTOCAST fp32 list]
ISLAND_OPS: dict[str, str] = {
    **{op: _SOFTMAX for op in ("softmax", "_softmax", "log_softmax", "_log_softmax",
                               "logsumexp", "log_sigmoid", "softplus")},
    **{op: _NORM for op in ("layer_norm", "native_layer_norm", "group_norm", "native_group_norm",
                            "batch_norm", "_native_batch_norm_legit_no_training",
                            "_native_batch_norm_legit", "native_batch_norm", "instance_norm",
                            "rms_norm", "_fused_rms_norm", "var", "std", "var_mean",
                            "std_mean", "norm", "linalg_vector_norm", "frobenius_norm",
                            "renorm", "normalize")},
    **{op: _EXP for op in ("exp", "exp2", "expm1", "sinh", "cosh", "erfinv")},
    **{op: _LOG for op in ("log", "log2", "log10", "log1p", "acos", "asin", "tan")},
    **{op: _POW for op in ("pow", "square", "float_power")},
    **{op: _RECIP for op in ("rsqrt", "sqrt", "reciprocal")},
    **{op: _SUM for op in ("sum", "nansum", "prod", "cumsum", "cumprod")},
    **{op: _TRIG for op in ("sin", "cos")},
    **{op: _LOSS for op in ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss",
                            "binary_cross_entropy", "binary_cross_entropy_with_logits",
                            "cross_entropy_loss", "nll_loss", "kl_div", "cosine_similarity",
                            "pairwise_distance", "cdist", "dist")},
}
