"""The plan's memory, quantization and runtime sections as typed records (the report's
``memory``, ``quantization`` and ``runtime_settings`` objects, key for key).

The memory and runtime family (:mod:`graphopt.decisions.memory_runtime`) and the quantization
family (:mod:`graphopt.decisions.quantization`) build them; they live here, beside the plan, so
that the plan can hold them and a report can be read back into them. A value the JSON writes
rounded (a ratio, a percentage) is held as written, so that a plan read back equals the plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from graphopt.ir.records import Record, optional

__all__ = ["BreakdownRow", "MemoryPlan", "QuantCandidate", "QuantizationPlan", "RuntimeSettings",
           "Setting", "SettingValue"]

#: what a runtime knob is set to: a flag, a count, a mode's name, backends in order, or None
#: (leave PyTorch's current value alone)
SettingValue = bool | int | str | tuple[str, ...] | None


@dataclass(frozen=True, slots=True)
class Setting(Record):
    """One runtime knob: its value (``None`` = leave PyTorch's current value alone) and why."""

    value: SettingValue
    reason: str


@dataclass(frozen=True, slots=True)
class RuntimeSettings(Record):
    """Everything ``apply_runtime_settings`` sets, for one target and plan (the rules are
    :mod:`graphopt.decisions.memory_runtime.runtime`'s)."""

    target: str
    device: str  # "cuda" | "cpu"
    matmul_allow_tf32: Setting
    cudnn_allow_tf32: Setting
    float32_matmul_precision: Setting
    cudnn_benchmark: Setting
    cuda_alloc_conf: Setting
    sdpa_backends: Setting
    batch_size: Setting
    num_threads: Setting
    mkldnn_enabled: Setting
    #: advice for ``torch.compile(mode=...)`` (``decisions.compile_mode``); nothing applies it
    compile_mode: Setting = Setting("default", "no plan to choose from")


@dataclass(frozen=True, slots=True)
class QuantCandidate(Record):
    """One format considered for the model, with its size and why it was kept or not."""

    format: str
    bits_per_weight: float
    weight_bytes: int
    est_memory_bytes: int
    fits: bool
    eligible: bool
    native: bool
    note: str


@dataclass(frozen=True, slots=True, kw_only=True)
class QuantizationPlan(Record):
    """The model-level weight format for one target, the formats considered and why.

    A model without parameters has nothing to quantize: ``format`` is None, and only ``fits``
    and ``reason`` are set (:meth:`nothing_to_quantize`).
    """

    format: str | None
    display: str | None = optional()
    bits_per_weight: float | None = optional()
    weight_bytes: int | None = optional()
    est_memory_bytes: int | None = optional()
    usable_bytes: int | None = optional()
    fits: bool
    #: bytes over usable memory (0 when it fits)
    missing_bytes: int | None = optional()
    preference: str | None = optional()
    original_format: str | None = optional()
    reason: str
    alternatives: tuple[QuantCandidate, ...] | None = optional()

    @classmethod
    def nothing_to_quantize(cls, reason: str) -> QuantizationPlan:
        return cls(format=None, fits=True, reason=reason)


@dataclass(frozen=True, slots=True)
class BreakdownRow(Record):
    """One component of the target's memory (parameters, activations, workspace, reserve,
    free): its bytes and its percent of the total, rounded to 0.01 as the report writes it."""

    component: str
    bytes: int
    percent: float


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryPlan(Record):
    """Where the target's memory goes for one planned model (the cases are
    :mod:`graphopt.decisions.memory_runtime.memory`'s; ``memory_plan`` builds it).

    The batch advice (``recommended_batch_size`` to ``samples_per_s_at``) is there when the plan
    asked for it. ``compression_ratio``, ``activation_peak_per_sample_bytes`` and the
    breakdown's percents are the report's rounded numbers; :attr:`activation_peak_per_sample`
    is the exact one.
    """

    target: str
    total_bytes: int
    reserve_bytes: int
    reserve_policy: str
    usable_bytes: int
    param_count: int
    param_bytes: int
    constant_bytes: int
    param_format: str
    fp32_param_bytes: int
    saved_bytes: int
    compression_ratio: float
    activation_peak_bytes: int
    activation_total_bytes: int
    activation_peak_per_sample_bytes: float
    peak_node: str | None
    traced_batch: int
    workspace_bytes: int
    workspace_reason: str
    required_bytes: int
    free_bytes: int
    fits: bool
    max_batch_size: int
    batch_note: str
    recommended_batch_size: int | None = optional()
    #: "throughput" (the knee), "memory" (the maximum that fits) or a caller's ``limit_by``
    batch_decided_by: str | None = optional()
    batch_advice: str | None = optional()
    knee_fraction: float | None = optional()
    #: estimated samples/s by batch size (the keys are the sizes, as JSON spells them)
    samples_per_s_at: Mapping[str, float] | None = optional()
    breakdown: tuple[BreakdownRow, ...]
    notes: tuple[str, ...] = ()

    @property
    def weights_bytes(self) -> int:
        return self.param_bytes + self.constant_bytes

    @property
    def activation_peak_per_sample(self) -> float:
        return self.activation_peak_bytes / max(1, self.traced_batch)

    @property
    def batch(self) -> int:
        """The batch to run at: the recommended one, or the largest that fits without advice."""
        return (self.max_batch_size if self.recommended_batch_size is None
                else self.recommended_batch_size)
