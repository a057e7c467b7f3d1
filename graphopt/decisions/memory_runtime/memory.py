"""Memory plan of a model on a target: parameters, activation peak, workspace, reserve, max batch.

Cases the plan handles (comments refer back to them):

1-3. Parameters (once per unique tensor, at the chosen format) and the activation peak (from
   tensor lifetimes, views sharing storage): :mod:`graphopt.decisions.memory_runtime.footprint`.
4. Workspace: the largest per-kernel scratch buffer among GEMM-like nodes. GPU GEMMs use the
   cuBLAS workspace NVIDIA recommends, 32 MiB on Hopper and later, 4 MiB before [CUBLAS]; PyTorch
   allocates the same (ATen ``CUDABlas.cpp``, PR #120925). Convolutions are planned at the same
   size: cuDNN's implicit-GEMM algorithms need little or none, and PyTorch only tries algorithms
   whose workspace it can allocate, so larger workspaces are opportunistic, not required.
   CPUs: 0 (oneDNN/MKL scratchpads are small heap buffers, inside the CPU reserve).
5. Usable memory = total - reserve, reserve = max(floor, fraction x total) (``ReservePolicy``).
   GPU: max(1 GiB, 8 %). The floor covers the CUDA context with cuBLAS/cuDNN kernels loaded
   (several hundred MiB per process) on small cards; the fraction covers the caching
   allocator's fragmentation (2 MiB/20 MiB segment rounding) and framework buffers that grow with
   the card. 8 % of a 24 GB card is ~1.9 GiB, the ~2 GB the VRAM-sizing notes reserve; vLLM's
   default ``gpu_memory_utilization=0.9`` keeps 10 %. CPU: max(2 GiB, 10 %) for the OS, the
   Python interpreter with torch loaded and other processes that share host RAM.
6. Max batch = (usable - params - workspace) / (activation peak per sample), rounded DOWN to a
   multiple of 8 (the batch becomes GEMM M, and tensor cores want M % 8 == 0 for 16-bit types
   [DLPERF]). Fewer than 8 samples but at least 1: that count is returned unrounded and the note
   says so; 0 when not even one sample fits. Activations are assumed to scale linearly with the
   batch dimension of the traced inputs (other dims, e.g. sequence length, stay as traced).
7. Recommended batch: the knee of the plan's estimated samples/s over the batch, capped by the
   max batch of case 6 (:mod:`graphopt.decisions.memory_runtime.batch_advice`);
   ``batch_decided_by`` says which of the two set it.

Sources:
  [CUBLAS] NVIDIA cuBLAS API reference, ``cublasSetWorkspace``: recommended workspace 32 MiB for
           Hopper, 4 MiB for other architectures.
  [DLPERF] NVIDIA Deep Learning Performance Guide, "Matrix Multiplication Background":
           dimensions multiples of 8 for FP16 Tensor Cores.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from graphopt.analysis.kernel_class import GEMM_LIKE
from graphopt.decisions.memory_runtime.batch_advice import BatchAdvice, advise_batch
from graphopt.decisions.memory_runtime.footprint import PrecisionSpec, activation_peak, param_bytes
from graphopt.decisions.quant_formats import FORMAT_DTYPE
from graphopt.errors import GraphoptError
from graphopt.hardware.profile import HardwareProfile
from graphopt.ir.graph import DTYPE_BITS
from graphopt.ir.plan import Decision, Plan

__all__ = [
    "CPU_RESERVE",
    "GPU_RESERVE",
    "MemoryPlan",
    "ReservePolicy",
    "default_reserve_policy",
    "gemm_workspace_bytes",
    "max_batch_that_fits",
    "memory_plan",
    "render_breakdown",
    "usable_memory",
]

logger = logging.getLogger(__name__)

GIB = 2**30
MIB = 2**20
BATCH_MULTIPLE = 8  # case 6 [DLPERF]


@dataclass(frozen=True, slots=True)
class ReservePolicy:
    """reserve = max(floor_bytes, fraction x total): memory the model can never use (case 5)."""

    floor_bytes: int
    fraction: float
    why: str

    def reserve(self, total_bytes: int) -> int:
        return min(total_bytes, max(self.floor_bytes, int(self.fraction * total_bytes)))

    def describe(self) -> str:
        return f"max({self.floor_bytes / GIB:g} GiB, {self.fraction:.0%} of total): {self.why}"


GPU_RESERVE = ReservePolicy(1 * GIB, 0.08, "CUDA context + cuBLAS/cuDNN kernels, allocator "
                            "fragmentation and framework buffers")
CPU_RESERVE = ReservePolicy(2 * GIB, 0.10, "the OS, the Python/torch runtime and other processes "
                            "sharing host RAM")


def default_reserve_policy(target: HardwareProfile) -> ReservePolicy:
    return GPU_RESERVE if target.is_gpu else CPU_RESERVE


def usable_memory(target: HardwareProfile, policy: ReservePolicy | None = None) -> int:
    """Bytes a model may use on ``target``: total minus the reserve."""
    policy = policy or default_reserve_policy(target)
    return target.memory_bytes - policy.reserve(target.memory_bytes)


def gemm_workspace_bytes(target: HardwareProfile) -> tuple[int, str]:
    """Scratch buffer one GEMM/conv kernel needs on ``target`` (case 4), with its source."""
    if not target.is_gpu:
        return 0, "CPU GEMM scratchpads are small heap buffers inside the reserve"
    cc = target.compute_capability or (0, 0)
    if cc >= (9, 0):
        return 32 * MIB, "cuBLAS recommended workspace on Hopper and later: 32 MiB"
    return 4 * MIB, "cuBLAS recommended workspace before Hopper: 4 MiB"


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """Where the target's memory goes for one planned model; ``to_dict`` is the report section."""

    target: str
    total_bytes: int
    reserve_bytes: int
    usable_bytes: int
    reserve_policy: str
    param_count: int
    param_bytes: int
    constant_bytes: int
    param_format: str
    fp32_param_bytes: int
    activation_peak_bytes: int
    activation_total_bytes: int
    peak_node: str | None
    traced_batch: int
    workspace_bytes: int
    workspace_reason: str
    max_batch_size: int
    batch_note: str
    fits: bool
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: case 7; None when not asked for (``memory_plan(..., advise=False)``)
    advice: BatchAdvice | None = None

    @property
    def recommended_batch_size(self) -> int:
        return self.max_batch_size if self.advice is None else self.advice.recommended

    @property
    def weights_bytes(self) -> int:
        return self.param_bytes + self.constant_bytes

    @property
    def required_bytes(self) -> int:
        return self.weights_bytes + self.activation_peak_bytes + self.workspace_bytes

    @property
    def free_bytes(self) -> int:
        return self.usable_bytes - self.required_bytes

    @property
    def activation_peak_per_sample(self) -> float:
        return self.activation_peak_bytes / max(1, self.traced_batch)

    @property
    def saved_bytes(self) -> int:
        return self.fp32_param_bytes - self.param_bytes

    @property
    def compression_ratio(self) -> float:
        return self.fp32_param_bytes / self.param_bytes if self.param_bytes else 1.0

    def breakdown(self) -> list[tuple[str, int, float]]:
        """(component, bytes, % of total): parameters, activations, workspace, reserve, free."""
        rows = [("parameters", self.weights_bytes),
                ("activations (peak)", self.activation_peak_bytes),
                ("workspace", self.workspace_bytes),
                ("reserve", self.reserve_bytes),
                ("free", self.free_bytes)]
        total = max(1, self.total_bytes)
        return [(name, b, 100.0 * b / total) for name, b in rows]

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "total_bytes": self.total_bytes,
            "reserve_bytes": self.reserve_bytes,
            "reserve_policy": self.reserve_policy,
            "usable_bytes": self.usable_bytes,
            "param_count": self.param_count,
            "param_bytes": self.param_bytes,
            "constant_bytes": self.constant_bytes,
            "param_format": self.param_format,
            "fp32_param_bytes": self.fp32_param_bytes,
            "saved_bytes": self.saved_bytes,
            "compression_ratio": round(self.compression_ratio, 4),
            "activation_peak_bytes": self.activation_peak_bytes,
            "activation_total_bytes": self.activation_total_bytes,
            "activation_peak_per_sample_bytes": round(self.activation_peak_per_sample, 1),
            "peak_node": self.peak_node,
            "traced_batch": self.traced_batch,
            "workspace_bytes": self.workspace_bytes,
            "workspace_reason": self.workspace_reason,
            "required_bytes": self.required_bytes,
            "free_bytes": self.free_bytes,
            "fits": self.fits,
            "max_batch_size": self.max_batch_size,
            "batch_note": self.batch_note,
            **({} if self.advice is None else self.advice.to_dict()),
            "breakdown": [{"component": n, "bytes": b, "percent": round(p, 2)}
                          for n, b, p in self.breakdown()],
            "notes": list(self.notes),
        }


def _traced_batch(plan: Plan, batch_dim: int) -> int:
    """The inputs' static batch size: 0 only when every static one is 0 (1 when unknown)."""
    sizes = [int(shape[batch_dim]) for inp in plan.model.inputs
             if len(shape := inp.shape or ()) > batch_dim
             and isinstance(shape[batch_dim], int)]
    return next((b for b in sizes if b > 0), 0 if sizes else 1)


def _workspace(plan: Plan, target: HardwareProfile) -> tuple[int, str]:
    if not any(n.analysis.kernel_class in GEMM_LIKE for n in plan.nodes):
        return 0, "no GEMM or convolution nodes"
    return gemm_workspace_bytes(target)


def max_batch_that_fits(avail: int, per_sample: float) -> tuple[int, str]:
    """Case 6: the largest batch whose ``per_sample`` bytes fit in ``avail``, and why."""
    if avail <= 0:
        return 0, "the parameters and workspace alone exceed usable memory: not even batch 1"
    if per_sample <= 0:
        return 0, "no batch-dependent activations were found: batch size not limited by memory"
    raw = int(avail // per_sample)
    if raw >= BATCH_MULTIPLE:
        return raw - raw % BATCH_MULTIPLE, (f"{raw} samples fit; rounded down to a multiple of "
                                            f"{BATCH_MULTIPLE} for tensor-core M alignment")
    if raw >= 1:
        return raw, (f"only {raw} sample(s) fit: fewer than {BATCH_MULTIPLE}, so no "
                     "tensor-core-aligned batch; returned unrounded")
    return 0, "one sample's activations exceed the memory left: not even batch 1"


def memory_plan(plan: Plan, precision: PrecisionSpec = None, *, activation_dtype: str | None = None,
                batch_dim: int = 0, reserve_policy: ReservePolicy | None = None,
                advise: bool = True) -> MemoryPlan:
    """Memory breakdown of ``plan`` on its target.

    Args:
        precision: weight format for every node (``"bf16"``, ``"q4_k_m"``, bits like ``8``), or a
            mapping node name -> format / bits / precision ``Decision`` (nodes left out keep their
            dtype), or ``None`` for the traced dtypes. The formats a backend applied, e.g.
            ``{"linear_3": "fp8_e4m3", "linear_4": "int4"}``, give the artifact's memory plan
            (``plan_llm`` passes the formats it costs).
        activation_dtype: float activations re-sized to this dtype (``None``: as traced).
        batch_dim: the inputs' batch dimension, for the max-batch estimate.
        reserve_policy: override of the target's default reserve (module docstring, case 5).
        advise: recommend a batch at the throughput knee (case 7).
    """
    if batch_dim < 0:
        raise GraphoptError(f"batch_dim must be >= 0, got {batch_dim}", "pass the batch axis")
    if activation_dtype is not None and activation_dtype not in DTYPE_BITS:
        raise GraphoptError(f"unknown activation dtype {activation_dtype!r}",
                            f"use one of: {', '.join(k for k in DTYPE_BITS if k[0] in 'fb')}")
    target = plan.target
    policy = reserve_policy or default_reserve_policy(target)
    total = target.memory_bytes
    reserve = policy.reserve(total)
    usable = total - reserve
    count, pbytes, cbytes, fp32_bytes, label = param_bytes(plan, precision)
    peak, act_total, peak_node, unknown = activation_peak(plan, activation_dtype)
    ws, ws_reason = _workspace(plan, target)
    batch = _traced_batch(plan, batch_dim)
    if batch == 0:
        max_batch, note = 0, ("traced with a batch of 0: no per-sample activations to scale; "
                              "trace with a batch of 1 or more for a max batch size")
    else:
        max_batch, note = max_batch_that_fits(usable - pbytes - cbytes - ws, peak / batch)
    advice = None
    if advise and batch > 0:
        unlimited = max_batch == 0 and peak == 0 and usable - pbytes - cbytes - ws > 0
        advice = advise_batch(plan, max_batch, batch, memory_limited=not unlimited,
                              dtypes=_cost_dtypes(precision))
    notes = ["activations assumed to scale linearly with the batch dimension"]
    if unknown:
        notes.append(f"{unknown} tensors of unknown shape counted as one element")
    fits = pbytes + cbytes + peak + ws <= usable
    logger.info("memory plan on %s: params %d B, activation peak %d B (at %s), fits=%s, "
                "max batch %d", target.name, pbytes, peak, peak_node, fits, max_batch)
    return MemoryPlan(
        target=target.name, total_bytes=total, reserve_bytes=reserve, usable_bytes=usable,
        reserve_policy=policy.describe(), param_count=count, param_bytes=pbytes,
        constant_bytes=cbytes, param_format=label, fp32_param_bytes=fp32_bytes,
        activation_peak_bytes=peak, activation_total_bytes=act_total, peak_node=peak_node,
        traced_batch=batch, workspace_bytes=ws, workspace_reason=ws_reason,
        max_batch_size=max_batch, batch_note=note, fits=fits, notes=tuple(notes),
        advice=advice)


def _cost_dtypes(precision: PrecisionSpec) -> dict[str, str] | None:
    """Node -> the dtype the cost model runs it at, for the decided precisions (case 7)."""
    if not isinstance(precision, Mapping):
        return None

    out = {}
    for name, d in precision.items():
        fmt = d.detail.format if isinstance(d, Decision) else str(d)
        if fmt in FORMAT_DTYPE:
            out[name] = FORMAT_DTYPE[fmt]
    return out


def _human(n: float) -> str:
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def render_breakdown(mp: MemoryPlan) -> str:
    """The breakdown as a Markdown table (component, bytes, human size, % of total)."""
    lines = [f"Memory on {mp.target} ({_human(mp.total_bytes)}; reserve {mp.reserve_policy})",
             "",
             "| component | bytes | size | % of total |",
             "|---|---:|---:|---:|"]
    for name, b, pct in mp.breakdown():
        lines.append(f"| {name} | {b} | {_human(b)} | {pct:.2f} |")
    lines.append(f"| **total** | {mp.total_bytes} | {_human(mp.total_bytes)} | 100.00 |")
    lines += ["", f"fits: {'yes' if mp.fits else 'no'}; max batch: {mp.max_batch_size} "
              f"({mp.batch_note}); recommended batch: {mp.recommended_batch_size}"
              + ("" if mp.advice is None else f" ({mp.advice.reason})")
              + f"; parameters {mp.param_format}: {_human(mp.param_bytes)} vs "
              f"{_human(mp.fp32_param_bytes)} in fp32 (x{mp.compression_ratio:.2f})"]
    return "\n".join(lines)
