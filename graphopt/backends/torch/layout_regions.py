"""Conv regions for the channels_last pass: which ops may run in NHWC, and where regions meet.

This finds regions on the fx graph to edit them; the decision is made on the plan's regions
(:mod:`graphopt.decisions.layout.regions`, the same rules in canonical op names).

A region is a maximal connected set of layout-agnostic ops whose outputs are 4-D (or 5-D) and
that contains at least one conv. "Layout-agnostic" means the op is defined on logical indices
and accepts any strides (true of every ATen op listed in ``AGNOSTIC``) and keeps the rank, so a
channels_last input gives the same values and, in PyTorch's kernels, a channels_last output.

Boundary tensors:

1. Entries: a 4-D (5-D) activation read by a member but produced outside (placeholder or a
   non-member op). Constants (``get_attr``) are not activations: conv weights are converted
   ahead of time by the pass, and other constants broadcast correctly in any layout.
2. Exits: a member's output read by a non-member or by the graph output. Readers in
   ``_LAYOUT_FREE_READERS`` need no conversion: a reduction over every spatial dim with
   ``keepdim=False`` returns a dense (N, C) tensor whatever its input's strides.

Conversions a previous run inserted (``aten.contiguous`` with a channels_last memory format at
entries, plain ``aten.contiguous`` at exits) count as already in place, which makes the pass
idempotent.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
from torch import fx

from graphopt.backends.torch.fx_utils import aten_name, get_tensor, val
from graphopt.decisions.layout.conv_facts import ConvGroups

__all__ = ["AGNOSTIC", "ConvInfo", "Region", "conv_info", "find_regions", "is_entry_conversion",
           "is_exit_conversion", "memory_format_for",
           "weight_needs_conversion"]

logger = logging.getLogger(__name__)

_CONVS = frozenset({"conv2d", "conv3d", "convolution"})

#: ATen ops (overload packets) that accept any strides and keep the rank: region members.
AGNOSTIC = _CONVS | frozenset({
    "batch_norm", "dropout", "clone", "alias", "_to_copy",
    "slice", "narrow", "constant_pad_nd",  # e.g. the padding pass's channel pads and slices
    "relu", "relu_", "relu6", "hardtanh", "hardtanh_", "leaky_relu", "leaky_relu_", "gelu",
    "silu", "silu_", "sigmoid", "sigmoid_", "tanh", "tanh_", "hardswish", "hardswish_",
    "hardsigmoid", "hardsigmoid_", "elu", "mish", "softplus", "clamp", "clamp_min",
    "clamp_max", "neg", "abs", "exp",
    "add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "maximum", "minimum",
    "cat",
    "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "max_pool3d", "avg_pool3d",
    "adaptive_avg_pool3d",
    "upsample_nearest2d", "upsample_bilinear2d", "upsample_bicubic2d",
    "_upsample_nearest_exact2d", "upsample_nearest3d", "upsample_trilinear3d",
    "mean", "sum", "amax", "amin",  # members only with keepdim=True (rank kept)
})
_REDUCTIONS = frozenset({"mean", "sum", "amax", "amin"})
_LAYOUT_FREE_READERS = _REDUCTIONS


def memory_format_for(rank: int) -> torch.memory_format:
    return torch.channels_last if rank == 4 else torch.channels_last_3d


@dataclass(frozen=True)
class ConvInfo(ConvGroups):
    """What applying the layout decision needs to know about one conv node (the decision's
    own facts come from the plan: ``graphopt.decisions.layout.conv_facts.ConvFacts``)."""

    weight: fx.Node | None  # the get_attr node, None when the weight is computed
    rank: int
    groups: int
    c_in: int
    c_out: int
    kernel: tuple[int, ...]
    out_spatial: int  # H_out * W_out (* D_out)
    transposed: bool


def conv_info(node: fx.Node) -> ConvInfo | None:
    """Conv facts from the traced shapes."""
    name = aten_name(node)
    if name not in _CONVS:
        return None
    x = node.args[0] if isinstance(node.args[0], fx.Node) else None
    w = node.args[1] if len(node.args) > 1 and isinstance(node.args[1], fx.Node) else None
    out = val(node)
    xv, wv = (val(x) if x is not None else None), (val(w) if w is not None else None)
    if xv is None or wv is None or out is None or out.dim() not in (4, 5):
        return None
    if name == "convolution":  # (input, weight, bias, stride, padding, dilation, transposed,
        transposed = bool(node.args[6]) if len(node.args) > 6 else False  # output_padding,
        groups = int(node.args[8]) if len(node.args) > 8 else 1  # groups)
    else:  # conv2d/conv3d(input, weight, bias, stride, padding, dilation, groups)
        transposed = False
        groups = int(node.args[6]) if len(node.args) > 6 else int(node.kwargs.get("groups", 1))
    spatial = 1
    for s in out.shape[2:]:
        spatial *= int(s)
    return ConvInfo(weight=w if w is not None and w.op == "get_attr" else None, rank=out.dim(),
                    groups=groups, c_in=int(xv.shape[1]), c_out=int(out.shape[1]),
                    kernel=tuple(int(k) for k in wv.shape[2:]), out_spatial=spatial,
                    transposed=transposed)


def _contiguous_format(node: fx.Node) -> torch.memory_format | None:
    if aten_name(node) != "contiguous":
        return None
    return node.kwargs.get("memory_format", torch.contiguous_format)


def is_entry_conversion(node: fx.Node) -> bool:
    return _contiguous_format(node) in (torch.channels_last, torch.channels_last_3d)


def is_exit_conversion(node: fx.Node) -> bool:
    return _contiguous_format(node) == torch.contiguous_format


def _rank(node: fx.Node) -> int | None:
    v = val(node)
    return v.dim() if v is not None else None


def _is_member(node: fx.Node, excluded: dict[fx.Node, str]) -> bool:
    name = aten_name(node)
    if name not in AGNOSTIC or node in excluded or _rank(node) not in (4, 5):
        return False
    if name in _REDUCTIONS:
        keep = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
        return bool(keep)
    return True


def _layout_free_reader(reader: fx.Node, rank: int) -> bool:
    """A reduction over every spatial dim without keepdim: its (N, C) output is dense anyway."""
    if aten_name(reader) not in _LAYOUT_FREE_READERS or len(reader.args) < 2:
        return False
    keep = reader.args[2] if len(reader.args) > 2 else reader.kwargs.get("keepdim", False)
    dims = reader.args[1]
    if keep or not isinstance(dims, (list, tuple)):
        return False
    spatial = set(range(2, rank))
    return spatial <= {int(d) % rank for d in dims}


@dataclass
class Region:
    """One conv region: members in graph order and its boundary tensors."""

    id: int
    rank: int
    nodes: list[fx.Node]
    convs: list[fx.Node] = field(default_factory=list)
    #: activations produced outside and read by members (entry conversions go after them)
    entries: list[fx.Node] = field(default_factory=list)
    #: members read outside the region: member -> readers that need NCHW data
    exits: dict[fx.Node, list[fx.Node]] = field(default_factory=dict)

    def new_entries(self) -> list[fx.Node]:
        return [e for e in self.entries if not is_entry_conversion(e)]

    def new_exits(self) -> dict[fx.Node, list[fx.Node]]:
        return {m: [r for r in rs if not is_exit_conversion(r)] for m, rs in self.exits.items()
                if any(not is_exit_conversion(r) for r in rs)}


def find_regions(gm: fx.GraphModule, excluded: dict[fx.Node, str]) -> list[Region]:
    """Maximal connected member sets (union-find over member-to-member edges) with a conv."""
    nodes = list(gm.graph.nodes)
    members = [n for n in nodes if _is_member(n, excluded)]
    parent = {n: n for n in members}

    def root(n: fx.Node) -> fx.Node:
        while parent[n] is not n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for n in members:
        for a in n.all_input_nodes:
            if a in parent and _rank(a) == _rank(n):
                parent[root(a)] = root(n)
    groups: dict[fx.Node, list[fx.Node]] = {}
    for n in members:  # graph order within each group
        groups.setdefault(root(n), []).append(n)
    regions: list[Region] = []
    for group in groups.values():
        convs = [n for n in group if aten_name(n) in _CONVS]
        if not convs:
            continue
        rank = _rank(group[0]) or 4
        region = Region(id=len(regions), rank=rank, nodes=group, convs=convs)
        inside = set(group)
        for n in group:
            for a in n.all_input_nodes:
                if a not in inside and a.op != "get_attr" and _rank(a) == rank \
                        and a not in region.entries:
                    region.entries.append(a)
            readers = [u for u in n.users if u not in inside
                       and not _layout_free_reader(u, rank)]
            if readers:
                region.exits[n] = readers
        regions.append(region)
        logger.debug("region %d: %d ops, %d convs, %d entries, %d exits", region.id,
                     len(group), len(convs), len(region.entries), len(region.exits))
    return regions


def weight_needs_conversion(gm: fx.GraphModule, info: ConvInfo) -> bool:
    """False for weights already channels_last, and for 1x1 kernels (both layouts at once)."""
    w = get_tensor(gm, info.weight)
    return w is not None and not w.is_contiguous(memory_format=memory_format_for(info.rank))
