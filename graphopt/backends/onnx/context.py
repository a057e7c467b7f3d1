"""What every ONNX-level rewrite reads (plan, target, options, calibration) and records.

ONNX passes are functional (TVM style): ``pass_(model, ctx) -> ModelProto | None`` returns a new
model, or None when nothing applies; the input model is never modified. Node names in ``ctx.plan``
are the names the ONNX frontend gave (it writes them into its copy of the model, so they match
``ctx.plan`` one to one).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from graphopt.decisions.layout.channels_last import LayoutPlan
from graphopt.decisions.rewrites import decide_run_layout
from graphopt.hardware.profile import HardwareProfile
from graphopt.ir.decision_details import Detail
from graphopt.ir.graph import Graph
from graphopt.ir.options import Options
from graphopt.ir.plan import Decision, NodePlan, Plan

__all__ = ["OnnxContext", "OnnxPass"]

@dataclass
class OnnxContext:
    """Shared state of one ONNX optimize run."""

    plan: Plan
    target: HardwareProfile
    options: Options
    #: sample inputs (name -> array), the first used by the guard; calibration data for static
    #: INT8 when the user gave it (None otherwise)
    samples: list[dict[str, np.ndarray]]
    calibration: list[dict[str, np.ndarray]] | None = None
    compute_dtype: str = "fp32"
    decisions: dict[str, dict[str, Decision]] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)
    #: graphopt's IR of the model the passes start from (its ``source_model``), sized at the
    #: plan's opt point: a pass handed that very model reads it instead of converting it again
    graph: Graph | None = None
    #: symbolic dim -> size at the plan's opt point (empty without a shape range): a pass
    #: that converts a model itself sizes its graph with these
    dim_values: dict[str, int] = field(default_factory=dict)
    #: the run's layout decision, made once with the run's compute dtype when the context is
    #: made (``decisions.rewrites.decide_run_layout``); the session pass follows it
    layout: LayoutPlan | None = None

    def __post_init__(self) -> None:
        self._by_name = {n.name: n for n in self.plan.nodes}
        if self.layout is None:
            self.layout = decide_run_layout(self.plan, self.options, self.compute_dtype)

    def plan_node(self, name: str) -> NodePlan | None:
        return self._by_name.get(name)

    def decide(self, node: str, detail: Detail, reason: str, *,
               applied: bool = True) -> Decision:
        """Record ``detail``'s kind of decision for ``node``."""
        d = Decision(reason, detail, applied)
        self.decisions.setdefault(node, {})[detail.KIND] = d
        return d


#: an exact ONNX pass (``pass_driver.Pass.run``): the rewritten model, or None when it changed
#: nothing (lossy passes take an ``exclude`` set too: ``guard.LossyPass``)
OnnxPass = Callable[[onnx.ModelProto, OnnxContext], "onnx.ModelProto | None"]
