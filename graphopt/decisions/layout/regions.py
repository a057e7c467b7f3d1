"""Conv regions on the plan: connected layout-agnostic nodes that can run NHWC together.

The plan-level twin of :mod:`graphopt.backends.torch.layout_regions` (which finds the same regions
on an fx graph to edit them): a region is a maximal connected set of :data:`AGNOSTIC` nodes with
4-D (or 5-D) outputs that contains a conv. Its boundary tensors are what a backend converts:

1. Entries: activations produced outside (or graph inputs) and read by a member. Parameters and
   constants are not activations (weights are converted ahead of time; other constants
   broadcast in any layout).
2. Exits: a member's output read by a non-member, or a graph output. A reduction over every
   spatial dim down to (N, C) needs no conversion: its output is dense in any layout.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from graphopt.ir.graph import TensorInfo
from graphopt.ir.plan import NodePlan, Plan

__all__ = ["AGNOSTIC", "PlanRegion", "plan_regions"]

logger = logging.getLogger(__name__)

_REDUCTIONS = frozenset({"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin"})

#: canonical ops (graphopt.ir.ops) that accept any strides and keep the rank: region members (the
#: canonical names of ``rewrites.layout_regions.AGNOSTIC``; reductions only with keepdims)
AGNOSTIC = frozenset({
    "Conv", "BatchNormalization", "Dropout", "Copy", "Identity", "Alias", "Cast", "Slice", "Pad",
    "Relu", "Clip", "LeakyRelu", "Gelu", "Silu", "Sigmoid", "Tanh", "HardSwish", "HardSigmoid",
    "Elu", "Mish", "Softplus", "Neg", "Abs", "Exp", "Add", "Sub", "Mul", "Div", "Max", "Min",
    "Concat", "MaxPool", "AveragePool", "GlobalAveragePool", "AdaptiveAvgPool", "Resize",
}) | _REDUCTIONS


@dataclass(frozen=True)
class PlanRegion:
    """Connected agnostic plan nodes with a conv, and the tensors crossing its boundary."""

    id: int
    rank: int
    nodes: tuple[str, ...]
    convs: tuple[str, ...]
    entries: tuple[TensorInfo, ...]  # activations produced outside, read inside
    exits: tuple[TensorInfo, ...]  # outputs read outside in NCHW (or graph outputs)


def _rank(t: TensorInfo | None) -> int | None:
    return None if t is None or t.shape is None else len(t.shape)


def _activations(node: NodePlan) -> list[TensorInfo]:
    return [t for t in node.inputs if t is not None and t.kind in ("input", "activation")]


def _layout_free_reader(node: NodePlan, rank: int) -> bool:
    """A reduction over every spatial dim to (N, C): its output is dense in any layout."""
    if node.op_type not in _REDUCTIONS or not node.inputs or not node.outputs:
        return False
    x, out = node.inputs[0], node.outputs[0]
    return (x is not None and out is not None and _rank(x) == rank and x.shape is not None
            and out.shape is not None and tuple(out.shape) == tuple(x.shape[:2]))


def plan_regions(plan: Plan, excluded: Iterable[str] = ()) -> list[PlanRegion]:
    """Maximal connected member sets (union-find over member-to-member edges) with a conv."""
    skip = set(excluded)
    producer = {t.name: n for n in plan.nodes for t in n.outputs if t is not None}
    readers: dict[str, list[NodePlan]] = {}
    for n in plan.nodes:
        for t in _activations(n):
            readers.setdefault(t.name, []).append(n)
    outputs = set(plan.model.output_names)

    def member(n: NodePlan) -> bool:
        r = _rank(n.outputs[0]) if n.outputs else None
        if n.op_type not in AGNOSTIC or n.name in skip or r not in (4, 5):
            return False
        return n.op_type not in _REDUCTIONS or _rank(n.inputs[0] if n.inputs else None) == r

    members = [n for n in plan.nodes if member(n)]
    parent = {n.name: n.name for n in members}
    rank_of = {n.name: _rank(n.outputs[0]) for n in members}

    def root(a: str) -> str:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for n in members:
        for t in _activations(n):
            p = producer.get(t.name)
            if p is not None and p.name in parent and rank_of[p.name] == rank_of[n.name]:
                parent[root(p.name)] = root(n.name)
    groups: dict[str, list[NodePlan]] = {}
    for n in members:  # plan (topological) order within each group
        groups.setdefault(root(n.name), []).append(n)
    regions: list[PlanRegion] = []
    for group in groups.values():
        convs = tuple(n.name for n in group if n.op_type == "Conv")
        if not convs:
            continue
        rank = rank_of[group[0].name] or 4
        inside = {n.name for n in group}
        entries: dict[str, TensorInfo] = {}
        exits: dict[str, TensorInfo] = {}
        for n in group:
            for t in _activations(n):
                p = producer.get(t.name)
                if (p is None or p.name not in inside) and _rank(t) == rank:
                    entries.setdefault(t.name, t)
            for t in n.outputs:
                if t is None:
                    continue
                outside = [r for r in readers.get(t.name, []) if r.name not in inside
                           and not _layout_free_reader(r, rank)]
                if outside or t.name in outputs:
                    exits.setdefault(t.name, t)
        regions.append(PlanRegion(len(regions), rank, tuple(n.name for n in group), convs,
                                  tuple(entries.values()), tuple(exits.values())))
    return regions
