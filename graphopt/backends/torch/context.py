"""What every torch rewrite pass reads (plan, target, options) and writes (decisions)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from graphopt.analysis.record import NodeAnalysis
from graphopt.decisions.layout.channels_last import LayoutPlan
from graphopt.decisions.tolerance import Tolerance
from graphopt.hardware.profile import HardwareProfile
from graphopt.ir.decision_details import Detail
from graphopt.ir.options import Options
from graphopt.ir.plan import Decision, Plan
from graphopt.ir.plan import NodePlan as PlanNode

__all__ = ["RewriteContext", "TorchPass"]

@dataclass
class RewriteContext:
    """Shared state of one ``optimize`` run.

    ``plan`` was built from the same trace the passes rewrite, so a plan node and an fx node
    with the same name are the same op. Passes record every decision, applied or not, with a
    reason; the report shows them per node.
    """

    plan: Plan
    target: HardwareProfile
    options: Options
    example_inputs: tuple[Any, ...]
    decisions: dict[str, dict[str, Decision]] = field(default_factory=dict)
    #: model-level facts passes want in the report (e.g. layout conversions inserted)
    notes: dict[str, Any] = field(default_factory=dict)
    #: the precision the precision pass chose for the whole model ("fp32", "bf16", ...)
    compute_dtype: str = "fp32"
    #: the dynamic dims the module must accept (``graphopt.ir.shape_range.ShapeRange``), or None
    shape_range: Any = None
    #: the graph input name of each tensor in ``example_inputs``
    input_names: list[str] = field(default_factory=list)
    #: (point, dim sizes, inputs) at the range's min and max: every check runs there too
    range_points: list[tuple[str, dict[str, int], tuple[Any, ...]]] = field(
        default_factory=list)
    #: the run's layout decision (``decisions.rewrites.decide_run_layout``), made once before
    #: any pass at ``compute_dtype`` (``pipeline.decide_run``); the layout pass applies it
    layout: LayoutPlan | None = None
    #: (inputs, the original model's outputs on them), the example first: what a pass that
    #: checks itself (the quantize guard) measures against
    references: list[tuple[tuple[Any, ...], Any]] = field(default_factory=list)
    #: the budget of the pass now running (set by the pipeline before each pass)
    tolerance: Tolerance | None = None

    def __post_init__(self) -> None:
        self._by_name = {n.name: n for n in self.plan.nodes}

    def analysis(self, node: fx.Node | str) -> NodeAnalysis | None:
        name = node if isinstance(node, str) else node.name
        plan_node = self._by_name.get(name)
        return None if plan_node is None else plan_node.analysis

    def plan_node(self, node: fx.Node | str) -> PlanNode | None:
        return self._by_name.get(node if isinstance(node, str) else node.name)

    def decide(self, node: fx.Node | str, detail: Detail, reason: str, *,
               applied: bool = True) -> Decision:
        """Record ``detail``'s kind of decision for ``node``."""
        name = node if isinstance(node, str) else node.name
        d = Decision(reason, detail, applied)
        self.decisions.setdefault(name, {})[detail.KIND] = d
        return d


#: a torch pass (``pass_driver.Pass.run``) rewrites ``gm`` in place (the driver keeps a copy to
#: revert to) and says if it changed it
TorchPass = Callable[[fx.GraphModule, RewriteContext], bool]


def torch_dtype(name: str) -> torch.dtype:
    return {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
            "fp16": torch.float16}[name]
