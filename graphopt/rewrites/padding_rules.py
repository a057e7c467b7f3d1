"""Which ops a padded channel axis may pass through, and how their arguments change.

A padded tensor is *carried* through an op when the op is channel-local (each output channel
depends only on the same input channel) and maps zeros to zeros, or when the junk it writes to
padding positions can only reach consumers that ignore them. Otherwise the padding is *cut*
(sliced away) before the op. The cases, numbered as the rules below refer to them:

1. Unary ops with ``f(0) = 0`` (relu, gelu, silu, tanh, ...) keep the map; ``f(0) != 0``
   (sigmoid) keeps it but marks the padding dirty (finite, non-zero).
2. Eval BatchNorm is per-channel affine: its params are padded with mean 0, var 1, weight 0,
   bias 0 so the padding leaves it as exact zeros. Training-mode BN is cut.
3. add/sub/mul/div of two equally mapped tensors, of a scalar, or of a tensor broadcast along
   the channel axis: ``0 * y = 0`` keeps a map clean, ``0 + y`` makes it dirty. A per-channel
   constant operand (layer scale) is padded ahead of time with 0 (1 as a divisor).
4. Pooling and reductions over non-channel axes are channel-local; a reduction over the channel
   axis, LayerNorm/softmax over it and GroupNorm would see the padding: cut.
5. Reshapes that keep the channel axis whole or merge it with real axes (see
   ``channel_map.reshape_map``); transposes and permutes move the axis; slicing or selecting
   another axis keeps it.
6. Concat along the channel axis concatenates the maps (offsets); along another axis it needs
   equal maps.
7. Anything else is unknown and cut.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import fx

from graphopt.decisions.channel_map import ChannelMap, reshape_map
from graphopt.rewrites.channel_scatter import scatter_vector
from graphopt.rewrites.fx_utils import aten_name, get_tensor, new_param, val

__all__ = ["Carry", "Cut", "GemmSite", "Lookup", "absorbs", "carry_rule", "gemm_site",
           "static_shape"]

Lookup = Callable[[fx.Node], "ChannelMap | None"]

_ZERO_PRESERVING = frozenset({  # f(0) == 0, finite on finite inputs (case 1)
    "relu", "relu_", "relu6", "gelu", "silu", "tanh", "leaky_relu", "elu", "hardswish",
    "mish", "neg", "abs", "hardtanh", "clone", "contiguous", "detach", "alias", "_to_copy", "to",
    "lift_fresh_copy"})
_NONZERO_AT_ZERO = frozenset({"sigmoid", "hardsigmoid"})  # bounded, so the junk stays finite
_POOLS = {f"{p}{k}d": k for p in ("max_pool", "avg_pool", "adaptive_avg_pool") for k in (1, 2, 3)}
_REDUCTIONS = frozenset({"mean", "sum", "amax", "amin"})
_RESHAPES = frozenset({"view", "reshape", "_unsafe_view", "flatten", "squeeze", "unsqueeze"})
_CONVS = frozenset({"conv1d", "conv2d", "conv3d"})
_CONV_TRANSPOSES = frozenset({"conv_transpose1d", "conv_transpose2d", "conv_transpose3d"})


@dataclass(frozen=True)
class Carry:
    """The op keeps the padding: its output map, why, and the argument edit it needs."""

    out: ChannelMap
    reason: str
    edit: Callable[[fx.GraphModule], None] | None = None


@dataclass(frozen=True)
class Cut:
    """The op would see the padding: slice its padded inputs to the real channels first."""

    reason: str


def static_shape(node: object) -> tuple[int, ...] | None:
    v = val(node) if isinstance(node, fx.Node) else None
    if v is None or not all(isinstance(d, int) for d in v.shape):
        return None
    return tuple(int(d) for d in v.shape)


@dataclass(frozen=True)
class GemmSite:
    """A conv, transposed conv or linear whose channels may be padded."""

    node: fx.Node
    op: str  # "conv" | "conv_transpose" | "linear"
    x: fx.Node
    weight: fx.Node
    bias: fx.Node | None
    c_in: int
    c_out: int
    groups: int
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    in_axis: int
    out_axis: int

    @property
    def depthwise(self) -> bool:
        return self.groups > 1 and self.groups == self.c_in


def gemm_site(node: fx.Node) -> GemmSite | str | None:
    """The site of a GEMM-like node; a reason string if it cannot be padded; None if not one."""
    name = aten_name(node)
    op = ("conv" if name in _CONVS else "conv_transpose" if name in _CONV_TRANSPOSES
          else "linear" if name == "linear" else None)
    if op is None:
        return None
    args = list(node.args) + [None] * 8
    x, w, b = args[0], args[1], args[2]
    groups = args[6] if op != "linear" and args[6] is not None else node.kwargs.get("groups", 1)
    w_shape, in_shape, out_shape = static_shape(w), static_shape(x), static_shape(node)
    if not isinstance(w, fx.Node) or w.op != "get_attr" or w_shape is None:
        return "the weight is computed, not a constant"
    if b is not None and (not isinstance(b, fx.Node) or b.op != "get_attr"):
        return "the bias is computed, not a constant"
    if in_shape is None or out_shape is None or not isinstance(groups, int):
        return "dynamic shapes"
    if 0 in (*in_shape, *out_shape, *w_shape):
        return "a zero-size tensor: no work to speed up"
    spatial = len(w_shape) - 2
    if op == "linear":
        c_out, c_in, in_axis, out_axis = w_shape[0], w_shape[1], len(in_shape) - 1, \
            len(out_shape) - 1
    else:
        in_axis, out_axis = len(in_shape) - spatial - 1, len(out_shape) - spatial - 1
        c_in = w_shape[0] if op == "conv_transpose" else w_shape[1] * groups
        c_out = w_shape[1] * groups if op == "conv_transpose" else w_shape[0]
    return GemmSite(node, op, x, w, b, c_in, c_out, groups, in_shape, out_shape, in_axis,
                    out_axis)


def absorbs(site: GemmSite, cmap: ChannelMap) -> bool:
    """Can zero weights at the padding positions absorb a padded input (identity 1)?"""
    if cmap.axis != site.in_axis or site.depthwise:
        return False
    if site.op == "conv_transpose":
        return site.groups == 1
    return cmap.group_block(site.groups) is not None


def _unary(name: str, node: fx.Node, cmap: ChannelMap) -> Carry | Cut:
    if name in _NONZERO_AT_ZERO:
        return Carry(cmap.moved(cmap.axis, clean=False),
                     f"{name} is channel-local; f(0) != 0 leaves finite junk in the padding")
    if name == "dropout" and (node.args[2] if len(node.args) > 2 else False):
        return Cut("dropout in training mode")
    return Carry(cmap, f"{name} is channel-local with f(0) = 0")


def _batch_norm(node: fx.Node, cmap: ChannelMap) -> Carry | Cut:
    """Case 2: pad the per-channel params so padded channels come out as exact zeros."""
    args = list(node.args) + [None] * 9
    x, w, b, mean, var, training = args[:6]
    if training:
        return Cut("BatchNorm in training mode normalizes with batch statistics")
    if cmap.axis != 1 or not all(isinstance(n, fx.Node) and n.op == "get_attr"
                                 for n in (mean, var)):
        return Cut("BatchNorm without constant running statistics on axis 1")
    if any(n is not None and (not isinstance(n, fx.Node) or n.op != "get_attr") for n in (w, b)):
        return Cut("BatchNorm affine params are not constants")

    def edit(gm: fx.GraphModule) -> None:
        new = list(node.args)
        for i, fill in ((1, 0.0), (2, 0.0), (3, 0.0), (4, 1.0)):
            t = get_tensor(gm, new[i]) if isinstance(new[i], fx.Node) else None
            if t is not None:
                new[i] = new_param(gm, f"{node.name}_pad{i}",
                                   scatter_vector(t, cmap.positions, cmap.size, fill), node)
        node.args = tuple(new)

    clean = cmap.clean or w is not None  # weight 0 zeroes the padding whatever came in
    return Carry(cmap.moved(cmap.axis, clean), "eval BatchNorm is per-channel affine; padded "
                 "with mean 0, var 1, weight 0, bias 0", edit)


def _broadcasts_over(other: object, axis: int, ndim: int) -> bool:
    """True if ``other`` (a tensor node) is size 1 at (or does not reach) the channel axis."""
    shape = static_shape(other)
    if shape is None:
        return False
    idx = axis - (ndim - len(shape))
    return idx < 0 or shape[idx] == 1


def _binary(name: str, node: fx.Node, lookup: Lookup) -> Carry | Cut:
    """Case 3."""
    a, b = node.args[0], node.args[1]
    out = static_shape(node)
    ma = lookup(a) if isinstance(a, fx.Node) else None
    mb = lookup(b) if isinstance(b, fx.Node) else None
    if out is None:
        return Cut("dynamic shapes")
    padded = ma or mb
    assert padded is not None
    src = a if ma is not None else b
    axis = padded.axis + len(out) - len(static_shape(src) or out)
    if name == "div" and mb is not None:
        return Cut("dividing by a padded tensor would divide by zero")
    if ma is not None and mb is not None:
        if not ma.same_layout(mb):
            return Cut("the operands are padded differently")
        clean = (ma.clean or mb.clean) if name == "mul" else (ma.clean and mb.clean)
        return Carry(ma.moved(axis, clean), f"{name} of two equally padded tensors")
    other = b if ma is not None else a
    if isinstance(other, numbers.Number) or _broadcasts_over(other, axis, len(out)):
        keeps = name in ("mul", "div") or (isinstance(other, numbers.Number) and other == 0)
        return Carry(padded.moved(axis, padded.clean and keeps),
                     f"{name} with an operand broadcast over channels")
    shape = static_shape(other)
    idx = axis - len(out) + len(shape or ())
    if isinstance(other, fx.Node) and other.op == "get_attr" and shape and idx >= 0 \
            and shape[idx] == padded.real:
        return _padded_constant(name, node, other, idx, padded.moved(axis))
    return Cut("the other operand is not padded the same way")


def _padded_constant(name: str, node: fx.Node, const: fx.Node, dim: int, cmap: ChannelMap
                     ) -> Carry:
    """A per-channel constant (layer scale, bias) is padded ahead of time: 0, or 1 for div."""
    fill = 1.0 if name == "div" else 0.0

    def edit(gm: fx.GraphModule) -> None:
        t = get_tensor(gm, const)
        assert t is not None
        shape = list(t.shape)
        shape[dim] = cmap.size
        new = torch.full(shape, fill, dtype=t.dtype)
        new.index_copy_(dim, torch.tensor(cmap.positions, dtype=torch.long), t.detach())
        node.replace_input_with(const, new_param(gm, f"{node.name}_const", new, node))

    clean = cmap.clean or name == "mul"  # x * 0 = 0 whatever x held
    return Carry(cmap.moved(cmap.axis, clean), f"{name} with a per-channel constant padded "
                 f"ahead of time with {fill:g}", edit)


def _reduce_axes(node: fx.Node, ndim: int) -> tuple[list[int] | None, bool]:
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    keep = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return None, bool(keep)
    dims = [dims] if isinstance(dims, int) else list(dims)
    return [d % ndim for d in dims], bool(keep)


def _shape_op(name: str, node: fx.Node, cmap: ChannelMap) -> Carry | Cut:
    """Cases 4 and 5."""
    src, out = static_shape(node.args[0]), static_shape(node)
    if src is None or out is None:
        return Cut("dynamic shapes")
    nd = len(src)
    if name in _POOLS:
        if cmap.axis != nd - _POOLS[name] - 1:
            return Cut(f"{name} pools over the padded axis")
        return Carry(cmap, f"{name} pools each channel on its own")
    if name in _REDUCTIONS:
        dims, keep = _reduce_axes(node, nd)
        if dims is None or cmap.axis in dims:
            return Cut(f"{name} reduces over the padded channel axis")
        axis = cmap.axis if keep else cmap.axis - sum(d < cmap.axis for d in dims)
        return Carry(cmap.moved(axis), f"{name} reduces other axes only")
    if name in ("transpose", "permute", "t", "numpy_T"):
        perm = list(range(nd))[::-1]
        if name == "transpose":
            d0, d1 = node.args[1] % nd, node.args[2] % nd
            perm = list(range(nd))
            perm[d0], perm[d1] = d1, d0
        elif name == "permute":
            perm = [d % nd for d in node.args[1]]
        return Carry(cmap.moved(perm.index(cmap.axis)), f"{name} moves the channel axis")
    if name in ("slice", "select"):
        dim = (node.args[1] if len(node.args) > 1 else 0) % nd
        if dim == cmap.axis:
            return Cut(f"{name} indexes the padded axis")
        axis = cmap.axis - (1 if name == "select" and dim < cmap.axis else 0)
        return Carry(cmap.moved(axis), f"{name} indexes another axis")
    new = reshape_map(cmap, src, out)
    if new is None:
        return Cut(f"{name} splits the padded channel axis")

    def edit(gm: fx.GraphModule) -> None:
        if name in ("view", "reshape", "_unsafe_view"):
            sizes = list(node.args[1])
            sizes[new.axis] = new.size
            node.args = (node.args[0], sizes, *node.args[2:])

    return Carry(new, f"{name} keeps the channel axis whole", edit)


def _cat(node: fx.Node, lookup: Lookup) -> Carry | Cut:
    """Case 6."""
    tensors = list(node.args[0])
    shapes = [static_shape(t) for t in tensors]
    if any(s is None for s in shapes):
        return Cut("dynamic shapes")
    nd = len(shapes[0])
    dim = (node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)) % nd
    maps = [lookup(t) for t in tensors]
    if any(m is not None and m.axis != dim for m in maps):
        first = next(m for m in maps if m is not None)
        if all(m is not None and m.same_layout(first) for m in maps):
            return Carry(first.moved(first.axis, all(m.clean for m in maps)),
                         "concat along another axis of equally padded tensors")
        return Cut("concat of differently padded tensors along another axis")
    full = [m if m is not None else ChannelMap.identity(dim, s[dim])
            for m, s in zip(maps, shapes, strict=True)]
    return Carry(ChannelMap.concat(full, dim), "concat along channels: maps placed at offsets")


def carry_rule(node: fx.Node, lookup: Lookup) -> Carry | Cut:
    """Carry or cut for a non-GEMM ``node`` that reads at least one padded tensor."""
    name = aten_name(node)
    if name is None:
        return Cut(f"{node.op} {node.target} is not an ATen op the padding pass knows")
    if name == "cat":
        return _cat(node, lookup)
    if name in ("add", "sub", "mul", "div"):
        return _binary(name, node, lookup)
    first = node.args[0] if node.args else None
    cmap = lookup(first) if isinstance(first, fx.Node) else None
    if name == "group_norm":
        return Cut("GroupNorm statistics would include the padded channels")
    params_ok = name in ("batch_norm", "layer_norm")  # their other tensors are constants
    others = [a for a in (*node.args[1:], *node.kwargs.values()) if isinstance(a, fx.Node)]
    if cmap is None or (others and not params_ok):
        return Cut(f"{name} reads the padded tensor in an argument it does not treat per channel")
    nd = len(static_shape(first) or ())
    lo = node.args[1] if len(node.args) > 1 else -1.0
    hi = node.args[2] if len(node.args) > 2 else 1.0
    if name == "hardtanh" and not lo <= 0 <= hi:
        return Carry(cmap.moved(cmap.axis, False), "hardtanh is channel-local; clamps 0 away")
    if name in _ZERO_PRESERVING or name in _NONZERO_AT_ZERO or name == "dropout":
        return _unary(name, node, cmap)
    if name == "batch_norm":
        return _batch_norm(node, cmap)
    if name in ("softmax", "_softmax", "log_softmax", "_log_softmax"):
        if nd == 0 or node.args[1] % nd == cmap.axis:
            return Cut(f"{name} over the padded channel axis would count the padding")
        return Carry(cmap.moved(cmap.axis, False), f"{name} over another axis")
    if name == "layer_norm":
        if nd == 0 or cmap.axis >= nd - len(node.args[1]):
            return Cut("LayerNorm normalizes over the padded channel axis")
        return Carry(cmap.moved(cmap.axis, False), "LayerNorm over trailing non-channel axes")
    if name in _POOLS or name in _REDUCTIONS or name in _RESHAPES or name in (
            "transpose", "permute", "t", "numpy_T", "slice", "select"):
        return _shape_op(name, node, cmap)
    return Cut(f"{name} is not known to be channel-local")
