"""What a tensor-parallel split costs (:func:`.tensor_parallel.tensor_parallel` fills it): per
device memory, busy and collective time, each block's split, the collectives on the timeline
and the schedule, with the report's dictionary."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from graphopt.hardware.profile import Link
from graphopt.ir.plan_parallel import (
    BlockSplitRow,
    LinkRow,
    ParallelizePlan,
    ParallelizeUnavailable,
    TensorParallelPlan,
    TPDeviceRow,
    TPNotes,
)
from graphopt.ir.plan_partition import CollectiveRow, Strategy
from graphopt.partition.assemble import human_bytes
from graphopt.partition.devices import DeviceSet
from graphopt.partition.result import ScheduledNode
from graphopt.partition.tp_roles import BlockKind, CollectiveKind

__all__ = ["BlockSplit", "Collective", "TensorParallel"]


@dataclass(frozen=True, slots=True)
class BlockSplit:
    """How one block is split and what it costs per device."""

    block: str
    kind: BlockKind
    degree: int
    dims: Mapping[str, str]  # {"column": "N (heads)", "row": "K (heads)"}
    column: tuple[str, ...]
    row: tuple[str, ...]
    compute_s: float  # the block's nodes on the slowest device of the group
    unsplit_s: float  # the same nodes whole on the first device
    allreduce_bytes: int  # the bytes of its collective (an all-gather for the LM head)
    allreduce_s: float
    collective: CollectiveKind = CollectiveKind.ALL_REDUCE

    def to_row(self, stage: int | None = None) -> BlockSplitRow:
        """The report's row (``stage``: its 2-D stage)."""
        return BlockSplitRow(self.block, str(self.kind), self.degree, dict(self.dims),
                             self.column, self.row, self.compute_s, self.unsplit_s,
                             str(self.collective), self.allreduce_bytes, self.allreduce_s,
                             stage)


@dataclass(frozen=True, slots=True)
class Collective:
    """One collective on the timeline (case 4: an all-reduce after a row GEMM)."""

    kind: CollectiveKind
    after: str  # the node whose output it sums or gathers
    nbytes: int
    start_s: float
    finish_s: float

    def row(self, offset_s: float = 0.0, devices: tuple[str, ...] | None = None,
            stage: int | None = None) -> CollectiveRow:
        """The report's row, ``offset_s`` later (``devices``, ``stage``: on a timeline)."""
        return CollectiveRow(str(self.kind), self.after, self.nbytes, self.start_s + offset_s,
                             self.finish_s + offset_s, devices, stage)


@dataclass(frozen=True)
class TensorParallel:
    """A tensor-parallel split of a plan over a device group: memory, time, collectives."""

    degree: int
    devices: DeviceSet
    link: Link | None
    makespan_s: float
    compute_s: float  # the makespan less the collectives
    throughput_per_s: float
    throughput_overlapped_per_s: float
    memory_used: dict[str, int]
    params: dict[str, int]
    activations: dict[str, int]
    busy_s: dict[str, float]
    collective_s: dict[str, float]
    splits: tuple[BlockSplit, ...]
    fallbacks: tuple[str, ...]
    collectives: tuple[Collective, ...]
    schedule: tuple[ScheduledNode, ...]
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def over(self) -> dict[str, int]:
        """Device -> bytes over its usable memory (only devices that overflow)."""
        caps = {d.name: d.memory_bytes for d in self.devices.devices}
        return {k: v - caps[k] for k, v in self.memory_used.items() if v > caps[k]}

    @property
    def feasible(self) -> bool:
        return not self.over

    def overflow_text(self) -> str:
        """Which device overflows and by how much ("" when all fit)."""
        caps = {d.name: d.memory_bytes for d in self.devices.devices}
        return "; ".join(f"{k} needs {human_bytes(self.memory_used[k])} of "
                         f"{human_bytes(caps[k])} usable: {human_bytes(b)} over"
                         for k, b in self.over.items())

    def device_rows(self, group: int = 0) -> tuple[TPDeviceRow, ...]:
        return tuple(TPDeviceRow(d.name, d.profile.name, d.memory_bytes,
                                 self.memory_used[d.name], self.params[d.name],
                                 self.activations[d.name], self.busy_s[d.name],
                                 self.collective_s[d.name], group)
                     for d in self.devices.devices)

    def to_record(self, parallelize: ParallelizePlan | ParallelizeUnavailable
                  ) -> TensorParallelPlan:
        """The report's section: per device memory, busy and collective time; the splits;
        ``parallelize``: the ``parallelize_module`` plan for it (``tp_attach``)."""
        return TensorParallelPlan(
            strategy=Strategy.TENSOR, degree=self.degree, makespan_s=self.makespan_s,
            compute_s=self.compute_s, throughput_per_s=self.throughput_per_s,
            throughput_overlapped_per_s=self.throughput_overlapped_per_s,
            link=None if self.link is None else LinkRow(**self.link.to_dict()),
            devices=self.device_rows(), over=self.over,
            splits=tuple(s.to_row() for s in self.splits), fallbacks=tuple(self.fallbacks),
            collectives=tuple(c.row() for c in self.collectives),
            notes=TPNotes.from_json(self.notes),
            groups=(tuple(d.name for d in self.devices.devices),),
            parallelize_module=parallelize)
