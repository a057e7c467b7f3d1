"""The record every hardware target is described by; the tables live in gpus.py and cpus.py."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["HardwareProfile", "Link"]


@dataclass(frozen=True, slots=True)
class Link:
    """A data path between two devices (or device and host): per-direction bandwidth and latency."""

    name: str  # e.g. "pcie4-x16", "nvlink4"
    bandwidth_bytes_per_s: float
    latency_s: float

    def transfer_time_s(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.bandwidth_bytes_per_s

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
                "latency_s": self.latency_s}


@dataclass(frozen=True, slots=True)
class HardwareProfile:
    """Datasheet facts of one target.

    ``peak_flops`` maps a dtype key (``fp64 fp32 tf32 fp16 bf16 fp8 int8 int4 fp4``) to the dense
    peak in FLOP/s (OP/s for integers) on the fastest unit that runs it: tensor cores on GPUs
    for tf32/fp16/bf16/fp8/int8/fp4, CUDA cores for fp32 (fp64 on tensor cores where they
    exist). A dtype missing from the map is
    not run natively. ``vector_flops`` are the non-tensor-core rates a kernel falls back to.
    """

    name: str
    display_name: str
    kind: Literal["gpu", "cpu"]
    vendor: str
    generation: str
    peak_flops: Mapping[str, float]
    memory_bytes: int
    bandwidth_bytes_per_s: float
    host_link: Link
    source: str
    compute_capability: tuple[int, int] | None = None
    sm_count: int | None = None
    cores: int | None = None
    vector_flops: Mapping[str, float] = field(default_factory=dict)
    l2_bytes: int | None = None  # GPUs: L2; CPUs: the last-level cache
    smem_per_sm_bytes: int | None = None
    peer_link: Link | None = None
    capabilities: frozenset[str] = frozenset()
    launch_overhead_s: float = 5e-6
    #: measured on this machine by ``graphopt calibrate`` (empty for datasheet profiles): a
    #: node's fixed cost per canonical op type (dispatch + launch; a view's too), and the
    #: achievable rates that replace peak x efficiency: ``"memory"`` (bytes/s) and
    #: ``"matrix:<dtype>"`` / ``"vector:<dtype>"`` (FLOP/s)
    op_overhead_s: Mapping[str, float] = field(default_factory=dict)
    measured_rates: Mapping[str, float] = field(default_factory=dict)

    @property
    def is_gpu(self) -> bool:
        return self.kind == "gpu"

    def has(self, capability: str) -> bool:
        return capability in self.capabilities

    def to_dict(self) -> dict[str, Any]:
        """The fields ``graphopt targets --json`` prints, in a stable order."""
        cc = self.compute_capability
        return {
            "name": self.name,
            "display_name": self.display_name,
            "kind": self.kind,
            "vendor": self.vendor,
            "generation": self.generation,
            "compute_capability": None if cc is None else f"{cc[0]}.{cc[1]}",
            "sm_count": self.sm_count,
            "cores": self.cores,
            "memory_bytes": self.memory_bytes,
            "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
            "peak_flops": dict(sorted(self.peak_flops.items())),
            "vector_flops": dict(sorted(self.vector_flops.items())),
            "l2_bytes": self.l2_bytes,
            "smem_per_sm_bytes": self.smem_per_sm_bytes,
            "host_link": self.host_link.to_dict(),
            "peer_link": None if self.peer_link is None else self.peer_link.to_dict(),
            "capabilities": sorted(self.capabilities),
            "launch_overhead_s": self.launch_overhead_s,
            **({"op_overhead_s": dict(sorted(self.op_overhead_s.items())),
                "measured_rates": dict(sorted(self.measured_rates.items()))}
               if self.op_overhead_s or self.measured_rates else {}),
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> HardwareProfile:
        """The profile a :meth:`to_dict` record (a plan report's ``target``) was written from."""
        cc = d["compute_capability"]
        peer = d["peer_link"]
        return cls(
            name=d["name"], display_name=d["display_name"], kind=d["kind"], vendor=d["vendor"],
            generation=d["generation"], peak_flops=dict(d["peak_flops"]),
            memory_bytes=d["memory_bytes"], bandwidth_bytes_per_s=d["bandwidth_bytes_per_s"],
            host_link=Link(**d["host_link"]), source=d["source"],
            compute_capability=None if cc is None else tuple(int(x) for x in cc.split(".")),
            sm_count=d["sm_count"], cores=d["cores"], vector_flops=dict(d["vector_flops"]),
            l2_bytes=d["l2_bytes"], smem_per_sm_bytes=d["smem_per_sm_bytes"],
            peer_link=None if peer is None else Link(**peer),
            capabilities=frozenset(d["capabilities"]),
            launch_overhead_s=d["launch_overhead_s"],
            op_overhead_s=dict(d.get("op_overhead_s", {})),
            measured_rates=dict(d.get("measured_rates", {})))

    @property
    def calibrated(self) -> bool:
        """Measured on a machine by ``graphopt calibrate``, not taken from a datasheet."""
        return bool(self.op_overhead_s or self.measured_rates)
