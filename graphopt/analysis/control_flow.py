"""ONNX control flow: an ``If`` runs one of its branches, a ``Loop``/``Scan`` its body per trip.

The ONNX frontend hands each body over as a graph of its own (``attrs["bodies"]``,
:mod:`graphopt.frontends.onnx_bodies`); each body is analysed like any graph, and its node
analyses ride on the control-flow node's :class:`NodeAnalysis` (``branches``, ``trips``), where
the roofline costs them node by node (:func:`graphopt.cost.roofline.estimate`: the slowest
branch, times the trips).

The node's own FLOPs and bytes are its branch's totals times the trips: for an ``If``, the
branch with the most FLOPs (then bytes), which is the costlier one on any target unless the two
trade FLOPs for bytes; the roofline picks by time on the target. A ``Loop`` whose trip count is
not a constant, or a ``Scan`` over a dynamic length, is counted as one trip and flagged
``trip_count_unknown`` (so is a node whose chosen body holds such a loop, or dims no input size
decides: ``dynamic_shape``); a node whose bodies could not be built is flagged ``body_not_analysed``
and costs nothing of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from graphopt.analysis.kernel_class import KernelClass
from graphopt.analysis.record import NodeAnalysis
from graphopt.ir.graph import Graph, Node
from graphopt.ir.ops import CONTROL_FLOW_OPS
from graphopt.ir.shape_range import bind

__all__ = ["with_bodies"]

#: flags of a branch's nodes its control-flow node carries too: its cost depends on them
_INHERITED = frozenset({"dynamic_shape", "unknown_shape", "trip_count_unknown"})

Annotate = Callable[[Graph], Mapping[str, NodeAnalysis]]


def _totals(branch: tuple[NodeAnalysis, ...]) -> tuple[int, int, int, int]:
    return (sum(a.flops for a in branch), sum(a.bytes_read for a in branch),
            sum(a.bytes_written for a in branch), sum(a.param_count for a in branch))


def _sized(body: Graph, outer: Graph) -> Graph:
    """``body`` with the sizes the outer graph has for the values it reads: a graph planned at
    a shape range's opt point is sized there (:func:`graphopt.ir.shape_range.bind`), its
    bodies, built once from the model, still name the dims."""
    values: dict[str, int] = {}
    for name, t in body.tensors.items():
        o = outer.tensors.get(name)
        if o is not None and t.shape is not None and o.shape is not None and \
                len(t.shape) == len(o.shape):
            for d, v in zip(t.shape, o.shape, strict=True):
                if isinstance(d, str) and d != "?" and isinstance(v, int):  # "?": no name
                    values.setdefault(d, v)
    return bind(body, values) if values else body


def _control_flow(node: Node, graph: Graph, a: NodeAnalysis, annotate: Annotate
                  ) -> NodeAnalysis:
    bodies = node.attrs.get("bodies")
    if not bodies:
        return replace(a, flops=0, bytes_read=0, bytes_written=0,
                       flags=(*a.flags, "body_not_analysed"))
    branches = tuple(tuple(annotate(_sized(body, graph)).values()) for _, body in bodies)
    trips, flags = node.attrs.get("trip_count"), a.flags
    if node.op_type == "If":
        trips = 1
    elif not isinstance(trips, int):
        trips, flags = 1, (*flags, "trip_count_unknown")
    trips = max(trips, 0)
    totals = [_totals(b) for b in branches]
    pick = max(range(len(branches)), key=lambda i: (totals[i][0], totals[i][1] + totals[i][2]))
    flops, read, written, params = totals[pick]
    inherited = {f for b in branches[pick] for f in b.flags if f in _INHERITED}
    flags = (*flags, *sorted(inherited - set(flags)))
    dims = {"branches": len(branches), "branch": pick, "nodes": len(branches[pick]),
            "trips": trips}
    return replace(a, kernel_class=KernelClass.CONTROL_FLOW, dims=dims, flops=flops * trips,
                   bytes_read=read * trips, bytes_written=written * trips, param_count=params,
                   flags=flags, branches=branches, trips=trips)


def with_bodies(graph: Graph, analyses: dict[str, NodeAnalysis], annotate: Annotate) -> None:
    """Give every control-flow node of ``graph`` its bodies' analyses (in place);
    ``annotate`` analyses a body (the analysis pass itself, passed in: it calls this)."""
    for node in graph.nodes:
        if node.op_type in CONTROL_FLOW_OPS and node.name in analyses:
            analyses[node.name] = _control_flow(node, graph, analyses[node.name], annotate)
