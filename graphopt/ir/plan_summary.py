"""The plan's model and summary sections as typed records (the report's ``model`` and
``summary`` objects, key for key)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from graphopt.ir.graph import TensorInfo
from graphopt.ir.plan_sections import FusionKind
from graphopt.ir.records import Record, optional

__all__ = ["CostlyKernel", "CostlyNode", "ModelInfo", "Prediction", "Summary", "TensorSpec"]


@dataclass(frozen=True)
class TensorSpec(Record):
    """A model input or output: its name, shape (ints, or names of free dims) and dtype."""

    name: str
    shape: tuple[int | str, ...] | None
    dtype: str | None

    @classmethod
    def of(cls, t: TensorInfo) -> TensorSpec:
        return cls(t.name, None if t.shape is None else tuple(t.shape), t.dtype)


@dataclass(frozen=True)
class ModelInfo(Record):
    """What was planned: the model's name, where it came from, its size and its signature."""

    name: str
    source: str
    num_nodes: int
    param_count: int
    param_bytes: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.outputs]


@dataclass(frozen=True)
class CostlyNode(Record):
    """One of the costliest nodes by its own (unfused) estimate, and its share of the total."""

    name: str
    kernel_class: str
    est_time_s: float
    share: float


@dataclass(frozen=True)
class CostlyKernel(Record):
    """One of the costliest kernels as they run: a fusion group (or a node alone) at its fused
    time, named by its nodes, beside the unfused sum of its nodes."""

    kernel: str
    name: str
    nodes: tuple[str, ...]
    kind: FusionKind
    fused: bool
    kernel_class: str
    est_time_s: float
    unfused_s: float
    share: float


@dataclass(frozen=True)
class Prediction(Record):
    """How the cost model's estimates compare with a profiled run (``graphopt.profile``)."""

    spearman: float | None
    median_ratio: float | None
    model_ratio: float | None
    nodes_measured: int
    measured_model_s: float
    measured_nodes_s: float
    runs: int
    warmup: int
    threads: int | None
    method: str
    module_ratio: float | None = optional()
    measured_module_s: float | None = optional()


@dataclass(frozen=True)
class Summary(Record):
    """The plan's totals: time, work, bottleneck mix, kernel classes and costliest nodes.

    ``est_latency_s`` sums every node's unfused estimate; ``est_latency_fused_s`` is the same
    model as its kernels run (fusion groups), present once fusion is planned.
    """

    est_latency_s: float
    total_flops: int
    total_bytes: int
    node_count: int
    kernel_count: int
    bottleneck_mix: Mapping[str, int]
    time_by_bottleneck_s: Mapping[str, float]
    kernel_class_counts: Mapping[str, int]
    time_by_kernel_class_s: Mapping[str, float]
    patterns: Mapping[str, int]
    costliest_nodes: tuple[CostlyNode, ...]
    unsupported_ops: Mapping[str, int]
    flagged_nodes: Mapping[str, int]
    est_latency_with_decisions_s: float | None = optional()
    predicted_speedup: float | None = optional()
    est_latency_fused_s: float | None = optional()
    prediction: Prediction | None = optional()
    #: the ranking by what runs (fusion groups at their fused times), once fusion is planned
    costliest_kernels: tuple[CostlyKernel, ...] | None = optional()
