"""fp32 islands: ops whose numerics reduced precision does not bound, each with its reason.

Keyed by canonical op (:mod:`graphopt.ir.ops`), which both frontends map into, so one node gets one
island decision on either backend (``precision.by_op.island_reason``). An ATen op the torch
frontend does not map keeps its source name and is an island by the torch pass's rule 5 (not on
its reduced-precision allowlist).

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

#: canonical ops kept as fp32 islands, each with the reason the report shows [AUTOCAST fp32 list]
ISLAND_OPS: dict[str, str] = {
    **{op: _SOFTMAX for op in ("Softmax", "LogSoftmax", "ReduceLogSumExp", "ReduceLogSum",
                               "Softplus")},
    **{op: _NORM for op in ("LayerNormalization", "GroupNormalization", "BatchNormalization",
                            "InstanceNormalization", "RMSNormalization",
                            "MeanVarianceNormalization", "LpNormalization", "ReduceL1",
                            "ReduceL2", "Var", "Std")},
    **{op: _EXP for op in ("Exp", "Sinh", "Cosh")},
    **{op: _LOG for op in ("Log", "Tan", "Asin", "Acos")},
    "Pow": _POW,
    **{op: _RECIP for op in ("Rsqrt", "Sqrt", "Reciprocal")},
    **{op: _SUM for op in ("ReduceSum", "ReduceSumSquare", "ReduceProd", "CumSum")},
    **{op: _TRIG for op in ("Sin", "Cos")},
}
