"""The result of splitting a model across devices: where each node runs and when."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from graphopt.ir.plan_partition import (
    DeviceRow,
    PartitionNotes,
    PartitionPlan,
    ScheduleRow,
    Strategy,
    TransferRow,
)
from graphopt.ir.records import read_json
from graphopt.partition.devices import DeviceSet
from graphopt.partition.tp_roles import Share

__all__ = ["Partition", "ScheduledNode", "Transfer"]


@dataclass(frozen=True, slots=True)
class ScheduledNode:
    """A node placed on a device with its estimated start and finish time (seconds).

    ``share``: under tensor parallelism, how much of the node each device of its group runs
    (the decision reads it here, never out of ``reason``); None for a node placed whole.
    """

    node: str
    device: str
    start_s: float
    finish_s: float
    reason: str
    share: Share | None = None

    def row(self, offset_s: float = 0.0) -> ScheduleRow:
        """The report's row (the Gantt chart's bar), ``offset_s`` later."""
        return ScheduleRow(self.node, self.device, self.start_s + offset_s,
                           self.finish_s + offset_s)


@dataclass(frozen=True, slots=True)
class Transfer:
    """A tensor crossing from one device to another."""

    tensor: str
    src_device: str
    dst_device: str
    nbytes: int
    start_s: float
    finish_s: float

    def row(self) -> TransferRow:
        return TransferRow(self.tensor, self.src_device, self.dst_device, self.nbytes,
                           self.start_s, self.finish_s)


@dataclass(frozen=True)
class Partition:
    """Assignment of every plan node to a device, with the schedule it implies.

    ``strategy`` is "heft" (list scheduling over the DAG) or "pipeline" (contiguous stages in
    execution order). For "pipeline", ``stages`` lists the node names of each stage in order
    and ``stage_devices`` the device of each stage.
    """

    strategy: str
    devices: DeviceSet
    schedule: tuple[ScheduledNode, ...]
    transfers: tuple[Transfer, ...]
    makespan_s: float
    memory_used: dict[str, int]
    busy_s: dict[str, float]
    stages: tuple[tuple[str, ...], ...] = ()
    stage_devices: tuple[str, ...] = ()
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def assignment(self) -> dict[str, str]:
        """Node name -> device name."""
        return {s.node: s.device for s in self.schedule}

    def to_record(self) -> PartitionPlan:
        """The report's ``partition`` section (the Gantt chart is drawn from ``schedule``)."""
        notes = read_json(PartitionNotes, self.notes, "partition.notes")
        return PartitionPlan(
            strategy=Strategy(self.strategy), makespan_s=self.makespan_s,
            devices=tuple(DeviceRow(d.name, d.profile.name, d.memory_bytes,
                                    self.memory_used.get(d.name, 0),
                                    self.busy_s.get(d.name, 0.0))
                          for d in self.devices.devices),
            schedule=tuple(s.row() for s in self.schedule),
            transfers=tuple(t.row() for t in self.transfers),
            stages=tuple(tuple(s) for s in self.stages),
            stage_devices=tuple(self.stage_devices), notes=notes)
