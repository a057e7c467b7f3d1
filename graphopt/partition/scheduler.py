"""Whole-workload placement: which device serves each model, by graphopt's cost model.

Where :mod:`graphopt.partition` splits one model across devices, this places whole models
(workloads) on a :class:`DeviceSet`, as the schedulers of serving runtimes do. A workload's
time on a device is its plan's roofline estimate for that device's profile: the plan's own
``est_latency_s`` on the plan's target, else every node's analysis re-costed with
:func:`graphopt.cost.estimate` on the other profile (the same numbers ``graphopt plan`` would
give there). Utilization is ``latency * rate_hz`` summed over a device's workloads: the
fraction of each second the device is busy.

Policies (each placement says why):

1. ``round_robin``: the next device in order that has memory left for the workload.
2. ``load_balanced``: longest workload first, each to the device where it would finish
   earliest (busy time so far + its latency there): list scheduling for unequal devices.
3. ``priority``: highest priority first, each to the device where it finishes earliest, so
   the most important workload gets the fastest free device.
4. Auto-migration (``migrate_above``): while a device's utilization exceeds the threshold,
   move its workload that is cheapest to move (weights over the link, by
   :meth:`DeviceSet.transfer_time_s`) to the device left least utilized, if that lowers the
   peak; a move that would not is never made, so migration cannot ping-pong.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from graphopt.cost import estimate
from graphopt.errors import GraphoptError
from graphopt.hardware.profile import HardwareProfile
from graphopt.ir.plan import Plan, PlanSet
from graphopt.partition.devices import Device, DeviceSet

__all__ = ["Placement", "Policy", "Workload", "auto_migrate", "schedule_workloads",
           "utilization"]

logger = logging.getLogger(__name__)

Policy = Literal["round_robin", "load_balanced", "priority"]
POLICIES: tuple[str, ...] = ("round_robin", "load_balanced", "priority")


@dataclass(frozen=True, slots=True)
class Workload:
    """A model to serve: per-target latency (or plans to derive it), priority, request rate
    (runs per second) and the memory it holds on its device (its weights)."""

    name: str
    latency_s: Mapping[str, float] = field(default_factory=dict)
    priority: int = 0
    rate_hz: float = 1.0
    memory_bytes: int = 0
    plans: tuple[Plan, ...] = ()

    @classmethod
    def of(cls, name: str, source: Plan | PlanSet | Mapping[str, float], priority: int = 0,
           rate_hz: float = 1.0, memory_bytes: int | None = None) -> Workload:
        """From a plan, plans for several targets, or ``{target name: seconds}``."""
        if isinstance(source, Plan | PlanSet):
            plans = (source,) if isinstance(source, Plan) else source.plans
            mem = plans[0].model.param_bytes
            return cls(name, {p.target.name: p.est_latency_s for p in plans}, priority,
                       rate_hz, mem if memory_bytes is None else memory_bytes, plans)
        return cls(name, dict(source), priority, rate_hz, memory_bytes or 0)

    def latency_on(self, profile: HardwareProfile) -> float:
        """Seconds per run on ``profile``: planned, or re-costed from a plan's nodes."""
        if profile.name in self.latency_s:
            return float(self.latency_s[profile.name])
        if not self.plans:
            raise GraphoptError(f"workload {self.name!r} has no latency for {profile.name}",
                                f"give latency_s[{profile.name!r}] or a Plan to re-cost")

        return sum(estimate(n.analysis, profile).est_time_s for n in self.plans[0].nodes)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one workload runs, its time per run there, its share of the device, and why."""

    workload: str
    device: str
    latency_s: float
    utilization: float
    reason: str
    migrated_from: str | None = None


def _as_workload(item: Workload | tuple) -> Workload:
    return item if isinstance(item, Workload) else Workload.of(*item)


def utilization(placements: Iterable[Placement], devices: DeviceSet) -> dict[str, float]:
    """Fraction of each second every device is busy."""
    util = {d.name: 0.0 for d in devices.devices}
    for p in placements:
        util[p.device] += p.utilization
    return util


class _Ledger:
    """Busy time and memory per device as workloads are placed."""

    def __init__(self, devices: DeviceSet) -> None:
        self.devices = devices
        self.busy = {d.name: 0.0 for d in devices.devices}
        self.memory = {d.name: 0 for d in devices.devices}

    def fits(self, w: Workload, d: Device) -> bool:
        return self.memory[d.name] + w.memory_bytes <= d.memory_bytes

    def fitting(self, w: Workload) -> list[Device]:
        found = [d for d in self.devices.devices if self.fits(w, d)]
        if not found:
            raise GraphoptError(f"workload {w.name!r} ({w.memory_bytes / 2**30:.2f} GiB) fits "
                                "on no device with the memory left",
                                "add a device, or quantize the model to shrink it")
        return found

    def place(self, w: Workload, d: Device, reason: str) -> Placement:
        lat = w.latency_on(d.profile)
        self.busy[d.name] += lat * w.rate_hz
        self.memory[d.name] += w.memory_bytes
        logger.debug("placed %s on %s: %s", w.name, d.name, reason)
        return Placement(w.name, d.name, lat, lat * w.rate_hz, reason)

    def earliest_finish(self, w: Workload) -> tuple[Device, float]:
        options = [(self.busy[d.name] + w.latency_on(d.profile) * w.rate_hz, i, d)
                   for i, d in enumerate(self.fitting(w))]
        finish, _, best = min(options, key=lambda o: (o[0], o[1]))
        return best, finish


def schedule_workloads(workloads: Sequence[Workload | tuple], devices: DeviceSet,
                       policy: Policy = "load_balanced", *,
                       migrate_above: float | None = None) -> list[Placement]:
    """Place every workload on a device (cases 1-3); with ``migrate_above`` then rebalance
    (case 4). Returns one placement per workload, in the order given."""
    if policy not in POLICIES:
        raise GraphoptError(f"unknown scheduling policy {policy!r}",
                            f"use one of {', '.join(POLICIES)}")
    items = [_as_workload(w) for w in workloads]
    ledger = _Ledger(devices)
    placed: dict[str, Placement] = {}
    if policy == "round_robin":
        names = [d.name for d in devices.devices]
        nxt = 0
        for w in items:
            ok = {d.name for d in ledger.fitting(w)}
            k = next(k for k in range(len(names)) if names[(nxt + k) % len(names)] in ok)
            d = devices.devices[(nxt + k) % len(names)]
            skipped = f", skipped {k} without memory" if k else ""
            placed[w.name] = ledger.place(w, d, f"round robin: next device{skipped}")
            nxt = (nxt + k + 1) % len(names)
    else:
        if policy == "priority":
            order = sorted(items, key=lambda w: -w.priority)
        else:  # longest first: the big ones spread, small ones fill the gaps
            order = sorted(items, key=lambda w: -min(w.latency_on(d.profile) * w.rate_hz
                                                     for d in devices.devices))
        for w in order:
            d, finish = ledger.earliest_finish(w)
            why = f"priority {w.priority}" if policy == "priority" else "load balanced"
            placed[w.name] = ledger.place(
                w, d, f"{why}: least load after placing on {d.name} ({d.profile.name}), "
                      f"{finish:.1%} busy ({ledger.busy[d.name]:.1%} before)")
    result = [placed[w.name] for w in items]
    if migrate_above is not None:
        result = auto_migrate(result, items, devices, migrate_above)
    return result


def auto_migrate(placements: Sequence[Placement], workloads: Sequence[Workload | tuple],
                 devices: DeviceSet, threshold: float) -> list[Placement]:
    """Move workloads off devices above ``threshold`` utilization (case 4)."""
    by_name = {w.name: w for w in map(_as_workload, workloads)}
    dev = {d.name: d for d in devices.devices}
    current = {p.workload: p for p in placements}
    for _ in range(len(current) * len(dev)):  # each move lowers the peak; this bounds it
        util = utilization(current.values(), devices)
        src = max(util, key=lambda n: util[n])
        if util[src] <= threshold:
            break
        mem = {n: sum(by_name[p.workload].memory_bytes for p in current.values()
                      if p.device == n) for n in dev}
        moves = []
        for p in (p for p in current.values() if p.device == src):
            w = by_name[p.workload]
            for d in devices.devices:
                if d.name == src or mem[d.name] + w.memory_bytes > d.memory_bytes:
                    continue
                after = util[d.name] + w.latency_on(d.profile) * w.rate_hz
                if after < util[src]:  # the peak goes down: never a ping-pong
                    cost = devices.transfer_time_s(w.memory_bytes, src, d.name)
                    moves.append((cost, after, w.name, d))
        if not moves:
            logger.info("%s at %.0f%% > %.0f%%: no move lowers it", src, 100 * util[src],
                        100 * threshold)
            break
        cost, after, name, d = min(moves, key=lambda m: (m[0], m[1], m[2]))
        w = by_name[name]
        lat = w.latency_on(d.profile)
        current[name] = replace(
            current[name], device=d.name, latency_s=lat, utilization=lat * w.rate_hz,
            migrated_from=current[name].migrated_from or src,
            reason=f"migrated: {src} at {100 * util[src]:.0f}% > {100 * threshold:.0f}%; "
                   f"cheapest to move ({w.memory_bytes / 2**20:.1f} MiB, {cost * 1e3:.3g} ms) "
                   f"to {d.name}, now {100 * after:.0f}%")
        logger.info("%s", current[name].reason)
    return [current[p.workload] for p in placements]
