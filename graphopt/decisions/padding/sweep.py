"""The padding family's one entry, :func:`plan_padding`: sweep the graph once, in topological
order, hand each node to its case (numbered in :mod:`graphopt.decisions.padding`) and fold what
the case decided into the plan. Case 4's carry step is here; its rules are :mod:`.carry`.
"""

from __future__ import annotations

import logging
from types import MappingProxyType

from graphopt.decisions.padding.attention import plan_attention
from graphopt.decisions.padding.carry import Carry, carry_rule
from graphopt.decisions.padding.channel_map import ChannelMap
from graphopt.decisions.padding.gemm import decide_gemm
from graphopt.decisions.padding.sites import Values
from graphopt.decisions.padding.state import Decided, Outcome, SweepState, cut
from graphopt.decisions.padding.steps import CarryStep, PadBackend, PaddingPlan, Step
from graphopt.ir.decision_details import PaddingCarryDetail
from graphopt.ir.graph import Graph, Node
from graphopt.ir.options import Options
from graphopt.ir.plan_sections import PadSlice, PerCallPad

__all__ = ["plan_padding"]

logger = logging.getLogger(__name__)


def _carry(sw: SweepState, node: Node) -> Outcome:
    """Case 4: a node reading a padded tensor carries the padding or cuts it."""
    editable = sw.backend.can_edit(node)
    if not editable:
        return cut(sw, node, editable.reason)
    rule = carry_rule(sw.graph, node, sw.lookup, sw.value)
    if not isinstance(rule, Carry):
        return cut(sw, node, rule.reason)
    return Outcome(steps=(CarryStep(node, rule.out, rule.edits),),
                   maps=((node.outputs[0], rule.out),), carried=1,
                   decided=(Decided(node.name, PaddingCarryDetail(rule.out.real, rule.out.size,
                                                                  rule.out.clean),
                                    f"carried: {rule.reason} ({rule.out.real} real of "
                                    f"{rule.out.size})"),))


def _case(sw: SweepState, node: Node) -> Outcome:
    site = sw.site(node)
    if site is not None:
        return decide_gemm(sw, node, site)
    if node.op_type == "Attention":
        return plan_attention(sw, node)
    if any(t in sw.maps for t in node.inputs):
        return _carry(sw, node)
    return Outcome()


def plan_padding(graph: Graph, value: Values, backend: PadBackend, options: Options
                 ) -> PaddingPlan:
    """Decide padding for every node of ``graph`` (in its topological order); the backend
    records each decision as it is made and applies the returned plan."""
    maps: dict[str, ChannelMap] = {}
    done = set(graph.inputs) | {t for t, info in graph.tensors.items()
                                if info.kind != "activation"}
    sw = SweepState(graph, value, backend, options, MappingProxyType(maps), done)
    steps: list[Step] = []
    padded: list[str] = []
    slices: list[PadSlice] = []
    pads: list[PerCallPad] = []
    carried = 0
    for node in graph.nodes:
        out = _case(sw, node)
        steps += out.steps
        maps.update(out.maps)
        slices += out.slices
        pads += out.pads
        padded += out.padded
        carried += out.carried
        for d in out.decided:
            backend.decide(d.node, d.detail, d.reason, applied=d.applied)
        done.update(node.outputs)
    outs = [t for t in dict.fromkeys(graph.outputs) if t in maps]
    if outs:
        slices += cut(sw, None, "graph output", outs).slices
    logger.info("padding plan: %d nodes padded, %d carried, %d slices, %d per-call pads",
                len(padded), carried, len(slices), len(pads))
    return PaddingPlan(tuple(steps), MappingProxyType(maps), tuple(padded), carried,
                       tuple(slices), tuple(pads))
