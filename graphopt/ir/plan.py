"""The plan: one frozen record per node (analysis + cost + decisions) and the model summary.

Emitters read only these records. ``Plan.to_dict()`` is the JSON report (schema below); the
same model and target always give the same dict, so the JSON bytes are deterministic.
"""

from __future__ import annotations

import functools
import json
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from graphopt._version import __version__
from graphopt.analysis.record import NodeAnalysis
from graphopt.cost.roofline import NodeCost
from graphopt.errors import GraphoptError
from graphopt.hardware.profile import HardwareProfile
from graphopt.ir.decision_details import Detail, read_detail
from graphopt.ir.graph import TensorInfo
from graphopt.ir.plan_deploy import DeployChoice
from graphopt.ir.plan_llm import LLMSection
from graphopt.ir.plan_memory import MemoryPlan, QuantizationPlan, RuntimeSettings
from graphopt.ir.plan_parallel import TensorParallelPlan, TwoDParallelPlan
from graphopt.ir.plan_partition import PartitionPlan, StrategyChoice
from graphopt.ir.plan_repr import plan_repr, plan_set_repr
from graphopt.ir.plan_run import OnnxExport, OnnxOptimization, TorchOptimization
from graphopt.ir.plan_sections import FusionPlan, RangePoints, RewritesPlan, ShapeRangePlan
from graphopt.ir.plan_summary import ModelInfo, Summary
from graphopt.ir.records import read_json, write_json
from graphopt.report.emitters import ReportEmitters

__all__ = ["SCHEMA_VERSION", "SECTIONS", "Decision", "NodePlan", "Plan", "PlanSet",
           "mark_reverted"]

#: version of the JSON report layout; bump on incompatible changes. 2: the sections are typed
#: records read back by ``Plan.from_json``; a node's cost holds its overhead and bandwidth, and
#: a control-flow node its bodies' analyses, so that the JSON holds the whole plan
SCHEMA_VERSION = 2

#: a node's fields that are its cost at its shape range's opt point (a
#: :class:`~graphopt.ir.plan_sections.PointCost`)
_POINT_KEYS = ("dims", "est_time_s", "bottleneck", "flops", "bytes")


@dataclass(frozen=True, slots=True)
class Decision:
    """One decision about a node (padding, layout, precision, exec_path, device) and why.

    ``detail`` is the decision's own data, a record of its kind
    (:mod:`graphopt.ir.decision_details`); the reason is required, including for decisions
    *not* to change anything.
    """

    reason: str
    detail: Detail
    applied: bool = True

    @property
    def kind(self) -> str:
        """Its key among a node's decisions."""
        return self.detail.KIND

    def to_dict(self) -> dict[str, Any]:
        return {**self.detail.to_json(), "applied": self.applied, "reason": self.reason}

    @classmethod
    def from_json(cls, kind: str, d: Mapping[str, Any], path: str = "") -> Decision:
        """The ``kind`` decision a :meth:`to_dict` object was written from."""
        data = {k: v for k, v in d.items() if k not in ("applied", "reason")}
        return cls(d["reason"], read_detail(kind, data, path), d["applied"])


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
    #: for a plan over a shape range: its dims and cost at min, opt and max
    #: (``graphopt.decisions.range_plan``); None for a plan at one shape. The JSON report's
    #: per-node ``range`` holds min and max (opt is the node's own fields)
    at_points: RangePoints | None = None
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
                     "utilization": c.utilization, "note": c.note,
                     "overhead_s": c.overhead_s, "bandwidth_used": c.bandwidth_used},
            **({} if not a.branches else {"branches": [[b.to_json() for b in body]
                                                       for body in a.branches],
                                          "trips": a.trips}),
            "inputs": [_tensor_dict(t) for t in self.inputs],
            "outputs": [_tensor_dict(t) for t in self.outputs],
            "decisions": {k: d.to_dict() for k, d in sorted(self.decisions.items())},
            # opt is the node's own fields above: the JSON gives min and max only
            **({} if self.at_points is None else
               {"range": {"min": self.at_points.min.to_json(),
                          "max": self.at_points.max.to_json()}}),
        }


    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> NodePlan:
        """The node a :meth:`to_dict` record was written from."""
        analysis = NodeAnalysis.from_json({**d, "op_type": d["op_type"]})
        cost = d["cost"]
        points = d.get("range")
        at_points = None if points is None else read_json(  # opt is the node's own fields
            RangePoints, {**points, "opt": {k: d[k] for k in _POINT_KEYS}}, f"{d['name']}.range")
        return cls(
            name=d["name"], op=d["op"], op_type=d["op_type"], analysis=analysis,
            cost=NodeCost(est_time_s=d["est_time_s"], compute_time_s=d["compute_time_s"],
                          memory_time_s=d["memory_time_s"], overhead_s=cost["overhead_s"],
                          bottleneck=d["bottleneck"], peak_flops_used=d["peak_flops_used"],
                          bandwidth_used=cost["bandwidth_used"], unit=cost["unit"],
                          precision=cost["precision"],
                          alignment_efficiency=cost["alignment_efficiency"],
                          utilization=cost["utilization"], note=cost["note"]),
            inputs=tuple(_tensor(t) for t in d["inputs"]),
            outputs=tuple(_tensor(t) for t in d["outputs"]),
            decisions={k: Decision.from_json(k, v, f"nodes[{d['name']}].decisions.{k}")
                       for k, v in d["decisions"].items()},
            at_points=at_points, measured_s=d.get("measured_s"))


def _tensor_dict(t: TensorInfo | None) -> dict[str, Any] | None:
    """A tensor's JSON: its kind only when it is not an activation (weights, inputs)."""
    if t is None:
        return None
    return t.to_dict() if t.kind == "activation" else {**t.to_dict(), "kind": t.kind}


def _tensor(d: Mapping[str, Any] | None) -> TensorInfo | None:
    if d is None:
        return None
    shape = d["shape"]
    return TensorInfo(d["name"], None if shape is None else tuple(shape), d["dtype"],
                      d.get("kind", "activation"))


@dataclass(frozen=True, slots=True)
class Plan(ReportEmitters):
    """A model planned for one target: its nodes, its summary and one field per report section
    (None until the step that fills it has run; a section's JSON key is its field's name)."""

    model: ModelInfo
    target: HardwareProfile
    nodes: tuple[NodePlan, ...]
    summary: Summary
    warnings: tuple[str, ...] = ()
    fusion: FusionPlan | None = None
    memory: MemoryPlan | None = None
    quantization: QuantizationPlan | None = None
    runtime_settings: RuntimeSettings | None = None
    rewrites: RewritesPlan | None = None
    shape_range: ShapeRangePlan | None = None
    optimization: TorchOptimization | OnnxOptimization | None = None
    onnx_optimization: OnnxExport | None = None
    deploy: DeployChoice | None = None
    partition: PartitionPlan | None = None
    tensor_parallel: TensorParallelPlan | TwoDParallelPlan | None = None
    strategy: StrategyChoice | None = None
    llm: LLMSection | None = None
    #: the files the model was read from (not in the report): :meth:`save` never writes them
    inputs: tuple[str, ...] = field(default=(), compare=False)

    @property
    def input_files(self) -> tuple[str, ...]:
        return self.inputs

    def __repr__(self) -> str:  # the dataclass repr prints every node: ~60 kB for a small model
        return plan_repr(self)

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
        return float(self.summary.est_latency_s)

    def sections(self) -> dict[str, Any]:
        """The report sections this plan has, by JSON key."""
        return {name: value for name in SECTIONS if (value := getattr(self, name)) is not None}

    def to_dict(self) -> dict[str, Any]:
        group_of = self.fusion.group_of if self.fusion is not None else {}
        return {
            "schema_version": SCHEMA_VERSION,
            "graphopt_version": __version__,
            "model": self.model.to_json(),
            "target": self.target.to_dict(),
            "summary": self.summary.to_json(),
            "warnings": list(self.warnings),
            **{k: write_json(v) for k, v in sorted(self.sections().items())},
            "nodes": [n.to_dict(group_of.get(n.name)) for n in self.nodes],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | str) -> Plan:
        """The plan a report's JSON (:meth:`to_dict`, or its text) was written from."""
        return plan_from_json(cls, data)


#: the plan's report sections, in the order the steps fill them
SECTIONS = ("fusion", "memory", "quantization", "runtime_settings", "rewrites", "shape_range",
            "optimization", "onnx_optimization", "deploy", "partition", "tensor_parallel",
            "strategy", "llm")


@dataclass(frozen=True, slots=True)
class PlanSet(ReportEmitters):
    """The same model planned for several targets, reported side by side."""

    plans: tuple[Plan, ...]

    def __repr__(self) -> str:
        return plan_set_repr(self)

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

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | str) -> PlanSet:
        """The plans a multi-target report's JSON (:meth:`to_dict`, or its text) holds; a
        single plan's JSON gives a set of one."""
        if isinstance(data, str):
            data = json.loads(data)
        if not isinstance(data, Mapping) or "plans" not in data:
            return cls((Plan.from_json(data),))
        if data.get("schema_version") != SCHEMA_VERSION:
            plan_from_json(Plan, data)  # refuses the version by name
        plans = data["plans"]
        if not isinstance(plans, list):
            raise GraphoptError("plan JSON: 'plans' is not a list; give the JSON that graphopt "
                                "plan wrote for several targets")
        return cls(tuple(Plan.from_json(p) for p in plans))


def plan_from_json(cls: type[Plan], data: Mapping[str, Any] | str) -> Plan:
    """A :class:`Plan` from its report JSON; a report of another schema is refused by name."""
    if isinstance(data, str):
        data = json.loads(data)
    version = data.get("schema_version") if isinstance(data, Mapping) else None
    if version != SCHEMA_VERSION:
        raise GraphoptError(f"plan JSON: schema_version {version!r}, but this graphopt reads "
                            f"{SCHEMA_VERSION}; write the report again with this version")
    hints = _plan_hints()
    try:
        sections = {name: read_json(hints[name], data[name], name)
                    for name in SECTIONS if name in data}
        return cls(model=read_json(ModelInfo, data["model"], "model"),
                   target=HardwareProfile.from_dict(data["target"]),
                   nodes=tuple(NodePlan.from_json(n) for n in data["nodes"]),
                   summary=read_json(Summary, data["summary"], "summary"),
                   warnings=tuple(data["warnings"]), **sections)
    except (KeyError, TypeError, ValueError) as e:
        raise GraphoptError(f"plan JSON: not a graphopt plan report ({type(e).__name__}: "
                            f"{e}); give the JSON that graphopt plan/optimize wrote") from None


@functools.cache
def _plan_hints() -> dict[str, Any]:
    return typing.get_type_hints(Plan)
