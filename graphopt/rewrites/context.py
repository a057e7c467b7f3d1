"""What every torch rewrite pass reads (plan, target, options) and writes (decisions)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import fx

from graphopt.analysis.record import NodeAnalysis
from graphopt.errors import GraphoptError
from graphopt.hardware.profile import HardwareProfile
from graphopt.plan import Decision, Plan
from graphopt.plan import NodePlan as PlanNode

__all__ = ["OptimizeOptions", "RewriteContext", "TorchPass"]

Precision = Literal["auto", "fp32", "tf32", "bf16", "fp16"]
PadMode = Literal["auto", "always", "never"]
LayoutMode = Literal["auto", "channels_last", "keep"]

_CHOICES = {"precision": ("auto", "fp32", "tf32", "bf16", "fp16"),
            "pad": ("auto", "always", "never"),
            "layout": ("auto", "channels_last", "keep"),
            "quantize": ("auto", "int8", "none")}


@dataclass(frozen=True)
class OptimizeOptions:
    """User options of ``graphopt.optimize``; validated on construction."""

    precision: Precision = "auto"
    pad: PadMode = "auto"
    layout: LayoutMode = "auto"
    #: dynamic INT8 Linear on the host CPU: "auto" where the cost model says it pays
    quantize: Literal["auto", "int8", "none"] = "auto"
    #: padding must be predicted at least this much faster (Inductor's pad_mm uses 1.1x)
    pad_margin: float = 1.1
    #: time each auto-decided pass on this machine and revert it if slower; None = only when
    #: the target is this machine's CPU (the only case where the measurement means anything)
    measure: bool | None = None

    def __post_init__(self) -> None:
        for name, allowed in _CHOICES.items():
            value = getattr(self, name)
            if value not in allowed:
                raise GraphoptError(f"{name}={value!r} is not an option",
                                    f"use one of: {', '.join(allowed)}")


@dataclass
class RewriteContext:
    """Shared state of one ``optimize`` run.

    ``plan`` was built from the same trace the passes rewrite, so a plan node and an fx node
    with the same name are the same op. Passes record every decision, applied or not, with a
    reason; the report shows them per node.
    """

    plan: Plan
    target: HardwareProfile
    options: OptimizeOptions
    example_inputs: tuple[Any, ...]
    decisions: dict[str, dict[str, Decision]] = field(default_factory=dict)
    #: model-level facts passes want in the report (e.g. layout conversions inserted)
    notes: dict[str, Any] = field(default_factory=dict)
    #: the precision the precision pass chose for the whole model ("fp32", "bf16", ...)
    compute_dtype: str = "fp32"

    def __post_init__(self) -> None:
        self._by_name = {n.name: n for n in self.plan.nodes}

    def analysis(self, node: fx.Node | str) -> NodeAnalysis | None:
        name = node if isinstance(node, str) else node.name
        plan_node = self._by_name.get(name)
        return None if plan_node is None else plan_node.analysis

    def plan_node(self, node: fx.Node | str) -> PlanNode | None:
        return self._by_name.get(node if isinstance(node, str) else node.name)

    def est_time_s(self, node: fx.Node | str) -> float:
        name = node if isinstance(node, str) else node.name
        plan_node = self._by_name.get(name)
        return 0.0 if plan_node is None else plan_node.cost.est_time_s

    def decide(self, node: fx.Node | str, kind: str, reason: str, *, applied: bool = True,
               **fields: Any) -> Decision:
        name = node if isinstance(node, str) else node.name
        d = Decision(reason=reason, fields=fields, applied=applied)
        self.decisions.setdefault(name, {})[kind] = d
        return d


#: a pass rewrites ``gm`` in place (the pipeline owns a private copy) and says if it changed it
TorchPass = Callable[[fx.GraphModule, RewriteContext], bool]


def torch_dtype(name: str) -> torch.dtype:
    return {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
            "fp16": torch.float16}[name]
