"""The plan: one frozen record per node (analysis + cost + decisions) and the model summary.

Emitters read only these records. ``Plan.to_dict()`` is the JSON report (schema below); the
same model and target always give the same dict, so the JSON bytes are deterministic.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from graphopt._version import __version__
from graphopt.analysis.record import NodeAnalysis
from graphopt.cost.roofline import NodeCost
from graphopt.hardware.profile import HardwareProfile
from graphopt.ir.graph import TensorInfo
from graphopt.report.emitters import ReportEmitters

__all__ = ["SCHEMA_VERSION", "Decision", "NodePlan", "Plan", "PlanSet", "mark_reverted"]

#: version of the JSON report layout; bump on incompatible changes
SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True)
class Decision:
    """One decision about a node (padding, layout, precision, exec_path, device) and why.

    ``fields`` hold the decision's own data (e.g. ``{"format": "bf16"}``); the reason is
    required, including for decisions *not* to change anything.
    """

    reason: str
    fields: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    applied: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {**self.fields, "applied": self.applied, "reason": self.reason}




def mark_reverted(saved: Mapping[str, Mapping[str, Decision]],
                  now: Mapping[str, Mapping[str, Decision]],
                  reason: str) -> dict[str, dict[str, Decision]]:
    """The decisions from before a reverted pass, plus the ones it applied, marked not applied
    with why (a reverted pass's reasons stay visible in the report)."""
    out = {k: dict(v) for k, v in saved.items()}
    for node, decisions in now.items():
        for kind, d in decisions.items():
            if saved.get(node, {}).get(kind) is not d and d.applied:
                out.setdefault(node, {})[kind] = replace(d, applied=False,
                                                         reason=f"{reason} ({d.reason})")
    return out


@dataclass(frozen=True, slots=True)
class NodePlan:
    """Everything graphopt knows and decided about one node."""

    name: str
    op: str  # as the model spells it
    op_type: str  # canonical
    analysis: NodeAnalysis
    cost: NodeCost
    inputs: tuple[TensorInfo | None, ...]
    outputs: tuple[TensorInfo | None, ...]
    decisions: Mapping[str, Decision] = field(default_factory=lambda: MappingProxyType({}))
    #: for a plan over a shape range: {"min"|"opt"|"max": {dims, est_time_s, bottleneck,
    #: flops, bytes}} (``graphopt.decisions.range_plan``); None for a plan at one shape. The JSON
    #: report's per-node ``range`` holds min and max (opt is the node's own fields)
    at_points: Mapping[str, Mapping[str, Any]] | None = None
    #: this node's measured time on the target (``graphopt.profile``: the median over the
    #: profiled runs); None when not measured, and then absent from the JSON
    measured_s: float | None = None

    def to_dict(self, fusion_group: str | None = None) -> dict[str, Any]:
        """The node's JSON record; ``fusion_group``: the id of the kernel it runs in (the plan's
        ``fusion`` section), given by :meth:`Plan.to_dict` where the plan has one."""
        a, c = self.analysis, self.cost
        return {
            "name": self.name,
            "op": self.op,
            "op_type": self.op_type,
            "kernel_class": a.kernel_class.value,
            "dims": dict(a.dims),
            "dtype": a.dtype,
            "flops": a.flops,
            "bytes": a.bytes_total,
            "bytes_read": a.bytes_read,
            "bytes_written": a.bytes_written,
            "arithmetic_intensity": round(a.arithmetic_intensity, 6),
            "params": a.param_count,
            "pattern": a.pattern,
            **({} if fusion_group is None else {"fusion_group": fusion_group}),
            "flags": list(a.flags),
            "bottleneck": c.bottleneck,
            "est_time_s": c.est_time_s,
            **({} if self.measured_s is None else {"measured_s": self.measured_s}),
            "compute_time_s": c.compute_time_s,
            "memory_time_s": c.memory_time_s,
            "peak_flops_used": c.peak_flops_used,
            "cost": {"unit": c.unit, "precision": c.precision,
                     "alignment_efficiency": c.alignment_efficiency,
                     "utilization": c.utilization, "note": c.note},
            "inputs": [_tensor_dict(t) for t in self.inputs],
            "outputs": [_tensor_dict(t) for t in self.outputs],
            "decisions": {k: d.to_dict() for k, d in sorted(self.decisions.items())},
            # opt is the node's own fields above: the JSON gives min and max only
            **({} if self.at_points is None else
               {"range": {p: dict(v) for p, v in self.at_points.items() if p != "opt"}}),
        }


def _tensor_dict(t: TensorInfo | None) -> dict[str, Any] | None:
    return None if t is None else t.to_dict()


@dataclass(frozen=True, slots=True)
class Plan(ReportEmitters):
    """A model planned for one target."""

    model: Mapping[str, Any]
    target: HardwareProfile
    nodes: tuple[NodePlan, ...]
    summary: Mapping[str, Any]
    warnings: tuple[str, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    #: the files the model was read from (not in the report): :meth:`save` never writes them
    inputs: tuple[str, ...] = field(default=(), compare=False)

    @property
    def input_files(self) -> tuple[str, ...]:
        return self.inputs

    def with_decisions(self, decisions: Mapping[str, Mapping[str, Decision]]) -> Plan:
        """This plan with ``decisions`` (node -> kind -> Decision) over the planner's: what a
        backend's passes applied or declined overrides what the planner would do."""
        return replace(self, nodes=tuple(
            replace(n, decisions={**n.decisions, **decisions.get(n.name, {})})
            for n in self.nodes))

    def node(self, name: str) -> NodePlan:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    @property
    def est_latency_s(self) -> float:
        return float(self.summary["est_latency_s"])

    def to_dict(self) -> dict[str, Any]:
        fusion = self.extra.get("fusion")
        group_of = fusion.get("group_of", {}) if isinstance(fusion, Mapping) else {}
        return {
            "schema_version": SCHEMA_VERSION,
            "graphopt_version": __version__,
            "model": dict(self.model),
            "target": self.target.to_dict(),
            "summary": dict(self.summary),
            "warnings": list(self.warnings),
            **{k: v for k, v in sorted(self.extra.items())},
            "nodes": [n.to_dict(group_of.get(n.name)) for n in self.nodes],
        }


@dataclass(frozen=True, slots=True)
class PlanSet(ReportEmitters):
    """The same model planned for several targets, reported side by side."""

    plans: tuple[Plan, ...]

    @property
    def input_files(self) -> tuple[str, ...]:
        return tuple(f for p in self.plans for f in p.inputs)

    def __getitem__(self, target_name: str) -> Plan:
        for p in self.plans:
            if p.target.name == target_name:
                return p
        raise KeyError(target_name)

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "plans": [p.to_dict() for p in self.plans]}
