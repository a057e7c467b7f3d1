"""The plan's fusion, rewrites and shape-range sections as typed records (the report's
``fusion``, ``rewrites`` and ``shape_range`` objects, key for key).

The planner fills ``fusion`` (:func:`graphopt.decisions.planner.with_fusion`, from
:mod:`graphopt.cost.fusion`), the dry run of the rewrites fills ``rewrites``
(:func:`graphopt.decisions.rewrites.with_rewrites`) and a plan over a shape range gets
``shape_range`` (:mod:`graphopt.decisions.range_plan`). The memory, quantization and runtime
sections are :mod:`graphopt.ir.plan_memory`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from graphopt.ir.records import Record, keyed, optional
from graphopt.ir.shape_range import DimRange, ShapeRange

__all__ = ["FusionKind", "FusionPlan", "FusionRuntime", "KernelGroup", "LayoutRegion",
           "LayoutSummary", "PadSlice", "PaddingSummary", "PerCallPad", "PointCost",
           "PointTimes", "RangePoints", "RewritesPlan", "ShapeRangePlan"]


class FusionKind(StrEnum):
    """What made a kernel (:mod:`graphopt.cost.fusion`'s cases)."""

    PATTERN = "pattern"  # a recognized pattern (attention, a norm, SwiGLU, RoPE): case 1
    EPILOGUE = "epilogue"  # a GEMM or conv with the pointwise ops after it: case 2
    POINTWISE = "pointwise"  # a pointwise chain with at most one reduction: case 3
    SINGLE = "single"  # one node alone: case 4
    ORT = "ort"  # a fusion ONNX Runtime's optimizer makes
    FOLDED = "folded"  # constant-folded by ONNX Runtime when the session starts


@dataclass(frozen=True, slots=True)
class FusionRuntime(Record):
    """Whose fusions the groups follow: graphopt's generic rules, or ONNX Runtime's for an
    execution provider."""

    name: str  # "generic" | "onnxruntime"
    execution_provider: str | None
    rules: str


@dataclass(frozen=True, slots=True)
class KernelGroup(Record):
    """One kernel of several nodes: its nodes in graph order, what made it and its cost (the
    fused time beside the sum of its nodes' own times, and the bytes crossing its boundary).
    An ONNX Runtime group names the op ORT makes and the transformers that made it."""

    id: str
    kind: FusionKind
    nodes: tuple[str, ...]
    est_time_s: float
    unfused_s: float
    external_bytes: int
    fused_op: str | None = optional()
    rules: tuple[str, ...] | None = optional()


@dataclass(frozen=True, slots=True)
class FusionPlan(Record):
    """The kernels a deploying runtime would launch: every multi-node group, each node's group
    id and the fused estimate beside the unfused one."""

    runtime: FusionRuntime
    est_latency_fused_s: float
    est_latency_unfused_s: float
    kernels_fused: int
    nodes: int
    group_of: Mapping[str, str]
    groups: tuple[KernelGroup, ...]


@dataclass(frozen=True, slots=True)
class PadSlice(Record):
    """Where a padded tensor is cut back to its real channels, and why."""

    node: str
    source: str
    real: int
    padded: int
    reason: str


@dataclass(frozen=True, slots=True)
class PerCallPad(Record):
    """An input a node pads on every call, from ``from_`` channels to ``to`` (JSON ``from``)."""

    node: str
    source: str
    from_: int = keyed("from")
    to: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PaddingSummary(Record):
    """The padding a run would apply: the nodes padded, the ops carried on padded channels,
    the slices and the per-call pads; or, when padding was not decided, only why
    (:meth:`not_decided`)."""

    mode: str
    compute_dtype: str | None = optional()
    padded_nodes: tuple[str, ...] | None = optional()
    carried: int | None = optional()
    slices: tuple[PadSlice, ...] | None = optional()
    per_call_pads: tuple[PerCallPad, ...] | None = optional()
    reason: str | None = optional()

    @classmethod
    def not_decided(cls, mode: str, reason: str) -> PaddingSummary:
        return cls(mode=mode, reason=reason)


@dataclass(frozen=True, slots=True)
class LayoutRegion(Record):
    """One connected region of convs and the predicted effect of converting it."""

    id: int
    convs: tuple[str, ...]
    gain_s: float  # NCHW time the region's convs save in channels_last
    cost_s: float  # time of the entry/exit conversions it still needs
    apply: bool
    reason: str


@dataclass(frozen=True, slots=True)
class LayoutSummary(Record):
    """The layout decision for the model (NHWC or not, and why) and per region."""

    mode: str
    nhwc: bool
    reason: str
    regions: tuple[LayoutRegion, ...]


@dataclass(frozen=True, slots=True)
class RewritesPlan(Record):
    """The padding and layout ``optimize`` would apply, decided at ``compute_dtype``."""

    compute_dtype: str
    padding: PaddingSummary
    layout: LayoutSummary
    note: str


@dataclass(frozen=True, slots=True)
class PointTimes(Record):
    """The model's estimate at each point of its shape range."""

    min: float
    opt: float
    max: float


@dataclass(frozen=True, slots=True)
class PointCost(Record):
    """A node's dims and cost at one point of the plan's shape range."""

    dims: Mapping[str, int]
    est_time_s: float
    bottleneck: str  # "compute" | "memory" | "latency"
    flops: int
    bytes: int


@dataclass(frozen=True, slots=True)
class RangePoints(Record):
    """A node at each point of its plan's shape range (:mod:`graphopt.decisions.range_plan`).
    The report's per-node ``range`` holds min and max: opt is the node's own fields."""

    min: PointCost
    opt: PointCost
    max: PointCost


@dataclass(frozen=True, slots=True)
class ShapeRangePlan(Record):
    """A plan over a shape range: the dynamic dims, where they sit in the inputs, the estimate
    at min, opt and max, and the multiples that keep tensor cores full (``hints``)."""

    dims: tuple[DimRange, ...]
    inputs: Mapping[str, tuple[int | str, ...]]
    est_latency_s: PointTimes
    hints: tuple[str, ...] | None = optional()

    @property
    def range(self) -> ShapeRange:
        return ShapeRange(self.dims, self.inputs)
