"""A simulated schedule -> the :class:`Partition` record the report and the emitters read."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from graphopt.partition.problem import Problem
from graphopt.partition.result import Partition, ScheduledNode, Transfer
from graphopt.partition.simulate import Sim

__all__ = ["human_bytes", "human_s", "to_partition"]


def human_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def human_s(s: float) -> str:
    if not math.isfinite(s):
        return str(s)
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(s) >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s * 1e9:.3g} ns"


def to_partition(pb: Problem, sim: Sim, strategy: str, reasons: Sequence[str],
                 notes: dict[str, Any], stages: tuple[tuple[str, ...], ...] = (),
                 stage_devices: tuple[str, ...] = ()) -> Partition:
    """Schedule rows in start order (the Gantt chart's), copies, memory and busy per device."""
    names = [d.name for d in pb.devices.devices]
    rows = sorted(range(pb.n), key=lambda v: (sim.start[v], sim.finish[v], v))
    schedule = tuple(ScheduledNode(pb.names[v], names[sim.assign[v]], sim.start[v],
                                   sim.finish[v], reasons[v]) for v in rows)
    transfers = tuple(Transfer(pb.t_names[t], names[s], names[d], pb.t_bytes[t], ts, te)
                      for t, s, d, ts, te in sorted(sim.transfers, key=lambda x: (x[3], x[4])))
    notes = {**notes,
             "parameter_bytes": {names[d]: sim.params[d] for d in range(pb.k)},
             "usable_bytes": {names[d]: pb.caps[d] for d in range(pb.k)},
             "transfer_bytes": sum(t.nbytes for t in transfers)}
    return Partition(
        strategy=strategy, devices=pb.devices, schedule=schedule, transfers=transfers,
        makespan_s=sim.makespan,
        memory_used={names[d]: sim.memory[d] for d in range(pb.k)},
        busy_s={names[d]: sim.busy[d] for d in range(pb.k)},
        stages=stages, stage_devices=stage_devices, notes=notes)
