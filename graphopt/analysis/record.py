"""The typed, frozen record of what analysis learned about one node."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from graphopt.analysis.kernel_class import KernelClass

__all__ = ["NodeAnalysis"]


@dataclass(frozen=True, slots=True)
class NodeAnalysis:
    """Kernel class, dims and work of one node.

    ``flops`` counts multiply and add separately (a GEMM is 2*M*N*K). ``bytes_read`` and
    ``bytes_written`` count each distinct tensor once at its dtype's width: what one un-fused
    kernel must move through DRAM. ``pattern`` names the multi-node pattern the node belongs to
    (``"rmsnorm:3"``: pattern and instance); its ``dims`` are then the pattern's dims.

    A control-flow node (``If``/``Loop``/``Scan``) runs kernels of its own: ``branches`` holds
    the analyses of each body's nodes (an ``If``'s two branches, a loop's one body), run
    ``trips`` times; the roofline costs every body node and takes the slowest branch
    (:mod:`graphopt.analysis.control_flow`).
    """

    kernel_class: KernelClass
    dims: Mapping[str, int]
    flops: int
    bytes_read: int
    bytes_written: int
    param_count: int
    dtype: str | None
    pattern: str | None = None
    flags: tuple[str, ...] = ()
    #: the node's canonical op type (``Node.op_type``): a calibrated CPU profile charges each
    #: op type its own measured fixed cost
    op_type: str | None = None
    branches: tuple[tuple[NodeAnalysis, ...], ...] = ()
    trips: int = 1

    @property
    def bytes_total(self) -> int:
        return self.bytes_read + self.bytes_written

    @property
    def no_work(self) -> bool:
        """Every output has zero elements: no kernel runs (metrics convention 6)."""
        return "empty_output" in self.flags

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per byte of DRAM traffic (0 for nodes that move nothing)."""
        return self.flops / self.bytes_total if self.bytes_total else 0.0

    def to_json(self) -> dict[str, Any]:
        """The analysis as the plan report writes a control-flow body's node (a plan node's
        own analysis is written flat into its record, under the same keys)."""
        return {"op_type": self.op_type, "kernel_class": self.kernel_class.value,
                "dims": dict(self.dims), "dtype": self.dtype, "flops": self.flops,
                "bytes_read": self.bytes_read, "bytes_written": self.bytes_written,
                "params": self.param_count, "pattern": self.pattern, "flags": list(self.flags),
                **({} if not self.branches else {
                    "branches": [[b.to_json() for b in body] for body in self.branches],
                    "trips": self.trips})}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> NodeAnalysis:
        """The analysis in a plan report's node record (or a body's, :meth:`to_json`)."""
        return cls(kernel_class=KernelClass(d["kernel_class"]), dims=dict(d["dims"]),
                   flops=d["flops"], bytes_read=d["bytes_read"],
                   bytes_written=d["bytes_written"], param_count=d["params"], dtype=d["dtype"],
                   pattern=d["pattern"], flags=tuple(d["flags"]), op_type=d.get("op_type"),
                   branches=tuple(tuple(cls.from_json(b) for b in body)
                                  for body in d.get("branches", ())),
                   trips=d.get("trips", 1))
