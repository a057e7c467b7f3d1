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
from dataclasses import dataclass

from graphopt.analysis.kernel_class import GEMM_LIKE
from graphopt.decisions.memory_runtime.batch_advice import advise_batch
from graphopt.decisions.memory_runtime.footprint import PrecisionSpec, activation_peak, param_bytes
from graphopt.decisions.quant_formats import FORMAT_DTYPE
from graphopt.errors import GraphoptError
from graphopt.hardware.profile import HardwareProfile
from graphopt.ir.graph import DTYPE_BITS
from graphopt.ir.plan import Decision, Plan
from graphopt.ir.plan_memory import BreakdownRow, MemoryPlan

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
    weights = pbytes + cbytes
    required = weights + peak + ws
    rows = (("parameters", weights), ("activations (peak)", peak), ("workspace", ws),
            ("reserve", reserve), ("free", usable - required))
    return MemoryPlan(
        target=target.name, total_bytes=total, reserve_bytes=reserve,
        reserve_policy=policy.describe(), usable_bytes=usable, param_count=count,
        param_bytes=pbytes, constant_bytes=cbytes, param_format=label,
        fp32_param_bytes=fp32_bytes, saved_bytes=fp32_bytes - pbytes,
        compression_ratio=round(_ratio(fp32_bytes, pbytes), 4),
        activation_peak_bytes=peak, activation_total_bytes=act_total,
        activation_peak_per_sample_bytes=round(peak / max(1, batch), 1), peak_node=peak_node,
        traced_batch=batch, workspace_bytes=ws, workspace_reason=ws_reason,
        required_bytes=required, free_bytes=usable - required, fits=fits,
        max_batch_size=max_batch, batch_note=note,
        **({} if advice is None else advice.to_dict()),  # case 7, as the report rounds it
        breakdown=tuple(BreakdownRow(name, b, round(100.0 * b / max(1, total), 2))
                        for name, b in rows),
        notes=tuple(notes))


def _ratio(fp32_bytes: int, param_bytes: int) -> float:
    """How many times smaller the weights are than in fp32 (1.0 without weights)."""
    return fp32_bytes / param_bytes if param_bytes else 1.0


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
    for row in mp.breakdown:
        lines.append(f"| {row.component} | {row.bytes} | {_human(row.bytes)} | "
                     f"{row.percent:.2f} |")
    lines.append(f"| **total** | {mp.total_bytes} | {_human(mp.total_bytes)} | 100.00 |")
    advice = "" if mp.batch_advice is None else f" ({mp.batch_advice})"
    lines += ["", f"fits: {'yes' if mp.fits else 'no'}; max batch: {mp.max_batch_size} "
              f"({mp.batch_note}); recommended batch: {mp.batch}{advice}"
              f"; parameters {mp.param_format}: {_human(mp.param_bytes)} vs "
              f"{_human(mp.fp32_param_bytes)} in fp32 "
              f"(x{_ratio(mp.fp32_param_bytes, mp.param_bytes):.2f})"]
    return "\n".join(lines)
