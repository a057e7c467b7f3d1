"""Which ops a padded channel axis passes through (carry), and which must see real channels (cut).

The same rules as the torch pass (:mod:`graphopt.rewrites.padding_rules`), spelled in ONNX ops;
maps are :class:`~graphopt.rewrites.channel_map.ChannelMap` (real channel ``i`` at position
``positions[i]`` of the padded axis; ``clean`` = the padding holds exact zeros). Cases:

1. Unary ops with ``f(0) = 0`` (Relu, Gelu, Tanh, Cast, Clip around 0, ...) keep the map;
   Sigmoid/HardSigmoid keep it dirty (finite junk that only zero weights may read).
2. BatchNormalization / InstanceNormalization (inference) are per-channel affine: their params
   are padded with scale 0, bias 0 (mean 0, var 1), so padded channels come out as exact zeros.
3. Add/Sub/Mul/Div of equally padded tensors, of a scalar or channel-broadcast operand, or of a
   per-channel constant padded ahead of time (0, or 1 as a divisor).
4. Pools and reductions over other axes are channel-local; a reduction, Softmax or LayerNorm
   over the channel axis would see the padding: cut.
5. Reshape/Flatten/Squeeze/Unsqueeze that keep the channel axis whole or merge it with real
   axes (``channel_map.reshape_map``; a Reshape's explicit size is rewritten); Transpose moves
   the axis; Slice of another axis keeps it.
6. Concat along the channel axis places the maps at offsets; along another axis needs equal maps.
7. Anything else is unknown and cut (sliced back to the real channels before it).
"""

from __future__ import annotations

import numpy as np
import onnx

from graphopt.decisions.channel_map import ChannelMap, _dim_groups, reshape_map
from graphopt.onnx_rewrites.padding_rules import (
    Carry,
    Cut,
    Dims,
    InitSink,
    Lookup,
    ModelInfo,
    attr,
    scatter_axis,
)

__all__ = ["carry_rule"]

_ZERO_PRESERVING = frozenset({
    "Relu", "LeakyRelu", "Elu", "Selu", "Celu", "Gelu", "Tanh", "Neg", "Abs", "Identity",
    "HardSwish", "Mish", "Erf", "Softsign", "Sign", "Round", "Floor", "Ceil", "Cast", "Dropout"})
_NONZERO_AT_ZERO = frozenset({"Sigmoid", "HardSigmoid"})  # bounded: the junk stays finite
_POOLS = frozenset({"MaxPool", "AveragePool", "LpPool", "GlobalAveragePool", "GlobalMaxPool",
                    "GlobalLpPool"})
_REDUCTIONS = frozenset({"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd",
                         "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp"})
_RESHAPES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})


def _unary(node: onnx.NodeProto, cmap: ChannelMap, info: ModelInfo) -> Carry | Cut:
    op = node.op_type
    if op in _NONZERO_AT_ZERO:
        return Carry(cmap.moved(cmap.axis, False),
                     f"{op} is channel-local; f(0) != 0 leaves finite junk in the padding")
    if op == "Dropout" and len(node.input) > 2 and node.input[2]:
        mode = info.value(node.input[2])
        if mode is None or bool(mode):
            return Cut("Dropout that may run in training mode")
    if op == "Clip":
        lo = info.value(node.input[1]) if len(node.input) > 1 and node.input[1] else None
        hi = info.value(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        if (len(node.input) > 1 and node.input[1] and lo is None) or \
                (len(node.input) > 2 and node.input[2] and hi is None):
            return Cut("Clip with computed bounds")
        keeps = (lo is None or float(lo) <= 0) and (hi is None or float(hi) >= 0)
        return Carry(cmap.moved(cmap.axis, cmap.clean and keeps), "Clip is channel-local")
    return Carry(cmap, f"{op} is channel-local with f(0) = 0")


def _norm(node: onnx.NodeProto, cmap: ChannelMap, info: ModelInfo) -> Carry | Cut:
    """Case 2: pad scale/bias with 0 (mean 0, var 1) so padded channels are exact zeros."""
    if cmap.axis != 1 or attr(node, "training_mode", 0):
        return Cut(f"{node.op_type} over another axis or in training mode")
    params = [(i, info.value(n)) for i, n in enumerate(node.input) if i > 0]
    if any(v is None or v.shape != (cmap.real,) for _, v in params):
        return Cut(f"{node.op_type} params are not per-channel constants")
    fills = {1: 0.0, 2: 0.0, 3: 0.0, 4: 1.0}

    def edit(sink: InitSink) -> None:
        for i, v in params:
            sink.replace_input(node, i, f"{node.name}_pad{i}",
                               scatter_axis(v, 0, cmap.positions, cmap.size, fills[i]))

    return Carry(cmap.moved(1, True), f"{node.op_type} is per-channel affine; padded with scale "
                 "0, bias 0 (mean 0, var 1)", edit)


def _binary(node: onnx.NodeProto, lookup: Lookup, info: ModelInfo) -> Carry | Cut:
    """Case 3."""
    op, (a, b) = node.op_type, node.input[:2]
    out = info.shape(node.output[0])
    ma, mb = lookup(a), lookup(b)
    if out is None:
        return Cut("unknown shapes")
    padded = ma or mb
    assert padded is not None
    src = a if ma is not None else b
    axis = padded.axis + len(out) - len(info.shape(src) or out)
    if op == "Div" and mb is not None:
        return Cut("dividing by a padded tensor would divide by zero")
    if ma is not None and mb is not None:
        if not ma.same_layout(mb):
            return Cut("the operands are padded differently")
        clean = (ma.clean or mb.clean) if op == "Mul" else (ma.clean and mb.clean)
        return Carry(ma.moved(axis, clean), f"{op} of two equally padded tensors")
    other = b if ma is not None else a
    shape = info.shape(other)
    if shape is None:
        return Cut("unknown shapes")
    idx = axis - len(out) + len(shape)
    if idx < 0 or shape[idx] == 1:
        value = info.value(other)
        zero = value is not None and value.size == 1 and float(value.reshape(-1)[0]) == 0.0
        keeps = op in ("Mul", "Div") or zero
        return Carry(padded.moved(axis, padded.clean and keeps),
                     f"{op} with an operand broadcast over channels")
    value = info.value(other)
    if value is None or shape[idx] != padded.real:
        return Cut("the other operand is not padded the same way")
    fill = 1.0 if op == "Div" else 0.0
    pos = 1 if ma is not None else 0

    def edit(sink: InitSink) -> None:
        sink.replace_input(node, pos, f"{node.name}_const",
                           scatter_axis(value, idx, padded.positions, padded.size, fill))

    return Carry(padded.moved(axis, padded.clean or op == "Mul"),
                 f"{op} with a per-channel constant padded ahead of time with {fill:g}", edit)


def _axes(node: onnx.NodeProto, info: ModelInfo, nd: int) -> list[int] | None | str:
    """Reduction axes: a list, None for all axes, or a reason string."""
    axes = attr(node, "axes")
    if axes is None and len(node.input) > 1 and node.input[1]:
        v = info.value(node.input[1])
        if v is None:
            return "computed reduction axes"
        axes = v.reshape(-1).tolist()
    if not axes:
        return [] if attr(node, "noop_with_empty_axes", 0) else None
    return [int(d) % nd for d in axes]


def _placeholders(*shapes: Dims) -> tuple[list[int], ...] | None:
    """Symbolic dims as distinct large values (same symbol, same value); None if a dim is '?'."""
    syms: dict[str, int] = {}
    out = []
    for s in shapes:
        if any(d == "?" for d in s):
            return None
        out.append([d if isinstance(d, int) else syms.setdefault(d, 1_000_003 + 2 * len(syms))
                    for d in s])
    return tuple(out)


def _reshape(node: onnx.NodeProto, cmap: ChannelMap, info: ModelInfo) -> Carry | Cut:
    """Case 5 for reshapes; a Reshape whose shape names the padded size explicitly is edited."""
    src, out = info.shape(node.input[0]), info.shape(node.output[0])
    dims = _placeholders(src, out) if src is not None and out is not None else None
    if dims is None:
        return Cut("unknown shapes")
    old, new_shape = dims
    group = next((g for g in _dim_groups(old, new_shape) if cmap.axis in g[0]), None)
    if group is None or any(old[i] >= 1_000_003 for i in group[0]):
        return Cut(f"{node.op_type} merges the padded axis with a dynamic dim")
    new = reshape_map(cmap, old, new_shape)
    if new is None:
        return Cut(f"{node.op_type} splits the padded channel axis")
    if node.op_type != "Reshape":
        return Carry(new, f"{node.op_type} keeps the channel axis whole")
    spec = info.value(node.input[1])
    if spec is None or attr(node, "allowzero", 0):
        return Cut("Reshape to a computed shape")
    spec = spec.astype(np.int64).copy()
    j = new.axis
    if cmap.axis != j and cmap.axis < len(spec) and spec[cmap.axis] == 0:
        return Cut("Reshape copies the padded dim into another position")
    if spec[j] == -1 or (spec[j] == 0 and j == cmap.axis and new.size == cmap.size):
        return Carry(new, "Reshape keeps the channel axis whole (its size is inferred)")
    if spec[j] != out[j]:
        return Cut("Reshape names the padded axis in a way it cannot be rewritten")
    spec[j] = new.size

    def edit(sink: InitSink) -> None:
        sink.replace_input(node, 1, f"{node.name}_shape", spec)

    return Carry(new, "Reshape keeps the channel axis whole (padded size written)", edit)


def _shape_op(node: onnx.NodeProto, cmap: ChannelMap, info: ModelInfo) -> Carry | Cut:
    """Cases 4 and 5."""
    op, src = node.op_type, info.shape(node.input[0])
    if src is None:
        return Cut("unknown shapes")
    nd = len(src)
    if op in _POOLS:
        if cmap.axis != 1 or (len(node.output) > 1 and node.output[1]):
            return Cut(f"{op} pools over the padded axis or returns indices")
        return Carry(cmap, f"{op} pools each channel on its own")
    if op in _REDUCTIONS:
        axes = _axes(node, info, nd)
        if isinstance(axes, str):
            return Cut(axes)
        if axes is None or cmap.axis in axes:
            return Cut(f"{op} reduces over the padded channel axis")
        keep = attr(node, "keepdims", 1)
        axis = cmap.axis if keep else cmap.axis - sum(d < cmap.axis for d in axes)
        return Carry(cmap.moved(axis, cmap.clean and op != "ReduceLogSumExp"),
                     f"{op} reduces other axes only")
    if op in ("Softmax", "LogSoftmax"):
        if int(attr(node, "axis", -1)) % nd == cmap.axis:
            return Cut(f"{op} over the padded channel axis would count the padding")
        return Carry(cmap.moved(cmap.axis, False), f"{op} over another axis")
    if op == "LayerNormalization":
        if cmap.axis >= int(attr(node, "axis", -1)) % nd or (len(node.output) > 1 and any(
                node.output[1:])):
            return Cut("LayerNormalization normalizes over the padded channel axis")
        return Carry(cmap.moved(cmap.axis, False), "LayerNormalization over non-channel axes")
    if op == "Transpose":
        perm = [int(p) for p in attr(node, "perm", list(range(nd))[::-1])]
        return Carry(cmap.moved(perm.index(cmap.axis)), "Transpose moves the channel axis")
    if op == "Slice":
        axes = info.value(node.input[3]) if len(node.input) > 3 and node.input[3] else None
        starts = info.value(node.input[1])
        if starts is None or (len(node.input) > 3 and node.input[3] and axes is None):
            return Cut("Slice with computed axes")
        axes_l = [int(a) % nd for a in (axes.reshape(-1) if axes is not None
                                        else range(starts.size))]
        if cmap.axis in axes_l:
            return Cut("Slice indexes the padded axis")
        return Carry(cmap, "Slice indexes other axes")
    return _reshape(node, cmap, info)


def _concat(node: onnx.NodeProto, lookup: Lookup, info: ModelInfo) -> Carry | Cut:
    """Case 6."""
    shapes = [info.shape(t) for t in node.input]
    if any(s is None for s in shapes):
        return Cut("unknown shapes")
    nd = len(shapes[0])  # type: ignore[arg-type]
    dim = int(attr(node, "axis", 0)) % nd
    maps = [lookup(t) for t in node.input]
    if any(m is not None and m.axis != dim for m in maps):
        first = next(m for m in maps if m is not None)
        if all(m is not None and m.same_layout(first) for m in maps):
            return Carry(first.moved(first.axis, all(m.clean for m in maps if m)),
                         "Concat along another axis of equally padded tensors")
        return Cut("Concat of differently padded tensors along another axis")
    sizes = [s[dim] for s in shapes]  # type: ignore[index]
    if any(not isinstance(n, int) for n in sizes):
        return Cut("Concat of dynamic channel sizes")
    full = [m if m is not None else ChannelMap.identity(dim, n)  # type: ignore[arg-type]
            for m, n in zip(maps, sizes, strict=True)]
    return Carry(ChannelMap.concat(full, dim), "Concat along channels: maps placed at offsets")


def carry_rule(node: onnx.NodeProto, lookup: Lookup, info: ModelInfo) -> Carry | Cut:
    """Carry or cut for a non-GEMM ``node`` that reads at least one padded tensor."""
    op = node.op_type
    if node.domain not in ("", "ai.onnx"):
        return Cut(f"{node.domain}::{op} is not an op the padding pass knows")
    if len([o for o in node.output if o]) > 1 and op not in ("Dropout", "MaxPool",
                                                            "LayerNormalization"):
        return Cut(f"{op} has several outputs")
    if op == "Concat":
        return _concat(node, lookup, info)
    if op in ("Add", "Sub", "Mul", "Div"):
        return _binary(node, lookup, info)
    cmap = lookup(node.input[0])
    if cmap is None or any(lookup(i) for i in node.input[1:] if i):
        return Cut(f"{op} reads the padded tensor in an argument it does not treat per channel")
    if op == "Dropout" and len(node.output) > 1 and node.output[1]:
        return Cut("Dropout's mask output would show the padding")
    if op in _ZERO_PRESERVING or op in _NONZERO_AT_ZERO or op == "Clip":
        return _unary(node, cmap, info)
    if op in ("BatchNormalization", "InstanceNormalization"):
        return _norm(node, cmap, info)
    if op in _POOLS or op in _REDUCTIONS or op in _RESHAPES or op in (
            "Softmax", "LogSoftmax", "LayerNormalization", "Transpose", "Slice"):
        return _shape_op(node, cmap, info)
    return Cut(f"{op} is not known to be channel-local")
