"""The typed, frozen record of what analysis learned about one node."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

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
