"""The torch precision pass's op tables (which ATen ops run low, follow, or read shapes only)
and the dtype helpers it reads fx values with.

The format a target runs is :mod:`graphopt.decisions.precision.format`'s decision and the fp32
islands are :mod:`graphopt.decisions.precision.by_op`'s, by canonical op (shared with the ONNX
pass); these tables say how the torch backend propagates dtypes around them.

Sources:
  [AUTOCAST] PyTorch AMP docs, "Autocast Op Reference": the CUDA ops that autocast runs in
             float16 (matmul/conv/linear/bmm/...) and those it always runs in float32 (softmax,
             log_softmax, layer_norm, group_norm, exp, log, pow, rsqrt, reciprocal, sum, prod,
             cumsum, norm, ...). Ops on neither list run at the widest input type.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from graphopt.decisions.precision.roles import OpTables

__all__ = [
    "CANONICAL",
    "CAST_OPS",
    "FOLLOW_OPS",
    "LOW_OPS",
    "MEAN_OPS",
    "SHAPE_QUERIES",
    "TABLES",
    "as_dtype",
    "explicit_dtype",
    "float_dtype",
]

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

#: allowlisted ATen ops the shared island rule (``precision.by_op.island_reason``) can still make
#: islands, by canonical op: a node a pass added has no plan node, so the pass asks with this
#: (a square ``mul(x, x)`` is ``Pow``'s island)
CANONICAL: dict[str, str] = {"mul": "Mul"}

#: averaging reductions: reduced precision only while the element count stays below the
#: format's exact-accumulation bound (``precision.islands.SIGNIFICAND_BITS``)
MEAN_OPS = frozenset({"mean", "avg_pool1d", "avg_pool2d", "avg_pool3d", "adaptive_avg_pool1d",
                      "adaptive_avg_pool2d", "adaptive_avg_pool3d", "_adaptive_avg_pool2d"})

#: dtype-polymorphic ops that are benign at any precision: elementwise maps with bounded
#: relative error, and data movement (exact). They run at the type of their inputs.
FOLLOW_OPS = frozenset({
    # elementwise arithmetic and activations
    "add", "sub", "rsub", "mul", "div", "neg", "abs", "relu", "relu6", "gelu", "silu", "sigmoid",
    "tanh", "hardtanh", "hardswish", "hardsigmoid", "leaky_relu", "elu", "selu", "celu", "mish",
    "clamp", "clamp_min", "clamp_max", "clip", "where", "maximum", "minimum", "masked_fill",
    "erf", "sign", "dropout", "lerp", "addcmul", "addcdiv", "fill", "zero", "prelu",
    "_prelu_kernel",
    # rounding, thresholds and shrinkage: exact on values already in the format (ONNX's Floor,
    # Ceil, Round, ThresholdedRelu, Shrink follow too: ``precision.roles``' one op table)
    "floor", "ceil", "round", "trunc", "threshold", "hardshrink", "softshrink",
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

#: the tables as the shared role rules read them (``decisions.precision.roles``)
TABLES = OpTables(LOW_OPS, MEAN_OPS, FOLLOW_OPS)

#: ops whose output dtype is another tensor's. Conversions that name a dtype keep the model's
#: choice; note that export writes every ``.to(...)`` as ``to.dtype_layout`` with the traced
#: dtype filled in, so even ``.to(memory_format=...)`` pins it (safe: more fp32, not less).
CAST_OPS = frozenset({"type_as"})

#: shape/metadata queries: they read no values, so a producer's dtype does not matter to them
SHAPE_QUERIES = frozenset({"sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "size",
                           "stride", "dim", "numel"})


def float_dtype(v: Any) -> torch.dtype | None:
    """The floating dtype of a value (first float tensor of a list/tuple), else None."""
    if isinstance(v, torch.Tensor):
        return v.dtype if v.is_floating_point() else None
    if isinstance(v, (list, tuple)):
        for item in v:
            d = float_dtype(item)
            if d is not None:
                return d
    return None


def as_dtype(v: Any, dtype: torch.dtype) -> Any:
    """``v`` (a FakeTensor or a list of them) converted to ``dtype``, floats only."""
    if isinstance(v, (list, tuple)):
        return type(v)(as_dtype(x, dtype) for x in v)
    if not isinstance(v, torch.Tensor) or not v.is_floating_point() or v.dtype == dtype:
        return v
    mode = getattr(v, "fake_mode", None)
    if mode is None:
        return v.to(dtype)
    with mode:
        return v.to(dtype)


def explicit_dtype(node: fx.Node) -> bool:
    """The op names its output dtype (``.to(dtype)``, ``softmax(dtype=)``, ``full(dtype=)``)."""
    return any(isinstance(a, torch.dtype) for a in (*node.args, *node.kwargs.values()))
