"""ONNX symbolics graphopt lends the TorchScript exporter for ops it has none for (opset 13+).

Why: transformers' decoder LLMs call ``aten::diff`` (packed-sequence detection in the mask
code), and its mixture-of-experts layers (Mixtral) route tokens with ``aten::histc`` and run the
experts with ``aten::_grouped_mm``; torch's TorchScript exporter has no symbolic for any of
them, so those models fell back to the slow ``dynamo=True`` exporter (diff) or failed in both
(Mixtral). Each symbolic states the identity it relies on:

1. ``diff(x, n, dim, prepend, append)``: ``x = cat(prepend, x, append)``, then ``n`` times
   ``x[1:] - x[:-1]`` along ``dim`` (``!=`` for bool, as torch does).
2. ``histc(x, bins, lo, hi)``: ``bin = min(floor((x - lo) * bins / (hi - lo)), bins - 1)``
   for ``lo <= x <= hi`` (torch's CPU kernel's formula, the same rounding), counted with a
   one-hot compare and a sum; ``lo == hi`` takes the data's range as torch does.
3. ``_grouped_mm(a[S,K], b[G,K,N], offs[G])``: row ``r`` belongs to group
   ``g(r) = #{i: offs[i] <= r}``, and ``out[r] = a[r] @ b[g(r)]``. ONNX has no grouped GEMM,
   so every group's matrix multiplies every row (one batched MatMul, ``[G,S,N]``) and each
   row keeps its group's result (GatherElements): the same dot products, exact in fp32, at
   G/top-k times the FLOPs of a grouped kernel and with no per-row weight copies (gathering
   ``b[g(r)]`` per row would copy ``S*K*N`` weights). ``a[G,S,K] @ b[G,K,N]`` without
   ``offs`` is a plain batched MatMul. Rows past ``offs[-1]`` are undefined in torch; here they
   take the last group's result.
4. ``cumsum(x)`` of a bool or sub-int64 integer ``x`` is int64 in torch; torch's symbolic
   hands the bool to ONNX CumSum, which rejects it (transformers' packed-sequence check does
   ``(diff != 1).cumsum(-1)``). graphopt casts to int64 first, then calls torch's symbolic.

The symbolics are registered only for the duration of one export (:func:`lent_symbolics`) and
only where torch has none, so a user's own registration always wins.

The dynamo exporter has diff and histc, but under ``torch.export`` transformers runs its experts
through its own op ``transformers::grouped_mm_fallback`` (same contract as case 3), which has no
ONNX function: :func:`dynamo_translations` gives it case 3 as an onnxscript function, passed as
``custom_translation_table``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = ["LENT_OPS", "MIN_OPSET", "WRAPPED_OPS", "dynamo_translations", "lent_symbolics"]

logger = logging.getLogger(__name__)

#: the symbolics use opset-13 forms (Squeeze/Unsqueeze/ReduceSum axes as inputs)
MIN_OPSET = 13
_INT64_MAX = 2**63 - 1


def _helper() -> Any:
    from torch.onnx import symbolic_helper

    return symbolic_helper


def _const(g: Any, values: list[int] | list[float], dtype: torch.dtype = torch.int64) -> Any:
    return g.op("Constant", value_t=torch.tensor(values, dtype=dtype))


def _scalar(g: Any, value: int) -> Any:
    return g.op("Constant", value_t=torch.tensor(value, dtype=torch.int64))


def _dims(g: Any, x: Any, start: int, end: int) -> Any:
    """``shape(x)[start:end]``; not Shape's start/end attributes, which torch's constant
    folding ignores (it folds a weight's full shape)."""
    return g.op("Slice", g.op("Shape", x), _const(g, [start]), _const(g, [end]))


def _diff(g: Any, x: Any, n: Any, dim: Any, prepend: Any, append: Any) -> Any:
    """Case 1."""
    h = _helper()
    n_i, dim_i = h._maybe_get_const(n, "i"), h._maybe_get_const(dim, "i")
    if not isinstance(n_i, int) or not isinstance(dim_i, int):
        return h._unimplemented("diff", "n and dim must be constants", x)
    parts = [t for t in (prepend, x, append) if not h._is_none(t)]
    if len(parts) > 1:
        x = g.op("Concat", *parts, axis_i=dim_i)
    is_bool = x.type().scalarType() == "Bool" if hasattr(x.type(), "scalarType") else False
    axes = _const(g, [dim_i])
    for _ in range(n_i):
        later = g.op("Slice", x, _const(g, [1]), _const(g, [_INT64_MAX]), axes)
        earlier = g.op("Slice", x, _const(g, [0]), _const(g, [-1]), axes)
        x = g.op("Xor", later, earlier) if is_bool else g.op("Sub", later, earlier)
    return x


def _histc(g: Any, x: Any, bins: Any, lo: Any, hi: Any) -> Any:
    """Case 2."""
    h = _helper()
    bins_i = h._maybe_get_const(bins, "i")
    lo_f, hi_f = h._maybe_get_const(lo, "f"), h._maybe_get_const(hi, "f")
    if not isinstance(bins_i, int) or not all(isinstance(v, float) for v in (lo_f, hi_f)):
        return h._unimplemented("histc", "bins, min and max must be constants", x)
    flat = g.op("Reshape", x, _const(g, [-1]))
    dtype = {"Double": torch.float64, "Half": torch.float16,
             "BFloat16": torch.bfloat16}.get(x.type().scalarType(), torch.float32)
    if lo_f == hi_f:  # torch: the data's range, widened by 1 each way if it is one value
        lo_t = g.op("ReduceMin", flat, keepdims_i=0)
        hi_t = g.op("ReduceMax", flat, keepdims_i=0)
        same = g.op("Equal", lo_t, hi_t)
        one = _const(g, [1.0], dtype)
        lo_t = g.op("Where", same, g.op("Sub", lo_t, one), lo_t)
        hi_t = g.op("Where", same, g.op("Add", hi_t, one), hi_t)
    else:
        lo_t, hi_t = _const(g, [lo_f], dtype), _const(g, [hi_f], dtype)
    scaled = g.op("Div", g.op("Mul", g.op("Sub", flat, lo_t), _const(g, [float(bins_i)], dtype)),
                  g.op("Sub", hi_t, lo_t))
    pos = g.op("Min", g.op("Floor", scaled), _const(g, [float(bins_i - 1)], dtype))
    valid = g.op("And", g.op("GreaterOrEqual", flat, lo_t), g.op("LessOrEqual", flat, hi_t))
    edges = _const(g, [float(b) for b in range(bins_i)], dtype)
    hits = g.op("And", g.op("Equal", g.op("Unsqueeze", pos, _const(g, [1])), edges),
                g.op("Unsqueeze", valid, _const(g, [1])))
    return g.op("ReduceSum", g.op("Cast", hits, to_i=_onnx_dtype(dtype)), _const(g, [0]),
                keepdims_i=0)


def _onnx_dtype(dtype: torch.dtype) -> int:
    import onnx

    return {torch.float64: onnx.TensorProto.DOUBLE, torch.float16: onnx.TensorProto.FLOAT16,
            torch.bfloat16: onnx.TensorProto.BFLOAT16}.get(dtype, onnx.TensorProto.FLOAT)


def _grouped_mm(g: Any, a: Any, b: Any, offs: Any, bias: Any, out_dtype: Any) -> Any:
    """Case 3."""
    h = _helper()
    rank_a, rank_b = h._get_tensor_rank(a), h._get_tensor_rank(b)
    if not h._is_none(bias):  # torch's own kernels do not take a bias yet either
        return h._unimplemented("_grouped_mm", "a bias", a)
    if h._is_none(offs):
        if rank_a != 3 or rank_b != 3:
            return h._unimplemented("_grouped_mm", "without offs both operands must be 3-D", a)
        out = g.op("MatMul", a, b)
    elif rank_a == 2 and rank_b == 3:
        count = g.op("Squeeze", _dims(g, a, 0, 1), _const(g, [0]))
        rows = g.op("Range", _scalar(g, 0), count, _scalar(g, 1))
        ends = g.op("Cast", offs, to_i=7)  # INT64
        group = g.op("ReduceSum", g.op("Cast", g.op("LessOrEqual", g.op("Unsqueeze", ends,
                                                                         _const(g, [0])),
                                                    g.op("Unsqueeze", rows, _const(g, [1]))),
                                       to_i=7), _const(g, [1]), keepdims_i=0)
        last = g.op("Sub", _dims(g, b, 0, 1), _const(g, [1]))
        group = g.op("Min", group, last)  # rows past offs[-1]: undefined in torch
        every = g.op("MatMul", g.op("Unsqueeze", a, _const(g, [0])), b)  # [G, S, N]
        index = g.op("Expand", g.op("Unsqueeze", group, _const(g, [0, 2])),
                     g.op("Concat", _const(g, [1]), _dims(g, every, 1, _INT64_MAX), axis_i=0))
        out = g.op("Squeeze", g.op("GatherElements", every, index, axis_i=0), _const(g, [0]))
    else:
        return h._unimplemented("_grouped_mm", f"a {rank_a}-D x {rank_b}-D grouped GEMM "
                                "(graphopt exports 2-D x 3-D with offs and 3-D x 3-D)", a)
    dtype = None if h._is_none(out_dtype) else h._maybe_get_const(out_dtype, "i")
    if isinstance(dtype, int):
        from torch.onnx._internal.torchscript_exporter import _type_utils

        out = g.op("Cast", out, to_i=_type_utils.JitScalarType(dtype).onnx_type())
    return out


def _cumsum(wrapped: Callable[..., Any]) -> Callable[..., Any]:
    """Case 4."""
    def cumsum(g: Any, x: Any, dim: Any, dtype: Any = None) -> Any:
        h = _helper()
        kind = x.type().scalarType() if hasattr(x.type(), "scalarType") else None
        if (dtype is None or h._is_none(dtype)) and kind in _NARROW_INTS:
            x = g.op("Cast", x, to_i=7)  # INT64, torch's result dtype
        return wrapped(g, x, dim, dtype)
    return cumsum


_NARROW_INTS = ("Bool", "Byte", "Char", "Short", "Int")

#: torch symbolics graphopt wraps (case 4): op -> wrapper of torch's own
WRAPPED_OPS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "aten::cumsum": _cumsum,
}

#: op -> symbolic, all registered at :data:`MIN_OPSET`
LENT_OPS: dict[str, Callable[..., Any]] = {
    "aten::diff": _diff,
    "aten::histc": _histc,
    "aten::_grouped_mm": _grouped_mm,
}


@contextlib.contextmanager
def lent_symbolics(opset: int) -> Iterator[list[str]]:
    """Register :data:`LENT_OPS` that torch lacks at ``opset``, and :data:`WRAPPED_OPS` over
    torch's own, for one export; yields their names and unregisters them on exit (also after
    an error)."""
    if opset < MIN_OPSET:
        yield []
        return
    try:
        from torch.onnx._internal.torchscript_exporter import registration, utils
    except ImportError:  # pragma: no cover - a torch without the TorchScript exporter
        yield []
        return
    # torch imports its per-opset symbolics on the first export; before that the registry
    # holds opset 9 alone, and "what does torch have at this opset" would be answered wrong
    trigger = getattr(utils, "_trigger_symbolic_function_registration", None)
    if trigger is not None:
        trigger()
    lent = [name for name in LENT_OPS if not registration.registry.is_registered_op(name, opset)]
    for name in lent:
        torch.onnx.register_custom_op_symbolic(name, LENT_OPS[name], MIN_OPSET)
    for name, wrap in WRAPPED_OPS.items():
        group = registration.registry.get_function_group(name)
        own = group.get(opset) if group is not None else None
        if own is not None and own.__module__.startswith("torch.onnx"):  # not a user's own
            torch.onnx.register_custom_op_symbolic(name, wrap(own), MIN_OPSET)
            lent.append(name)
    try:
        yield lent
    finally:
        for name in lent:
            torch.onnx.unregister_custom_op_symbolic(name, MIN_OPSET)


def _grouped_mm_onnxscript(input: Any, weight: Any, offs: Any) -> Any:  # noqa: A002 - schema
    """Case 3 for the dynamo exporter (traced by it; names follow the op's schema)."""
    from onnxscript import opset18 as op

    def ints(*v: int) -> Any:
        return op.Constant(value_ints=list(v))

    count = op.Squeeze(op.Shape(input, start=0, end=1), ints(0))
    rows = op.Range(op.Constant(value_int=0), count, op.Constant(value_int=1))
    ends = op.Cast(offs, to=7)  # INT64
    hit = op.LessOrEqual(op.Unsqueeze(ends, ints(0)), op.Unsqueeze(rows, ints(1)))
    group = op.ReduceSum(op.Cast(hit, to=7), ints(1), keepdims=0)
    group = op.Min(group, op.Sub(op.Shape(weight, start=0, end=1), ints(1)))
    every = op.MatMul(op.Unsqueeze(input, ints(0)), weight)  # [G, S, N]
    index = op.Expand(op.Unsqueeze(group, ints(0, 2)),
                      op.Concat(ints(1), op.Shape(every, start=1), axis=0))
    return op.Squeeze(op.GatherElements(every, index, axis=0), ints(0))


def dynamo_translations() -> dict[Any, Callable[..., Any]]:
    """``custom_translation_table`` entries for ops in this process with no ONNX function."""
    table: dict[Any, Callable[..., Any]] = {}
    try:
        table[torch.ops.transformers.grouped_mm_fallback.default] = _grouped_mm_onnxscript
    except (AttributeError, RuntimeError):  # transformers' MoE code is not loaded
        pass
    return table
