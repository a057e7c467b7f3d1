"""The plan's ``partition`` and ``strategy`` sections as typed records (the report's objects,
key for key): where each node runs and when, and which split strategy won and why.

Why in ``ir``: the plan holds them; ``graphopt.partition`` fills them (``Partition.to_record``,
``tp_attach``, ``strategies.run_strategy``). The ``tensor_parallel`` section's records are in
:mod:`graphopt.ir.plan_parallel`.

Each strategy's ``notes`` differ in their keys, and some keys are null by value (a pipeline
with no bottleneck has no throughput), so each strategy has its own notes record and the
section holds one of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from graphopt.ir.records import Record, optional

__all__ = ["CollectiveRow", "DeviceRow", "HeftNotes", "PartitionNotes", "PartitionPlan",
           "PipelineNotes", "ScheduleRow", "SplitNotes", "Strategy", "StrategyCandidate",
           "StrategyChoice", "TensorNotes", "TransferRow", "TwoDNotes"]


class Strategy(StrEnum):
    """A split strategy (its value is the report's and ``--strategy``'s)."""

    HEFT = "heft"
    PIPELINE = "pipeline"
    TENSOR = "tensor"
    TWO_D = "2d"
    AUTO = "auto"  # requested only: compare them all
    GIVEN = "given"  # an assignment the caller gave (``evaluate_assignment``), not searched


@dataclass(frozen=True)
class DeviceRow(Record):
    """One device of the split: its memory, what the split puts there and its busy time
    (``collective_s``: its time in collectives, under tensor parallelism only)."""

    name: str
    target: str
    memory_bytes: int
    memory_used_bytes: int
    busy_s: float
    collective_s: float | None = optional()


@dataclass(frozen=True)
class ScheduleRow(Record):
    """A node on a device, from ``start_s`` to ``finish_s`` (the Gantt chart's bar)."""

    node: str
    device: str
    start_s: float
    finish_s: float


@dataclass(frozen=True)
class TransferRow(Record):
    """A tensor crossing from ``src`` to ``dst``."""

    tensor: str
    src: str
    dst: str
    bytes: int
    start_s: float
    finish_s: float


@dataclass(frozen=True)
class CollectiveRow(Record):
    """A collective on the timeline (``devices``: the group it runs on, on the partition
    timeline; ``stage``: its 2-D stage)."""

    kind: str
    after: str
    bytes: int
    start_s: float
    finish_s: float
    devices: tuple[str, ...] | None = optional()
    stage: int | None = optional()


@dataclass(frozen=True)
class HeftNotes(Record):
    """How HEFT's schedule was found: the starts tried, the refinement, the greedy baseline."""

    chosen: str
    candidates_s: Mapping[str, float | None]
    refined_moves: int
    refinement: str
    greedy_makespan_s: float
    greedy_naive_total_s: float
    greedy_fits_memory: bool
    best_single_device_s: float | None
    link_model: str
    parameter_bytes: Mapping[str, int]
    usable_bytes: Mapping[str, int]
    transfer_bytes: int


@dataclass(frozen=True)
class PipelineNotes(Record):
    """A pipeline split's stage times and bottleneck."""

    stage_times_s: tuple[float, ...]
    bottleneck_s: float
    throughput_per_s: float | None
    makespan_is: str
    stage_memory_model: str
    parameter_bytes: Mapping[str, int]
    usable_bytes: Mapping[str, int]
    transfer_bytes: int


@dataclass(frozen=True)
class SplitNotes(Record):
    """A split's memory and copies alone: an assignment given, not searched, or an empty plan
    (``empty``)."""

    parameter_bytes: Mapping[str, int]
    usable_bytes: Mapping[str, int]
    transfer_bytes: int
    empty: bool | None = optional()


@dataclass(frozen=True)
class TensorNotes(Record):
    """The tensor-parallel timeline's: every device works on every node."""

    throughput_per_s: float
    makespan_is: str


@dataclass(frozen=True)
class TwoDNotes(Record):
    """A 2-D split's stage times and how its clock is modelled; ``stage_counts_tried``: the
    search over stage counts (absent for cuts given); ``planned_*``: before its cuts
    moved onto module boundaries; ``stage_layers``/``uneven``: once on module boundaries;
    ``makespan_is``: on the partition timeline only."""

    stage_times_s: tuple[float, ...]
    bottleneck_s: float
    throughput_per_s: float | None
    latency_is: str
    throughput_is: str
    transfer_model: str
    #: stage count -> the best bottleneck at that count (None: no split fits), as searched
    stage_counts_tried: Mapping[str, float | None] | None = optional()
    planned_latency_s: float | None = optional()
    planned_bottleneck_s: float | None = optional()
    stage_layers: tuple[tuple[int, int], ...] | None = optional()
    uneven: str | None = optional()
    makespan_is: str | None = optional()


#: a ``partition`` section's notes: one record per strategy, since their keys differ
PartitionNotes = HeftNotes | PipelineNotes | SplitNotes | TensorNotes | TwoDNotes


@dataclass(frozen=True)
class PartitionPlan(Record):
    """The report's ``partition`` section: the timeline of the winning split (HEFT, pipeline,
    or every device of a tensor-parallel or 2-D split, with its ``collectives``)."""

    strategy: Strategy
    makespan_s: float
    devices: tuple[DeviceRow, ...]
    schedule: tuple[ScheduleRow, ...]
    transfers: tuple[TransferRow, ...]
    stages: tuple[tuple[str, ...], ...]
    stage_devices: tuple[str, ...]
    notes: PartitionNotes
    collectives: tuple[CollectiveRow, ...] | None = optional()


@dataclass(frozen=True)
class StrategyCandidate(Record):
    """One strategy on the common clock; ``why_not``: why it could not run; ``not_emitted``:
    why graphopt cannot emit this costed plan (None when it can)."""

    strategy: Strategy
    latency_s: float | None
    throughput_per_s: float | None
    feasible: bool
    emittable: bool
    not_emitted: str | None
    why_not: str | None
    detail: str


@dataclass(frozen=True)
class StrategyChoice(Record):
    """The report's ``strategy`` section: what was asked, what won, by what and why, over
    which NVLink groups, and every candidate's numbers."""

    requested: Strategy
    winner: Strategy
    sequence_parallel: bool
    picked_by: str
    why: str
    groups: tuple[tuple[str, ...], ...]
    candidates: tuple[StrategyCandidate, ...]
