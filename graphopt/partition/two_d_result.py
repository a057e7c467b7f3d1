"""What a 2-D split costs (:func:`.two_d.two_d` fills it): its stages, each tensor-parallel over
its group, the request's clock and the report's dictionary.

Why apart: the search over cuts (:mod:`.two_d`) and the record it returns change for different
reasons; the record is what the report and :mod:`.tp_attach` read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from graphopt.partition.devices import DeviceSet
from graphopt.partition.result import ScheduledNode, Transfer
from graphopt.partition.tp_result import TensorParallel

__all__ = ["Stage2D", "TwoD"]


@dataclass(frozen=True)
class Stage2D:
    """One pipeline stage: plan nodes ``[first, end)`` split tensor-parallel over ``group``."""

    index: int
    group: tuple[str, ...]
    first: int
    end: int
    tp: TensorParallel
    send_bytes: int
    send_s: float

    @property
    def stage_s(self) -> float:
        """Compute, collectives and the outgoing transfer: what bounds the stream's rate."""
        return self.tp.makespan_s + self.send_s


@dataclass(frozen=True)
class TwoD:
    """A 2-D split: stages in order, each tensor-parallel over its group."""

    devices: DeviceSet
    groups: tuple[tuple[str, ...], ...]
    stages: tuple[Stage2D, ...]
    node_names: tuple[str, ...]
    latency_s: float
    bottleneck_s: float
    schedule: tuple[ScheduledNode, ...]
    transfers: tuple[Transfer, ...]
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def throughput_per_s(self) -> float:
        return 1.0 / self.bottleneck_s if self.bottleneck_s > 0 else 0.0

    def _per_device(self, attr: str) -> dict[str, Any]:
        out: dict[str, Any] = {d.name: 0 for d in self.devices.devices}
        for s in self.stages:
            out.update(getattr(s.tp, attr))
        return out

    @property
    def memory_used(self) -> dict[str, int]:
        return self._per_device("memory_used")

    @property
    def busy_s(self) -> dict[str, float]:
        return self._per_device("busy_s")

    @property
    def collective_s(self) -> dict[str, float]:
        return self._per_device("collective_s")

    @property
    def over(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.stages:
            out.update(s.tp.over)
        return out

    @property
    def feasible(self) -> bool:
        return not self.over

    def overflow_text(self) -> str:
        return "; ".join(s.tp.overflow_text() for s in self.stages if s.tp.over)

    def collectives(self) -> list[dict[str, Any]]:
        """Every stage's collectives on the request's clock, with the devices they run on."""
        out = []
        for s, start in zip(self.stages, self.stage_starts(), strict=True):
            out += [{"kind": str(c.kind), "after": c.after, "bytes": c.nbytes,
                     "start_s": start + c.start_s, "finish_s": start + c.finish_s,
                     "devices": list(s.group), "stage": s.index}
                    for c in s.tp.collectives]
        return out

    def stage_starts(self) -> list[float]:
        out, t = [], 0.0
        for s in self.stages:
            out.append(t)
            t += s.stage_s
        return out

    def to_dict(self) -> dict[str, Any]:
        """The report's ``tensor_parallel`` section for the 2-D case."""
        caps = {d.name: d.memory_bytes for d in self.devices.devices}
        group_of = {n: i for i, g in enumerate(self.groups) for n in g}
        rows = []
        for s in self.stages:
            for d in s.tp.devices.devices:
                rows.append({**d.to_dict(), "group": group_of[d.name], "stage": s.index,
                             "memory_used_bytes": s.tp.memory_used[d.name],
                             "param_bytes": s.tp.params[d.name],
                             "activation_bytes": s.tp.activations[d.name],
                             "busy_s": s.tp.busy_s[d.name],
                             "collective_s": s.tp.collective_s[d.name]})
        used = {r["name"] for r in rows}
        rows += [{**d.to_dict(), "group": group_of[d.name], "stage": None,
                  "memory_used_bytes": 0, "param_bytes": 0, "activation_bytes": 0,
                  "busy_s": 0.0, "collective_s": 0.0}
                 for d in self.devices.devices if d.name not in used]
        return {
            "strategy": "2d", "degree": max(s.tp.degree for s in self.stages),
            "groups": [list(g) for g in self.groups],
            "makespan_s": self.latency_s, "throughput_per_s": self.throughput_per_s,
            "bottleneck_s": self.bottleneck_s,
            "stages": [{"stage": s.index, "group": list(s.group),
                        "first": self.node_names[s.first], "last": self.node_names[s.end - 1],
                        "nodes": s.end - s.first, "compute_s": s.tp.makespan_s,
                        "collective_s": s.tp.makespan_s - s.tp.compute_s,
                        "send_bytes": s.send_bytes, "send_s": s.send_s, "stage_s": s.stage_s,
                        "link": None if s.tp.link is None else s.tp.link.to_dict()}
                       for s in self.stages],
            "devices": rows,
            "over": {k: v for k, v in self.over.items() if k in caps},
            "splits": [{**b.to_dict(), "stage": s.index} for s in self.stages
                       for b in s.tp.splits],
            "fallbacks": sorted({f for s in self.stages for f in s.tp.fallbacks}),
            "collectives": self.collectives(),
            "notes": dict(self.notes),
        }
