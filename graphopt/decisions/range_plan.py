"""A plan over a shape range: decided at the opt point, costed at min, opt and max.

The decisions (precision, padding, layout, memory) are made once, on the graph sized at opt; the
cost model then runs on the same graph sized at min and at max, so each node records its dims and
cost at every point and the summary gives the estimate over the range (TensorRT's optimization
profiles give one engine per range the same way). Only analysis and cost run again at min and
max: planning a range costs little more than planning one shape.
"""

from __future__ import annotations

import re
from dataclasses import replace

from graphopt.analysis import KernelClass, annotate
from graphopt.analysis.record import NodeAnalysis
from graphopt.cost import estimate_all
from graphopt.cost.roofline import NodeCost
from graphopt.decisions.padding import required_multiple
from graphopt.hardware.profile import HardwareProfile
from graphopt.ir.graph import Graph
from graphopt.ir.plan import Plan
from graphopt.ir.plan_sections import PointCost, PointTimes, RangePoints, ShapeRangePlan
from graphopt.ir.shape_range import POINTS, ShapeRange, bind

__all__ = ["alignment_hints", "at_opt", "with_hints", "with_range"]

#: kernel classes whose M dimension runs on tensor-core tiles
_TILED = frozenset({KernelClass.GEMM, KernelClass.GEMV, KernelClass.ATTENTION,
                    KernelClass.CONV})


def at_opt(graph: Graph) -> Graph:
    """``graph`` sized at its range's opt point (itself when it has no range)."""
    rng = graph.shape_range
    return bind(graph, rng.values("opt")) if rng else graph


def with_range(plan: Plan, graph: Graph, target: HardwareProfile) -> Plan:
    """``plan`` (built on ``graph`` at opt) with each node's dims and cost at min and max, and
    the ``shape_range`` section: the dims, the estimate at each point, alignment hints."""
    rng: ShapeRange | None = graph.shape_range
    if not rng:
        return plan
    opt_values = rng.values("opt")
    points: dict[str, dict[str, PointCost]] = {}
    totals = {"opt": plan.est_latency_s}
    for point in ("min", "max"):
        values = rng.values(point)
        if values == opt_values:
            totals[point] = plan.est_latency_s
            continue
        sized = bind(graph, values)
        analyses = annotate(sized)
        costs = estimate_all(analyses, target)
        total = 0.0
        records: dict[int, PointCost] = {}
        for n in sized.nodes:
            a, c = analyses[n.name], costs[n.name]
            total += c.est_time_s
            points.setdefault(n.name, {})[point] = _record(records, a, c)
        totals[point] = total
    records = {}
    nodes = []
    for n in plan.nodes:  # a point equal to opt (or skipped) is the node's own record
        own, at = _record(records, n.analysis, n.cost), points.get(n.name, {})
        nodes.append(replace(n, at_points=RangePoints(**{p: at.get(p, own) for p in POINTS})))
    section = ShapeRangePlan(rng.dims, {k: tuple(v) for k, v in rng.inputs.items()},
                             PointTimes(**totals))
    unbounded = [d.name for d in rng.dims if d.max is None]
    warnings = list(plan.warnings)
    if unbounded:
        warnings.append(f"no max given for {', '.join(unbounded)}: the module accepts any "
                        "size, and the max point is costed at opt (give torch.export.Dim(..., "
                        "max=N), or min:opt:max on the CLI, for a real max)")
    return replace(plan, nodes=tuple(nodes), warnings=tuple(warnings),
                   shape_range=section)


def with_hints(plan: Plan, graph: Graph, target: HardwareProfile) -> Plan:
    """``plan``'s shape-range section with the alignment hints, read from its decisions (the
    precision decides which multiple tensor cores want)."""
    section = plan.shape_range
    if section is None:
        return plan
    hints = alignment_hints(plan, graph, target)
    return replace(plan, shape_range=replace(section, hints=tuple(hints)))


def _record(records: dict[int, PointCost], a: NodeAnalysis, c: NodeCost) -> PointCost:
    """A node's dims and cost at one point. Nodes that share a cost object (``estimate_all``:
    the same work) share the record: a repeated layer is described once per point."""
    rec = records.get(id(c))
    if rec is None:
        rec = records[id(c)] = PointCost(dict(a.dims), c.est_time_s, c.bottleneck, a.flops,
                                         a.bytes_total)
    return rec


def alignment_hints(plan: Plan, graph: Graph, target: HardwareProfile) -> list[str]:
    """For each dynamic dim that sizes a tensor-core kernel: the multiple that keeps the tiles
    full. Graphopt never pads a dynamic dim (the module must take every size); the user can."""
    rng = graph.shape_range
    if not target.is_gpu or not rng:
        return []
    dtype = next((n.analysis.dtype for n in plan.nodes
                  if n.analysis.kernel_class in _TILED and n.analysis.dtype), "fp32")
    fmt = next((n.decisions["precision"].detail.format for n in plan.nodes
                if "precision" in n.decisions and n.decisions["precision"].detail.format),
               dtype)
    multiple, _ = required_multiple("gemm", target, fmt)
    if multiple is None:
        return []
    tiled = {n.name for n in plan.nodes if n.analysis.kernel_class in _TILED}
    used = {name for n in graph.nodes if n.name in tiled for t in graph.input_infos(n)
            if t is not None and t.shape for d in t.shape if not isinstance(d, int)
            for name in re.findall(r"[A-Za-z_]\w*", str(d))}
    hints = []
    for d in rng.dims:
        if d.name not in used:
            continue
        now = "it is" if d.opt % multiple == 0 else "it is not"
        hints.append(f"{d.name} a multiple of {multiple} keeps {target.name}'s tensor cores "
                     f"full in {fmt} ({now} at opt {d.opt}); graphopt never pads a dynamic "
                     "dim")
    return hints
