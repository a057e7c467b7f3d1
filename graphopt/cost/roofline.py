"""Roofline cost of one node on one target.

time = max(FLOPs / achievable compute, bytes / achievable bandwidth) + launch overhead

Which compute peak applies:

1. GEMM-like classes (gemm, gemv, conv, attention, quantized GEMMs) run on the matrix unit for
   their dtype (tensor cores; AMX on CPUs with it) when the target has a peak for that dtype.
2. Tensor cores want 16-byte aligned K and N (8 fp16/bf16 elements, 4 tf32, 16 int8/fp8,
   32 fp4); M does not matter (it is not a leading dimension of a row-major operand).
   Misaligned rows are read with narrower loads, modelled by ``UNALIGNED_TC_EFFICIENCY``;
   Volta and Turing keep the tensor cores at 8-byte alignment and lose them below (CUDA-core
   rate). A conv's ``C_in`` is instead padded per filter tap by the conv library
   (:mod:`graphopt.cost.conv_taps`, which also charges tiny-C first layers); its ``C_out`` is
   aligned like N. Padding passes use :func:`tc_alignment` and this penalty to decide.
3. fp32 convolutions on sm_80+ use TF32 (cuDNN's default, ``torch.backends.cudnn.allow_tf32``);
   fp32 matmuls do not (``torch.backends.cuda.matmul.allow_tf32`` defaults to False).
4. Small GPU GEMMs do not fill every SM: utilization = tiles / (waves * SMs). Like cuBLAS's
   heuristics, the kernel is the best of a few CTA tiles (128x128, 128x64, 64x64; a smaller
   tile fills more SMs but reuses its operands less, ``_TILES``) and split-K (K cut into up to
   16 slices of >= 512 that run as more tiles, then summed): a skinny or deep-K GEMM
   (M = 128, K = 7168) is not left on 17 of 132 SMs. On tensor cores a tile's rows and columns
   beyond M and N are computed anyway (tile quantization, NVIDIA's "Matrix Multiplication
   Background" guide): a conv with 16 output channels fills a quarter of a 64-wide tile.
   Attention tiles its queries by 128 and splits the KV sequence when those tiles are too few
   (decode: ``attention.kv_splits``).
   The achievable fraction of the tensor-core peak is per GPU family and dtype, measured and
   cited in :mod:`graphopt.cost.efficiency`. An int8 GEMV with few outputs streams only on the
   SMs its row blocks occupy (:mod:`graphopt.cost.gemv`).
5. Everything else runs on vector units (CUDA cores, SIMD) and is usually memory-bound.
6. Free views cost nothing (no kernel); every other node pays the target's launch overhead.
7. A node whose outputs are all empty (``NodeAnalysis.no_work``) costs nothing either: torch and
   ONNX Runtime return before launching a kernel for zero elements.
8. Shape arithmetic (``Shape -> Gather -> Concat`` feeding a ``Reshape``, flagged by
   :mod:`graphopt.analysis.annotate`) is host work on a few integers: it costs nothing, so a
   dynamic-axes export costs what its static twin does.
9. A control-flow node (ONNX ``If``/``Loop``/``Scan``) costs the kernels of its bodies: each
   body node is estimated like any node, a branch is the sum of its nodes, and the node costs
   its slowest branch times its trips (:mod:`graphopt.analysis.control_flow`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from graphopt.analysis.kernel_class import GEMM_LIKE, KernelClass
from graphopt.analysis.record import NodeAnalysis
from graphopt.cost.attention import attention_kernel, kv_splits, query_tiles, scores_bytes
from graphopt.cost.calibrated import (
    fixed_cost,
    measured_bandwidth,
    measured_matrix_rate,
    view_cost,
)
from graphopt.cost.conv_taps import tap_efficiency
from graphopt.cost.efficiency import matrix_efficiency
from graphopt.cost.gemv import memory_parallelism
from graphopt.hardware.profile import HardwareProfile

__all__ = [
    "NodeCost",
    "UNALIGNED_TC_EFFICIENCY",
    "alignment_efficiency",
    "cost_key",
    "efficiency",
    "estimate",
    "estimate_all",
    "peak_key",
    "tc_alignment",
]

Bottleneck = Literal["compute", "memory", "latency"]

# Achievable fractions of the datasheet peaks. These are model parameters, not datasheet facts.
# GPU tensor cores take theirs per family and dtype from graphopt.cost.efficiency (measured,
# cited); ("gpu", "matrix") is the fallback for a family without a measurement and for GEMMs on
# CUDA cores. STREAM-like copies reach 80-90% of DRAM bandwidth; CPU oneDNN GEMMs about 70% of
# FMA peak. Elementwise kernels rarely approach compute peak (they are memory-bound anyway). The
# GPU memory fraction is fitted on benchmarks/calibration: its stream points (gpu-benches
# scale/triad on V100, A100 40/80 GB, H100 PCIe, H200) reach 0.78-0.92 of the datasheet
# bandwidth, and 0.85 gave the whole set's lowest median |ln(pred/meas)| (0.086; 0.8 gave 0.110).
_EFFICIENCY = {
    ("gpu", "matrix"): 0.75,
    ("gpu", "vector"): 0.5,
    ("gpu", "memory"): 0.85,
    ("cpu", "matrix"): 0.7,
    ("cpu", "vector"): 0.5,
    ("cpu", "memory"): 0.7,
}

# Efficiency of a tensor-core GEMM whose K/N rows are aligned to only this many bytes. A row
# aligned to b < 16 bytes is read with b-byte loads (no 16-byte cp.async on sm_80, no TMA on
# sm_90+, whose strides must be 16-byte multiples): each halving of the load width doubles the
# load instructions per byte. One parameter, the cost of a halving, sqrt(1 / 1.46) = 0.83,
# fitted on the published pair issue 12 quotes: H100 fp16 K = 10922 (4-byte rows, two halvings)
# measured 1.46x slower than K = 10944 (0.68 at 4 bytes; the old table said 0.35, i.e. 2.85x).
# DeepBench's V100 and T4 cuBLAS GEMMs with 8-byte-aligned N (9124x5124, benchmarks/calibration)
# are predicted within 1.00-1.15 with it, so Volta and Turing keep their tensor cores at 8 bytes
# (NVIDIA's "Matrix Multiplication Background" guide: cuBLAS before 11.0 wants multiples of 8
# for fp16; below 8 bytes graphopt keeps its old CUDA-core fallback there).
_HALVING = (1 / 1.46) ** 0.5
UNALIGNED_TC_EFFICIENCY = {b: round(_HALVING ** math.log2(16 / b), 2) for b in (16, 8, 4, 2, 1)}
#: Volta/Turing tensor cores need at least this row alignment (bytes)
_PRE_AMPERE_MIN_ALIGN = 8

_TC_DTYPES = frozenset({"tf32", "fp16", "bf16", "fp8", "int8", "int4", "fp4"})
_PEAK_KEY = {"fp64": "fp64", "fp32": "fp32", "tf32": "tf32", "fp16": "fp16", "bf16": "bf16",
             "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "fp8": "fp8", "int8": "int8",
             "uint8": "int8", "int4": "int4", "uint4": "int4", "fp4": "fp4"}
_GEMM_TILE = 128  # CTA tile edge of large cuBLAS/CUTLASS GEMM kernels
#: CTA tiles (M x N) the GEMM libraries choose among, with each one's throughput per SM
#: relative to 128x128: a smaller tile fills more SMs on a skinny problem but re-reads its
#: operands more often per FLOP. Fitted on benchmarks/calibration (GEMM + conv points,
#: ``bench_calibration.py``): split-K is what moves the set (median |ln(pred/meas)| 0.137 ->
#: 0.118); any tile efficiencies in [0.7, 1] x [0.5, 0.9] give the same median, so these keep
#: the operand-reuse order.
_TILES = {(128, 128): 1.0, (128, 64): 0.85, (64, 64): 0.7}
#: split-K: K cut into this many slices that run as separate tiles, then summed; a slice keeps
#: at least ``_MIN_SPLIT_K`` of K. The summing is not charged: the fit prefers 1.0 (0.9 gives
#: 0.125): stream-K and in-kernel reductions hide it.
_SPLITS = (1, 2, 4, 8, 16)
_MIN_SPLIT_K = 512
_SPLIT_K_EFFICIENCY = 1.0


def tc_alignment(peak: str) -> int:
    """Elements per 16 bytes: the K/N multiple tensor cores want for ``peak`` dtype."""
    bits = {"tf32": 32, "fp32": 32, "fp16": 16, "bf16": 16, "fp8": 8, "int8": 8, "int4": 4,
            "fp4": 4}.get(peak, 32)
    return 128 // bits


def efficiency(kind: str, unit: str) -> float:
    """Achievable fraction of peak for a device kind and unit ("matrix", "vector", "memory")."""
    return _EFFICIENCY[(kind, unit)]


def _matrix_fraction(a: NodeAnalysis, profile: HardwareProfile, key: str) -> float:
    """Achievable fraction of the matrix-unit peak: measured per GPU family and dtype."""
    if profile.is_gpu:
        return matrix_efficiency(profile, key, conv=a.kernel_class is KernelClass.CONV).fraction
    return efficiency(profile.kind, "matrix")


def peak_key(dtype: str | None) -> str:
    return _PEAK_KEY.get(dtype or "fp32", "fp32")


@dataclass(frozen=True, slots=True)
class NodeCost:
    """Estimated time of one node and why: which peak, which fraction of it, which bound."""

    est_time_s: float
    compute_time_s: float
    memory_time_s: float
    overhead_s: float
    bottleneck: Bottleneck
    peak_flops_used: float  # achievable FLOP/s after efficiency, alignment and utilization
    bandwidth_used: float
    unit: str  # "tensor_core" | "cuda_core" | "cpu_matrix" | "cpu_simd" | "none"
    precision: str  # peak-table key used, e.g. "bf16", "tf32"
    alignment_efficiency: float = 1.0
    utilization: float = 1.0
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"est_time_s": self.est_time_s, "compute_time_s": self.compute_time_s,
                "memory_time_s": self.memory_time_s, "overhead_s": self.overhead_s,
                "bottleneck": self.bottleneck, "peak_flops_used": self.peak_flops_used,
                "unit": self.unit, "precision": self.precision,
                "alignment_efficiency": self.alignment_efficiency,
                "utilization": self.utilization}


def _pow2_bytes(n: int, elem_bytes: float) -> int:
    """Largest power-of-two byte alignment (capped at 16) of a row of ``n`` elements."""
    nbytes = int(n * elem_bytes)
    if nbytes <= 0:
        return 16
    return min(16, nbytes & -nbytes)


def _aligned_dims(a: NodeAnalysis) -> list[int]:
    d = a.dims
    if a.kernel_class is KernelClass.CONV:  # C_in: padded per filter tap (conv_taps)
        return [d.get("C_out", 1) // max(1, d.get("groups", 1))]
    if a.kernel_class is KernelClass.ATTENTION:
        return [d.get("head_dim", 1)]
    return [d.get("K", 1), d.get("N", 1)]


def alignment_efficiency(a: NodeAnalysis, peak: str, profile: HardwareProfile) -> float | None:
    """Tensor-core efficiency for the node's dims; ``None`` if tensor cores are not usable."""
    elem_bytes = 128 // tc_alignment(peak) / 8
    aligned = min(_pow2_bytes(n, elem_bytes) for n in _aligned_dims(a))
    if aligned >= 16:
        return 1.0
    cc = profile.compute_capability
    if cc is not None and cc < (8, 0) and aligned < _PRE_AMPERE_MIN_ALIGN:
        return None  # Volta/Turing: below 8-byte rows, no tensor cores
    return UNALIGNED_TC_EFFICIENCY[aligned]


def _utilization(a: NodeAnalysis, profile: HardwareProfile, *, mma: bool = False) -> float:
    """Busy fraction of the SMs (rule 4); ``mma``: tensor-core tiles, whose unused rows and
    columns (M or N not a multiple of the tile) are computed anyway."""
    if not profile.is_gpu or not profile.sm_count or a.kernel_class not in GEMM_LIKE:
        return 1.0
    d = a.dims
    if a.kernel_class is KernelClass.ATTENTION:  # split-KV when the queries are few (decode)

        tiles = query_tiles(d)
        splits = kv_splits(tiles, profile.sm_count, math.ceil(d.get("seq_kv", 1) / _GEMM_TILE))
        return _wave_fill(tiles * splits, profile.sm_count)
    g = max(1, d.get("groups", 1))
    batch = 1 if a.kernel_class is KernelClass.CONV else d.get("batch", 1)  # conv M has N
    # conv: N counts every group's output channels, K is one group's already
    m, n, k = d.get("M", 1), max(1, d.get("N", 1) // g), max(1, d.get("K", 1))
    best = 0.0
    for (tm, tn), tile_eff in _TILES.items():
        base = math.ceil(m / tm) * math.ceil(n / tn) * g * batch
        filled = m * n / (math.ceil(m / tm) * tm * math.ceil(n / tn) * tn) if mma else 1.0
        for split in _SPLITS:
            if split > 1 and k // split < _MIN_SPLIT_K:
                break
            eff = tile_eff * filled * (1.0 if split == 1 else _SPLIT_K_EFFICIENCY)
            best = max(best, _wave_fill(base * split, profile.sm_count) * eff)
    return best


def _wave_fill(tiles: int, sms: int) -> float:
    """Fraction of the SMs busy over all waves: the last wave may run part-empty."""
    return tiles / (math.ceil(tiles / sms) * sms)


def _compute_rate(a: NodeAnalysis, profile: HardwareProfile, dtype: str | None
                  ) -> tuple[float, str, str, float, float, str]:
    """(achievable FLOP/s, unit, precision, alignment eff, utilization, note)."""
    key = peak_key(dtype)
    note = ""
    kind = profile.kind
    if a.kernel_class in GEMM_LIKE:
        if profile.is_gpu and key == "fp32" and a.kernel_class is KernelClass.CONV \
                and "tf32" in profile.peak_flops:
            key, note = "tf32", "fp32 conv runs as TF32 (cuDNN default allow_tf32=True)"
        if profile.is_gpu and key == "int4" and "int4" not in profile.peak_flops:
            key, note = "fp16", "4-bit weights are dequantized to fp16 for the matmul"
        if key in profile.peak_flops and (key in _TC_DTYPES or not profile.is_gpu):
            mma = profile.is_gpu and a.kernel_class is not KernelClass.GEMV
            util = _utilization(a, profile, mma=mma)
            align = alignment_efficiency(a, key, profile) if profile.is_gpu else 1.0
            if align is not None:
                unit = "tensor_core" if profile.is_gpu else (
                    "cpu_matrix" if key in ("bf16", "int8") and profile.has("amx_bf16")
                    else "cpu_simd")
                measured = measured_matrix_rate(a, profile, key)
                base = profile.peak_flops[key] * _matrix_fraction(a, profile, key) \
                    if measured is None else measured
                rate = base * align * util
                taps, why = tap_efficiency(a, profile, 128 // tc_alignment(key))
                if taps < 1.0:
                    rate *= taps
                    note = f"{note}; {why}" if note else why
                if a.kernel_class is KernelClass.ATTENTION and profile.is_gpu:
                    factor, why = attention_kernel(a, profile)
                    rate *= factor
                    note = f"{note}; {why}" if note else why
                return rate, unit, key, align, util, note
            note = (f"K/N not a multiple of {tc_alignment(key)}: no tensor cores on "
                    f"{profile.generation}")
    vector = profile.vector_flops.get(key) or profile.vector_flops.get("fp32") \
        or profile.peak_flops.get(key) or profile.peak_flops.get("fp32", 1e12)
    if key not in profile.vector_flops and key not in profile.peak_flops:
        key = "fp32"
    unit = "cuda_core" if profile.is_gpu else "cpu_simd"
    util = _utilization(a, profile)
    matrix = a.kernel_class in GEMM_LIKE
    measured = measured_matrix_rate(a, profile, key) if matrix and not profile.is_gpu else None
    if measured is not None:  # a calibrated CPU: the GEMM rate it measured at this dtype
        return measured * util, unit, key, 1.0, util, note
    eff = efficiency(kind, "matrix" if matrix else "vector")
    return vector * eff * util, unit, key, 1.0, util, note


def estimate(a: NodeAnalysis, profile: HardwareProfile, dtype: str | None = None) -> NodeCost:
    """Roofline time of node ``a`` on ``profile``; ``dtype`` overrides the node's own dtype."""
    if a.kernel_class is KernelClass.VIEW:
        dispatch = view_cost(a, profile)
        return NodeCost(dispatch, 0.0, 0.0, dispatch, "latency", 0.0, 0.0, "none",
                        peak_key(dtype or a.dtype), note="view: no kernel; eager dispatch "
                        "measured by calibrate" if dispatch else "free view: no kernel")
    if a.no_work:  # case 7
        return NodeCost(0.0, 0.0, 0.0, 0.0, "latency", 0.0, 0.0, "none",
                        peak_key(dtype or a.dtype), note="zero-size output: no kernel")
    if "shape_arithmetic" in a.flags:  # case 8
        return NodeCost(0.0, 0.0, 0.0, 0.0, "latency", 0.0, 0.0, "none",
                        peak_key(dtype or a.dtype), note="shape arithmetic: host work, no "
                        "kernel (a static export folds it)")
    if a.branches:  # case 9
        return _branches(a, profile, dtype)
    rate, unit, key, align, util, note = _compute_rate(a, profile, dtype or a.dtype)
    bandwidth = measured_bandwidth(profile) \
        or profile.bandwidth_bytes_per_s * efficiency(profile.kind, "memory")
    parallel, why = memory_parallelism(a, profile, key)
    if parallel < 1.0:
        bandwidth *= parallel
        note = f"{note}; {why}" if note else why
    compute_t = a.flops / rate if a.flops else 0.0
    moved = a.bytes_total
    if a.kernel_class is KernelClass.ATTENTION and unit == "tensor_core":
        moved += scores_bytes(a, profile)  # the math path's scores through memory
    memory_t = moved / bandwidth
    overhead = fixed_cost(a, profile)
    bound: Bottleneck
    if overhead >= max(compute_t, memory_t):
        bound = "latency"
    else:
        bound = "compute" if compute_t >= memory_t else "memory"
    return NodeCost(max(compute_t, memory_t) + overhead, compute_t, memory_t, overhead, bound,
                    rate, bandwidth, unit, key, align, util, note)


_BRANCH_NAMES = {"If": ("then", "else")}


def _branches(a: NodeAnalysis, profile: HardwareProfile, dtype: str | None) -> NodeCost:
    """Case 9: the slowest branch's node costs, summed, times the trips."""
    costs = [[estimate(b, profile, dtype) for b in branch] for branch in a.branches]
    times = [sum(c.est_time_s for c in branch) for branch in costs]
    pick = max(range(len(times)), key=times.__getitem__)
    chosen, n = costs[pick], a.trips
    if not chosen:  # every body only passes values through
        return NodeCost(0.0, 0.0, 0.0, 0.0, "latency", 0.0, 0.0, "none",
                        peak_key(dtype or a.dtype), note="empty bodies: no kernel")
    compute_t, memory_t, overhead = (n * sum(getattr(c, f) for c in chosen) for f in (
        "compute_time_s", "memory_time_s", "overhead_s"))
    slowest = max(chosen, key=lambda c: c.est_time_s)
    bound: Bottleneck = "latency" if overhead >= max(compute_t, memory_t) else (
        "compute" if compute_t >= memory_t else "memory")
    names = _BRANCH_NAMES.get(a.op_type or "", ())
    which = names[pick] if pick < len(names) else f"body {pick}"
    note = (f"{which} branch, the slower of {len(times)} ({times[pick]:.3g} s vs "
            f"{', '.join(f'{t:.3g}' for i, t in enumerate(times) if i != pick)} s)"
            if len(times) > 1 else f"body of {len(chosen)} nodes")
    if n != 1:
        note += f", run {n} times"
    return NodeCost(n * times[pick], compute_t, memory_t, overhead, bound,
                    a.flops / compute_t if compute_t else 0.0,
                    a.bytes_total / memory_t if memory_t else 0.0, slowest.unit,
                    slowest.precision, note=note)


def cost_key(a: NodeAnalysis) -> tuple[Any, ...]:
    """What :func:`estimate` reads of an analysis: two analyses with the same key cost the
    same on a profile (a memo key for repeated layers)."""
    return (a.kernel_class, tuple(a.dims.items()), a.dtype, a.flags, a.flops, a.bytes_total,
            a.op_type, tuple(tuple(cost_key(b) for b in branch) for branch in a.branches),
            a.trips)


def estimate_all(analyses: Mapping[str, NodeAnalysis], profile: HardwareProfile
                 ) -> dict[str, NodeCost]:
    """:func:`estimate` for every node; nodes with the same work (a repeated layer) share one
    cost, since the estimate reads only the analysis."""
    seen: dict[tuple[Any, ...], NodeCost] = {}
    out = {}
    for name, a in analyses.items():
        key = cost_key(a)
        cost = seen.get(key)
        if cost is None:
            cost = seen[key] = estimate(a, profile)
        out[name] = cost
    return out
