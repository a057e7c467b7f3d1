"""The rewrites ``optimize`` would apply, decided on the plan before any backend runs.

Two structural rewrites are decided here for a plan, its target and the user's options:

1. Layout (:func:`graphopt.decisions.layout.channels_last.decide_layout`): decided once per run, at
   the compute dtype of the backend that will run the model, with the host facts the caller passes
   in (:class:`HostFacts`). The torch backend converts the fx regions it says; the ONNX backend
   turns it into session options. Named exception: the ONNX backend's compute dtype is
   ``precision.format.onnx_precision`` (bf16 becomes fp16 on GPUs, fp32 on the CPU EP), so an
   ONNX run decides at that dtype; on GPUs fp16 and bf16 give the same answer (same tensor
   cores, same size), and on a CPU ORT picks its own conv layout anyway (``ort_session``
   case 1).
2. Padding (:func:`graphopt.decisions.padding.plan_padding`), as a dry run for
   :func:`graphopt.plan`: the same decision the backend's padding pass makes, over the plan's
   graph as the backend's padding pass would read it (the torch backend folds BatchNorm and
   drops dropout first: the dry run does too, and shows those decisions), with the backend's
   own answer to "can I edit this node" and its constant values. ``optimize`` decides again
   on the graph it rewrites; its report is what was applied.

:func:`with_rewrites` puts both on the plan: ``padding``/``padding_carry``/``padding_slice``
and ``layout`` decisions per node, and a ``rewrites`` section with the model-level summary.
The decisions say what optimize would do (``applied``: it would), not what a file holds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from graphopt.analysis.record import NodeAnalysis
from graphopt.decisions.layout.channels_last import LayoutPlan, decide_layout
from graphopt.decisions.padding import PadBackend, Values, plan_padding
from graphopt.hardware.profile import HardwareProfile
from graphopt.ir.decision_details import Detail
from graphopt.ir.graph import Graph
from graphopt.ir.options import Options
from graphopt.ir.plan import Decision, NodePlan, Plan
from graphopt.ir.plan_sections import PaddingSummary, RewritesPlan
from graphopt.ir.shape_range import bind

__all__ = ["DryRunContext", "HostFacts", "PaddingView", "decide_run_layout", "record_each_conv",
           "with_rewrites"]


@dataclass(frozen=True)
class HostFacts:
    """What the machine running the backend adds to a decision (inputs, never looked up here).

    ``onednn``: the torch build has oneDNN, whose NCHW reorders are what channels_last saves on
    a CPU (without it CPU convs gain nothing from NHWC).
    """

    onednn: bool = True


def decide_run_layout(plan: Plan, options: Options, compute_dtype: str,
                      host: HostFacts = HostFacts()) -> LayoutPlan:
    """The layout decision of one run (case 1 of the module doc): the one call both backends
    and the dry run make."""
    return decide_layout(plan, plan.target, compute_dtype, options.layout, onednn=host.onednn)


@dataclass
class DryRunContext:
    """A pass context with no model to edit: decisions are collected, not applied."""

    plan: Plan
    compute_dtype: str
    decisions: dict[str, dict[str, Decision]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._by_name = {n.name: n for n in self.plan.nodes}

    @property
    def target(self) -> HardwareProfile:
        return self.plan.target

    def plan_node(self, name: str) -> NodePlan | None:
        return self._by_name.get(name)

    def analysis(self, name: str) -> NodeAnalysis | None:
        node = self._by_name.get(name)
        return None if node is None else node.analysis

    def decide(self, node: Any, detail: Detail, reason: str, *,
               applied: bool = True) -> Decision:
        """Record ``detail``'s kind for ``node`` (a name, or a backend's node with a
        ``name``)."""
        d = Decision(reason, detail, applied)
        self.decisions.setdefault(getattr(node, "name", node), {})[detail.KIND] = d
        return d


@dataclass(frozen=True)
class PaddingView:
    """What a backend tells the padding decision about a model it has not been given yet: its
    legality per node, the model's small constant values, and the graph its padding pass
    would read where the passes before it change the plan's (``None``: the plan's graph)."""

    backend: PadBackend
    values: Values
    graph: Graph | None = None


def _padding(graph: Graph, options: Options, ctx: DryRunContext,
             view: Callable[[DryRunContext], PaddingView | None]) -> PaddingSummary:
    v = view(ctx)  # before the mode: the passes before padding run whatever it is
    if options.pad == "never":
        return PaddingSummary.not_decided("never", "pad='never'")
    if v is None:
        return PaddingSummary.not_decided(
            options.pad, "no backend can rewrite this model's graph (it was traced by make_fx, "
            "not captured by torch.export: optimize refuses it)")
    at = v.graph or graph
    if graph.shape_range:  # decided at the range's opt point, like the plan
        at = bind(at, graph.shape_range.values("opt"))
    return plan_padding(at, v.values, v.backend, options).notes(options.pad, ctx.compute_dtype)


def record_each_conv(ctx: DryRunContext, layout: LayoutPlan) -> None:
    """A backend that converts each conv as decided (the torch backend's regions)."""
    for name, d in layout.convs.items():
        ctx.decide(name, d.detail(), d.reason, applied=d.channels_last)


def with_rewrites(plan: Plan, graph: Graph, options: Options, compute_dtype: str,
                  view: Callable[[DryRunContext], PaddingView | None], *,
                  host: HostFacts = HostFacts(),
                  record_layout: Callable[[DryRunContext, LayoutPlan], None] = record_each_conv
                  ) -> Plan:
    """``plan`` with the padding and layout decisions ``optimize`` would make with ``options``
    at ``compute_dtype`` (module doc), per node and in the ``rewrites`` section.
    ``record_layout``: how the backend records each conv's layout as it would run it."""
    ctx = DryRunContext(plan, compute_dtype)
    padding = _padding(graph, options, ctx, view)
    layout = decide_run_layout(plan, options, compute_dtype, host)
    record_layout(ctx, layout)
    nodes = tuple(replace(n, decisions={**n.decisions, **ctx.decisions[n.name]})
                  if n.name in ctx.decisions else n for n in plan.nodes)
    section = RewritesPlan(compute_dtype, padding, layout.summary(),
                           "what graphopt.optimize would apply with these options; optimize "
                           "decides padding again on the graph it rewrites, and its report "
                           "says what was applied")
    return replace(plan, nodes=nodes, rewrites=section)
