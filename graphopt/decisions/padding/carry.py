"""Case 4 of :mod:`graphopt.decisions.padding`: which canonical ops a padded channel axis passes
through (carry), and which must see the real channels (cut). One rule set for every backend: it
reads graphopt's IR (:mod:`graphopt.ir.ops`).

Maps are :class:`~graphopt.decisions.padding.channel_map.ChannelMap` (real channel ``i`` at
``positions[i]`` of the padded axis; ``clean`` = the padding holds exact zeros). The rules are
cases 4a-4g of the package's list; each function below names the ones it handles.

Edits are data (:class:`PadConst`, :class:`SetShape`, :class:`SetGroups`); each backend
turns them into its own graph edits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from graphopt.decisions.padding.channel_map import ChannelMap, _dim_groups, reshape_map
from graphopt.decisions.padding.sites import Dims, Values, shape_of
from graphopt.ir.graph import Graph, Node

__all__ = ["Carry", "Cut", "Edit", "Lookup", "PadConst", "SetGroups", "SetShape", "carry_rule"]

Lookup = Callable[[str], "ChannelMap | None"]

_ZERO_PRESERVING = frozenset({
    "Relu", "LeakyRelu", "Elu", "Selu", "Celu", "Gelu", "Tanh", "Neg", "Abs", "Identity", "Copy",
    "HardSwish", "Mish", "Erf", "Softsign", "Sign", "Round", "Floor", "Ceil", "Cast", "Dropout",
    "Silu"})
_NONZERO_AT_ZERO = frozenset({"Sigmoid", "HardSigmoid"})  # bounded: the junk stays finite
_POOLS = frozenset({"MaxPool", "AveragePool", "LpPool", "GlobalAveragePool", "GlobalMaxPool",
                    "GlobalLpPool", "AdaptiveAvgPool", "AdaptiveMaxPool"})
_REDUCTIONS = frozenset({"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd",
                         "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp"})
_RESHAPES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})


@dataclass(frozen=True)
class PadConst:
    """Replace constant ``tensor`` (as this node reads it) by a copy spread along ``axis`` to
    ``size``: real entry ``i`` at ``positions[i]``, ``fill`` elsewhere."""

    tensor: str
    axis: int
    fill: float
    positions: tuple[int, ...]
    size: int


@dataclass(frozen=True)
class SetShape:
    """Write ``size`` at position ``axis`` of a Reshape's explicit target shape."""

    axis: int
    size: int


@dataclass(frozen=True)
class SetGroups:
    """A depthwise conv now runs ``groups`` channels (zero filters on the padding)."""

    groups: int


Edit = PadConst | SetShape | SetGroups


@dataclass(frozen=True)
class Carry:
    """The op keeps the padding: its output map, why, and the edits it needs."""

    out: ChannelMap
    reason: str
    edits: tuple[Edit, ...] = ()


@dataclass(frozen=True)
class Cut:
    """The op would see the padding: slice its padded inputs to the real channels first."""

    reason: str


@dataclass(frozen=True)
class _Ctx:
    graph: Graph
    lookup: Lookup
    value: Values

    def shape(self, t: str) -> Dims | None:
        return shape_of(self.graph, t)

    def scalar(self, node: Node, i: int, attr: str) -> tuple[bool, float | None]:
        """(given, value) of an operand that is an attr (torch) or a constant input (ONNX)."""
        if attr in node.attrs and node.attrs[attr] is not None:
            return True, float(node.attrs[attr])
        if len(node.inputs) > i and node.inputs[i]:
            v = self.value(node.inputs[i])
            return True, None if v is None or v.size != 1 else float(v.reshape(-1)[0])
        return False, None

    def is_constant(self, t: str) -> bool:
        info = self.graph.tensor(t)
        return info is not None and info.kind in ("param", "constant")


def _unary(c: _Ctx, node: Node, cmap: ChannelMap) -> Carry | Cut:
    """Case 4a."""
    op = node.op_type
    if op in _NONZERO_AT_ZERO:
        return Carry(cmap.moved(cmap.axis, False),
                     f"{op} is channel-local; f(0) != 0 leaves finite junk in the padding")
    if op == "Dropout":
        given, training = c.scalar(node, 2, "training_mode")
        if given and (training is None or training):
            return Cut("Dropout that may run in training mode")
    if op == "Clip":
        has_lo, lo = c.scalar(node, 1, "min")
        has_hi, hi = c.scalar(node, 2, "max")
        if (has_lo and lo is None) or (has_hi and hi is None):
            return Cut("Clip with computed bounds")
        keeps = (lo is None or lo <= 0) and (hi is None or hi >= 0)
        return Carry(cmap.moved(cmap.axis, cmap.clean and keeps), "Clip is channel-local")
    if op == "Alias" or node.attrs.get("dtype") is not None and op != "Cast":
        return Cut(f"{op} reinterprets the tensor")
    return Carry(cmap, f"{op} is channel-local with f(0) = 0")


def _norm(c: _Ctx, node: Node, cmap: ChannelMap) -> Carry | Cut:
    """Case 4b."""
    op = node.op_type
    if cmap.axis != 1 or node.attrs.get("training_mode", 0):
        return Cut(f"{op} over another axis or in training mode")
    fills = {1: 0.0, 2: 0.0, 3: 0.0, 4: 1.0}
    edits = []
    for i, t in enumerate(node.inputs[1:5], start=1):
        if not t:
            continue
        if not c.is_constant(t) or c.shape(t) != (cmap.real,):
            return Cut(f"{op} params are not per-channel constants")
        edits.append(PadConst(t, 0, fills[i], cmap.positions, cmap.size))
    scaled = len(node.inputs) > 1 and bool(node.inputs[1])
    return Carry(cmap.moved(1, cmap.clean or scaled), f"{op} is per-channel affine; padded with "
                 "scale 0, bias 0 (mean 0, var 1)", tuple(edits))


def _binary(c: _Ctx, node: Node) -> Carry | Cut:
    """Case 4c."""
    op, out = node.op_type, c.shape(node.outputs[0])
    if node.attrs.get("variant") or node.attrs.get("rounding_mode") or node.attrs.get("fmod"):
        return Cut(f"{op} ({node.attrs.get('variant') or 'rounding'}) is not elementwise here")
    if out is None:
        return Cut("unknown shapes")
    if len(node.inputs) == 1:  # a scalar folded into attrs (torch)
        cmap = c.lookup(node.inputs[0])
        assert cmap is not None
        s, first = node.attrs.get("scalar"), node.attrs.get("scalar_position", 1) == 0
        if op == "Div" and first:
            return Cut("dividing by a padded tensor would divide by zero")
        keeps = op in ("Mul", "Div") or (s == 0 and not first) or (op == "Add" and s == 0)
        return Carry(cmap.moved(cmap.axis + len(out) - len(c.shape(node.inputs[0]) or out),
                                cmap.clean and keeps),
                     f"{op} with an operand broadcast over channels")
    a, b = node.inputs[0], node.inputs[1]
    ma, mb = c.lookup(a), c.lookup(b)
    padded = ma or mb
    assert padded is not None
    src = a if ma is not None else b
    axis = padded.axis + len(out) - len(c.shape(src) or out)
    if op == "Div" and mb is not None:
        return Cut("dividing by a padded tensor would divide by zero")
    if ma is not None and mb is not None:
        if not ma.same_layout(mb):
            return Cut("the operands are padded differently")
        clean = (ma.clean or mb.clean) if op == "Mul" else (ma.clean and mb.clean)
        return Carry(ma.moved(axis, clean), f"{op} of two equally padded tensors")
    other = b if ma is not None else a
    shape = c.shape(other)
    if shape is None:
        return Cut("unknown shapes")
    idx = axis - len(out) + len(shape)
    if idx < 0 or shape[idx] == 1:
        value = c.value(other)
        zero = value is not None and value.size == 1 and float(value.reshape(-1)[0]) == 0.0
        keeps = op in ("Mul", "Div") or zero
        return Carry(padded.moved(axis, padded.clean and keeps),
                     f"{op} with an operand broadcast over channels")
    if not c.is_constant(other) or shape[idx] != padded.real:
        return Cut("the other operand is not padded the same way")
    fill = 1.0 if op == "Div" else 0.0
    return Carry(padded.moved(axis, padded.clean or op == "Mul"),
                 f"{op} with a per-channel constant padded ahead of time with {fill:g}",
                 (PadConst(other, idx, fill, padded.positions, padded.size),))


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


def _reshape(c: _Ctx, node: Node, cmap: ChannelMap) -> Carry | Cut:
    """Case 4e for reshapes; a Reshape whose shape names the padded size explicitly is edited."""
    src, out = c.shape(node.inputs[0]), c.shape(node.outputs[0])
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
    spec = node.attrs.get("shape")
    copies_zero = False
    if spec is None:
        v = c.value(node.inputs[1]) if len(node.inputs) > 1 else None
        spec = None if v is None else [int(d) for d in v.reshape(-1)]
        copies_zero = not node.attrs.get("allowzero", 0)
    if spec is None or not all(isinstance(d, int) for d in spec) or len(spec) != len(out):
        return Cut("Reshape to a computed shape")
    j = new.axis
    if copies_zero and cmap.axis != j and cmap.axis < len(spec) and spec[cmap.axis] == 0:
        return Cut("Reshape copies the padded dim into another position")
    if spec[j] == -1 or (copies_zero and spec[j] == 0 and j == cmap.axis
                         and new.size == cmap.size):
        return Carry(new, "Reshape keeps the channel axis whole (its size is inferred)")
    if spec[j] != out[j]:
        return Cut("Reshape names the padded axis in a way it cannot be rewritten")
    return Carry(new, "Reshape keeps the channel axis whole (padded size written)",
                 (SetShape(j, new.size),))


def _slice_axes(c: _Ctx, node: Node, nd: int) -> list[int] | None:
    axes = node.attrs.get("axes")
    if axes is None and len(node.inputs) > 3 and node.inputs[3]:
        v = c.value(node.inputs[3])
        axes = None if v is None else v.reshape(-1).tolist()
        if axes is None:
            return None
    if axes is None:
        starts = c.value(node.inputs[1]) if len(node.inputs) > 1 else None
        axes = None if starts is None else list(range(starts.size))
    return None if axes is None else [int(a) % nd for a in axes]


def _shape_op(c: _Ctx, node: Node, cmap: ChannelMap) -> Carry | Cut:
    """Cases 4d and 4e."""
    op, src = node.op_type, c.shape(node.inputs[0])
    if src is None:
        return Cut("unknown shapes")
    nd = len(src)
    if op in _POOLS:
        k = node.attrs.get("kernel_shape")
        spatial = len(k) if isinstance(k, (list, tuple)) and k else nd - 2
        if cmap.axis != nd - spatial - 1 or (len(node.outputs) > 1 and node.outputs[1]):
            return Cut(f"{op} pools over the padded axis or returns indices")
        return Carry(cmap, f"{op} pools each channel on its own")
    if op in _REDUCTIONS:
        axes = node.attrs.get("axes")
        if axes is None and len(node.inputs) > 1 and node.inputs[1]:
            return Cut("computed reduction axes")
        dims = None if not axes else [int(d) % nd for d in axes]
        if dims is None or cmap.axis in dims:
            return Cut(f"{op} reduces over the padded channel axis")
        keep = node.attrs.get("keepdims", 1)
        axis = cmap.axis if keep else cmap.axis - sum(d < cmap.axis for d in dims)
        return Carry(cmap.moved(axis, cmap.clean and op != "ReduceLogSumExp"),
                     f"{op} reduces other axes only")
    if op in ("Softmax", "LogSoftmax"):
        if int(node.attrs.get("axis", -1)) % nd == cmap.axis:
            return Cut(f"{op} over the padded channel axis would count the padding")
        return Carry(cmap.moved(cmap.axis, False), f"{op} over another axis")
    if op == "LayerNormalization":
        if cmap.axis >= int(node.attrs.get("axis", -1)) % nd:
            return Cut("LayerNormalization normalizes over the padded channel axis")
        return Carry(cmap.moved(cmap.axis, False), "LayerNormalization over non-channel axes")
    if op == "Transpose":
        perm = [int(p) % nd for p in node.attrs.get("perm") or list(range(nd))[::-1]]
        return Carry(cmap.moved(perm.index(cmap.axis)), "Transpose moves the channel axis")
    if op == "Slice":
        axes = _slice_axes(c, node, nd)
        if axes is None:
            return Cut("Slice with computed axes")
        if cmap.axis in axes:
            return Cut("Slice indexes the padded axis")
        drop = node.attrs.get("squeeze") and axes[0] < cmap.axis
        return Carry(cmap.moved(cmap.axis - (1 if drop else 0)), "Slice indexes other axes")
    return _reshape(c, node, cmap)


def _concat(c: _Ctx, node: Node) -> Carry | Cut:
    """Case 4f."""
    if node.attrs.get("new_axis"):
        return Cut("stack adds an axis")
    shapes = [c.shape(t) for t in node.inputs]
    if any(s is None for s in shapes):
        return Cut("unknown shapes")
    nd = len(shapes[0])  # type: ignore[arg-type]
    dim = int(node.attrs.get("axis", 0)) % nd
    maps = [c.lookup(t) for t in node.inputs]
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


def carry_rule(graph: Graph, node: Node, lookup: Lookup, value: Values) -> Carry | Cut:
    """Carry or cut for a non-GEMM ``node`` that reads at least one padded tensor (case 4g:
    an op no rule knows is cut)."""
    c, op = _Ctx(graph, lookup, value), node.op_type
    if len([o for o in node.outputs if o]) != 1 or not node.outputs[0]:
        return Cut(f"{op} has several outputs")
    if op == "Concat":
        return _concat(c, node)
    if op in ("Add", "Sub", "Mul", "Div"):
        return _binary(c, node)
    cmap = lookup(node.inputs[0]) if node.inputs else None
    if cmap is None or any(lookup(i) for i in node.inputs[1:] if i):
        return Cut(f"{op} reads the padded tensor in an argument it does not treat per channel")
    if op in _ZERO_PRESERVING or op in _NONZERO_AT_ZERO or op in ("Clip", "Alias"):
        return _unary(c, node, cmap)
    if op == "GroupNormalization":
        return Cut("GroupNormalization statistics would include the padded channels")
    if op in ("BatchNormalization", "InstanceNormalization"):
        return _norm(c, node, cmap)
    if op in _POOLS or op in _REDUCTIONS or op in _RESHAPES or op in (
            "Softmax", "LogSoftmax", "LayerNormalization", "Transpose", "Slice"):
        return _shape_op(c, node, cmap)
    return Cut(f"{op} is not known to be channel-local")
