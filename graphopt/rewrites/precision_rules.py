"""The precision pass's rules: which format a target runs, which ATen ops may run in it.

Sources:
  [AUTOCAST] PyTorch AMP docs, "Autocast Op Reference": the CUDA ops that autocast runs in
             float16 (matmul/conv/linear/bmm/...) and those it always runs in float32 (softmax,
             log_softmax, layer_norm, group_norm, exp, log, pow, rsqrt, reciprocal, sum, prod,
             cumsum, norm, ...). Ops on neither list run at the widest input type.
  [HW]       graphopt/hardware: a dtype is native where the profile lists its peak; bf16
             tensor cores from sm_80 (``capabilities_for``), AMX/AVX512-BF16 on CPUs.
  [IEEE]     IEEE 754 binary16 (fp16): 11 significant bits, max 65504; bfloat16: 8 significant
             bits, fp32's 8-bit exponent (max ~3.4e38).
"""

from __future__ import annotations

import torch

from graphopt.errors import GraphoptError
from graphopt.hardware.profile import HardwareProfile

__all__ = [
    "CAST_OPS",
    "FOLLOW_OPS",
    "ISLAND_OPS",
    "LOW_OPS",
    "MEAN_OPS",
    "SHAPE_QUERIES",
    "SIGNIFICAND_BITS",
    "choose_precision",
]

_CHOICES = ("auto", "fp32", "tf32", "bf16", "fp16")

#: significant bits (mantissa + implicit 1) [IEEE]. A running sum of n equal terms stops growing
#: once n exceeds 2**bits (the next term is below half an ulp of the sum), which bounds how many
#: elements a mean may reduce in that format without a fp32 accumulator.
SIGNIFICAND_BITS: dict[torch.dtype, int] = {torch.bfloat16: 8, torch.float16: 11}

#: GEMM-like ops: the tensor-core / AMX work that reduced precision exists for [AUTOCAST
#: "ops that can autocast to float16"]. Kernels accumulate in fp32 (cuBLAS/cuDNN/oneDNN for
#: bf16/fp16 inputs), so only the rounding of the inputs is lost.
LOW_OPS: dict[str, str] = {
    **{op: "GEMM" for op in ("linear", "matmul", "mm", "bmm", "addmm", "baddbmm", "addbmm",
                             "mv", "addmv", "einsum", "_addmm_activation")},
    **{op: "conv" for op in ("conv1d", "conv2d", "conv3d", "convolution", "_convolution",
                             "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")},
    **{op: "attention" for op in ("scaled_dot_product_attention",
                                  "_scaled_dot_product_flash_attention",
                                  "_scaled_dot_product_efficient_attention",
                                  "_scaled_dot_product_flash_attention_for_cpu")},
}

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

#: averaging reductions: reduced precision only while the element count stays below the
#: format's exact-accumulation bound (SIGNIFICAND_BITS)
MEAN_OPS = frozenset({"mean", "avg_pool1d", "avg_pool2d", "avg_pool3d", "adaptive_avg_pool1d",
                      "adaptive_avg_pool2d", "adaptive_avg_pool3d", "_adaptive_avg_pool2d"})

#: dtype-polymorphic ops that are benign at any precision: elementwise maps with bounded
#: relative error, and data movement (exact). They run at the type of their inputs.
FOLLOW_OPS = frozenset({
    # elementwise arithmetic and activations
    "add", "sub", "rsub", "mul", "div", "neg", "abs", "relu", "relu6", "gelu", "silu", "sigmoid",
    "tanh", "hardtanh", "hardswish", "hardsigmoid", "leaky_relu", "elu", "selu", "celu", "mish",
    "clamp", "clamp_min", "clamp_max", "clip", "where", "maximum", "minimum", "masked_fill",
    "erf", "sign", "dropout", "lerp", "addcmul", "addcdiv", "fill", "zero",
    # views and data movement
    "view", "reshape", "_unsafe_view", "permute", "transpose", "t", "contiguous", "clone",
    "expand", "expand_as", "unsqueeze", "squeeze", "flatten", "unflatten", "slice", "select",
    "narrow", "split", "split_with_sizes", "chunk", "unbind", "cat", "concat", "stack", "pad",
    "constant_pad_nd", "reflection_pad2d", "replication_pad2d", "repeat", "repeat_interleave",
    "roll", "flip", "index", "index_select", "gather", "embedding", "alias", "detach",
    "lift_fresh_copy", "copy", "copy_", "_to_copy", "to", "tril", "triu", "movedim", "swapaxes",
    "unfold",
    "pixel_shuffle", "pixel_unshuffle", "channel_shuffle", "upsample_nearest1d",
    "upsample_nearest2d", "upsample_nearest3d", "upsample_bilinear2d", "interpolate",
    "zeros_like", "ones_like", "empty_like", "full_like", "new_zeros", "new_ones", "new_full",
    "new_empty", "index_put", "scatter", "masked_scatter", "slice_scatter", "select_scatter",
    # order statistics are exact in any format
    "max_pool1d", "max_pool2d", "max_pool3d", "max_pool2d_with_indices", "adaptive_max_pool2d",
    "amax", "amin", "max", "min", "topk", "sort",
})

#: ops whose output dtype is another tensor's. Conversions that name a dtype keep the model's
#: choice; note that export writes every ``.to(...)`` as ``to.dtype_layout`` with the traced
#: dtype filled in, so even ``.to(memory_format=...)`` pins it (safe: more fp32, not less).
CAST_OPS = frozenset({"type_as"})

#: shape/metadata queries: they read no values, so a producer's dtype does not matter to them
SHAPE_QUERIES = frozenset({"sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "size",
                           "stride", "dim", "numel"})


# ------------------------------------------------------------- the format of a target
def _ratio(target: HardwareProfile, fmt: str) -> float:
    return target.peak_flops.get(fmt, 0.0) / max(target.peak_flops.get("fp32", 0.0), 1.0)


def _where(target: HardwareProfile) -> str:
    cc = target.compute_capability
    return (f"{target.display_name} ({target.generation}, sm_{cc[0]}{cc[1]})" if cc
            else f"{target.display_name}")


def _auto(target: HardwareProfile) -> tuple[str, str]:
    where = _where(target)
    if target.is_gpu:
        if "bf16" in target.peak_flops:
            return "bf16", (f"bf16: {where} has bf16 tensor cores at {_ratio(target, 'bf16'):.0f}x "
                            "the fp32 peak, and bf16 keeps fp32's exponent range (no fp16 "
                            "overflow)")
        if "fp16" in target.peak_flops:
            return "fp16", (f"fp16: {where} tensor cores run fp16 at {_ratio(target, 'fp16'):.0f}x"
                            " the fp32 peak but not bf16 (bf16 tensor cores start at sm_80)")
        return "fp32", f"fp32: {where} has no reduced-precision tensor cores"
    if _ratio(target, "bf16") > 1.0:
        return "bf16", (f"bf16: {where} runs bf16 natively (AMX/AVX512-BF16/BF16 dot products) "
                        f"at {_ratio(target, 'bf16'):.0f}x the fp32 peak")
    return "fp32", (f"fp32: {where} has no native bf16 (needs AVX512-BF16 or AMX): bf16 would "
                    "be emulated and slower than fp32")


def choose_precision(target: HardwareProfile, requested: str) -> tuple[str, str]:
    """The compute dtype for ``target`` and the user's request, with the reason.

    ``"auto"`` picks the fastest format the target runs natively: bf16 on sm_80+ GPUs, fp16 on
    Volta/Turing, bf16 on CPUs whose bf16 peak exceeds fp32 (AMX, AVX512-BF16), else fp32.
    An explicit bf16/fp16 request the target cannot run natively is a wish for reduced
    precision, not an order: it falls back to what ``"auto"`` picks and the reason says so
    (rather than raising, so one script runs on every target). ``"tf32"`` needs sm_80+ tensor
    cores, else fp32. Unknown requests raise GraphoptError.
    """
    if requested not in _CHOICES:
        raise GraphoptError(f"precision={requested!r} is not an option",
                            f"use one of: {', '.join(_CHOICES)}")
    auto, auto_reason = _auto(target)
    if requested == "auto":
        return auto, auto_reason
    if requested == "fp32":
        return "fp32", "fp32 as requested: no reduced precision"
    where = _where(target)
    if requested == "tf32":
        if target.is_gpu and target.has("tf32"):
            return "tf32", (f"tf32 as requested: {where} runs fp32 GEMMs on tensor cores with "
                            "10-bit mantissa inputs and fp32 accumulation")
        return "fp32", (f"fp32: tf32 requested, but {where} has no TF32 tensor cores (a GPU "
                        "format from Ampere, sm_80, on)")
    if requested in target.peak_flops:
        return requested, (f"{requested} as requested: {where} runs it natively at "
                           f"{_ratio(target, requested):.0f}x the fp32 peak")
    return auto, (f"{auto}: {requested} requested, but {where} does not run {requested} "
                  f"natively (it would be emulated, slower than fp32); fell back to the auto "
                  f"choice ({auto_reason})")
