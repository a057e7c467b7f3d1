"""Kernel configuration templates: CTA tiles, TMA legality, swizzle and launch shapes.

These are the configurations a code generator (or an autotuner's first guess) would START from,
not tuned kernels: they respect the instruction shapes and hardware limits cited below and rank
tiles with a simple per-tile roofline; CUTLASS/cuBLASLt still benchmark around such a guess.

Tile choice (GPU GEMMs): for every legal (tile_m, tile_n) of the MMA engine,
``est = waves x max(2*tm*tn / flops_per_sm, (tm+tn)*bytes / dram_bw_per_sm)`` (per unit of K),
with ``waves = ceil(tiles / SMs)``; the smallest estimate wins, estimates within 3% count as
ties and go to the tile holding more real data, then to less padding/wave waste. Stages are as
many K-slices of A and B as fit in shared memory.

Sources:
  [PTX-WGMMA] PTX ISA, ``wgmma.mma_async`` (sm_90a): shapes m64nNkK, N = 8..256 in steps of 8,
              K = 16 (.f16/.bf16), 8 (.tf32), 32 (.e4m3/.e5m2/.s8/.u8).
  [PTX-TC05]  PTX ISA, ``tcgen05.mma`` (sm_100a): cta_group::1 M = 64/128, cta_group::2 (CTA
              pair) M = 128/256; N a multiple of 16 up to 256 (we use this conservative subset);
              K = 32 bytes (16 f16/bf16, 8 tf32, 32 f8/i8, 64 for block-scaled mxf4nvf4).
  [PTX-MMA]   PTX ISA, ``mma.sync``: m8n8k4 (sm_70), m16n8k8 f16 (sm_75), m16n8k16 f16/bf16,
              m16n8k8 tf32, m16n8k32 s8 (sm_80), e4m3/e5m2 (sm_89), kind::f8f6f4 m16n8k32 and
              block-scaled kind::mxf4nvf4 m16n8k64 (sm_120a).
  [CU-TMAP]   CUDA Driver API, ``cuTensorMapEncodeTiled``: globalAddress 16-byte aligned,
              globalDim in [1, 2^32], globalStrides multiples of 16 and < 2^40, boxDim in
              [1, 256], boxDim[0] * elementSize a multiple of 16 bytes; with a swizzle mode the
              inner box dimension must be <= the swizzle span (``CU_TENSOR_MAP_SWIZZLE_32B/64B/
              128B``: 16-byte chunks swizzled within a 32/64/128-byte span).
  [PG]        CUDA C++ Programming Guide, technical specifications per compute capability:
              65536 32-bit registers per SM (cc 7.0-12.x), max resident threads per SM, 1 KB of
              shared memory per SM reserved by the system.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from graphopt.analysis.kernel_class import KernelClass
from graphopt.analysis.record import NodeAnalysis
from graphopt.hardware.profile import HardwareProfile

__all__ = [
    "MMA_SYNC", "SIMT", "TCGEN05", "WGMMA", "Engine", "GemmProblem", "KernelConfig",
    "attention_config", "cpu_config", "elem_bytes", "elementwise_config", "gemm_config",
    "gemm_problem", "gemm_tma_check", "gemv_config", "rowwise_config", "swizzle_bytes",
    "tma_check",
]

logger = logging.getLogger(__name__)

KB = 1024
_ELEM_BYTES = {"fp64": 8.0, "fp32": 4.0, "tf32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0,
               "int8": 1.0, "int4": 0.5, "fp4": 0.5}
_PTX_TYPE = {"fp16": "f16", "bf16": "bf16", "tf32": "tf32", "fp8": "e4m3", "int8": "s8",
             "int4": "s4", "fp4": "e2m1", "fp64": "f64"}
# Max resident threads per SM [PG]. 10.1/10.3 and 12.1 are assumed equal to 10.0 / 12.0.
_MAX_THREADS_PER_SM = {(7, 0): 2048, (7, 2): 2048, (7, 5): 1024, (8, 0): 2048, (8, 6): 1536,
                       (8, 7): 2048, (8, 9): 1536, (9, 0): 2048, (10, 0): 2048, (10, 1): 2048,
                       (10, 3): 2048, (12, 0): 1536, (12, 1): 1536}
_SMEM_SYSTEM_RESERVED = 1 * KB  # [PG] per SM, unavailable to blocks
# Model parameters (not datasheet facts): shared memory kept back for the epilogue's staging
# sub-tile, the deepest pipeline worth building (more prefetch hides no more latency), and
# the narrowest N tile for wide problems (under ~64 columns wgmma/tcgen05 re-read A from shared
# memory faster than the tensor core consumes it).
_EPILOGUE_RESERVE = 16 * KB
_MAX_STAGES = 8
_MIN_WIDE_N = 64
_EST_TOLERANCE = 0.03
_REGS_PER_SM = 65536  # [PG], 32-bit registers
_THREADS = 256  # elementwise/GEMV block: 8 warps, a common occupancy-friendly choice
_TMA_MAX_BOX = 256  # [CU-TMAP]
_TMA_MAX_DIM = 2**32  # [CU-TMAP]
_TMA_MAX_STRIDE = 2**40  # [CU-TMAP]


def elem_bytes(key: str) -> float:
    """Bytes per element of a peak-table dtype key (fp4/int4 are half a byte)."""
    return _ELEM_BYTES.get(key, 4.0)


@dataclass(frozen=True, slots=True)
class Engine:
    """One MMA instruction family: its tile menu and the K each instruction consumes."""

    name: str
    k_step: Mapping[str, int]  # dtype key -> K elements per instruction
    m_tiles: tuple[int, ...]
    n_step: int
    n_max: int
    k_tile_bytes: int  # bytes of K per pipeline stage (one TMA box row at 128 B)
    max_acc: int | None  # accumulator elements a CTA may hold in registers (None: in TMEM)


# Register-file bound: half of the 64K registers for fp32 accumulators keeps room for addresses
# and operand fragments (CUTLASS's 128x256 tiles sit exactly at 32768).
_ACC_LIMIT = _REGS_PER_SM // 2
WGMMA = Engine("wgmma", {"fp16": 16, "bf16": 16, "tf32": 8, "fp8": 32, "int8": 32},
               (64, 128, 256), 8, 256, 128, _ACC_LIMIT)  # [PTX-WGMMA]; M = 64 x warpgroups
TCGEN05 = Engine("tcgen05", {"fp16": 16, "bf16": 16, "tf32": 8, "fp8": 32, "int8": 32,
                             "fp4": 64}, (64, 128, 256), 16, 256, 128, None)  # [PTX-TC05]
MMA_SYNC = Engine("mma_sync", {"fp16": 16, "bf16": 16, "tf32": 8, "fp8": 32, "int8": 32,
                               "int4": 64, "fp4": 64, "fp64": 4}, (64, 128, 256), 32, 256, 64,
                  _ACC_LIMIT)  # [PTX-MMA]; K tile of 64 bytes as CUTLASS's sm80 defaults
SIMT = Engine("simt", {}, (32, 64, 128), 32, 128, 32, _ACC_LIMIT // 2)  # CUDA-core FFMA


@dataclass(frozen=True, slots=True)
class GemmProblem:
    """A GEMM-like node as ``batch`` independent (M x K) @ (K x N) products."""

    kind: str  # "gemm" | "gemv" | "conv" | "attention"
    M: int
    N: int
    K: int
    batch: int = 1


def gemm_problem(a: NodeAnalysis) -> GemmProblem:
    """Read GEMM dims from the analysis record (attention: per-head QK^T; conv: per group)."""
    d = a.dims
    if a.kernel_class is KernelClass.ATTENTION:
        return GemmProblem("attention", d.get("seq_q", 1), d.get("seq_kv", 1),
                           d.get("head_dim", 1), d.get("batch", 1) * d.get("heads", 1))
    m, n, k = d.get("M", 1), d.get("N", 1), d.get("K", 1)
    if a.kernel_class is KernelClass.CONV:
        g = max(1, d.get("groups", 1))
        return GemmProblem("conv", m, max(1, n // g), k, g)
    gemv = a.kernel_class in (KernelClass.GEMV, KernelClass.QUANT_DOT) or min(m, n) == 1
    return GemmProblem("gemv" if gemv else "gemm", m, n, k, d.get("batch", 1))


@dataclass(frozen=True, slots=True)
class KernelConfig:
    """A launch template for one node; ``to_dict`` gives the report's ``tile`` and ``launch``."""

    template: str
    instruction: str
    reason: str
    tile: tuple[int, int, int] | None = None
    stages: int | None = None
    k_iters: int | None = None
    swizzle_bytes: int | None = None
    waves: int | None = None
    efficiency: float | None = None
    grid: tuple[int, int, int] | None = None
    block: tuple[int, int, int] | None = None
    cluster: tuple[int, int, int] | None = None
    smem_bytes: int | None = None
    vector_width: int | None = None
    threads: int | None = None
    swap_ab: bool = False

    def to_dict(self) -> dict[str, Any]:
        tile: dict[str, Any] = {"instruction": self.instruction}
        if self.tile is not None:
            tile.update(m=self.tile[0], n=self.tile[1], k=self.tile[2])
        for name in ("stages", "k_iters", "swizzle_bytes", "waves", "efficiency"):
            if getattr(self, name) is not None:
                tile[name] = getattr(self, name)
        if self.swap_ab:
            tile["swap_ab"] = True
        launch: dict[str, Any] = {}
        for name in ("grid", "block", "cluster"):
            if getattr(self, name) is not None:
                launch[name] = list(getattr(self, name))
        for name in ("smem_bytes", "vector_width", "threads"):
            if getattr(self, name) is not None:
                launch[name] = getattr(self, name)
        return {"template": self.template, "tile": tile, "launch": launch,
                "reason": self.reason}


def swizzle_bytes(row_bytes: float) -> int:
    """TMA swizzle span for a shared-memory row of ``row_bytes`` [CU-TMAP].

    The widest span (128, 64 or 32 B) that divides the row: the box's inner dimension is then
    one span (legal: inner box <= span) and a longer row is loaded as several boxes. 128 B
    covers all 32 four-byte banks, so 8 consecutive rows hit disjoint banks; a row that is not a
    multiple of 32 B gets no swizzle (0).
    """
    for span in (128, 64, 32):
        if row_bytes >= span and row_bytes % span == 0:
            return span
    return 0


def tma_check(shape: Sequence[int], key: str, box: Sequence[int]) -> tuple[bool, str]:
    """Can ``cuTensorMapEncodeTiled`` describe a row-major tensor and box? -> (ok, reason).

    ``shape`` and ``box`` list dims outermost first; rows are contiguous, so each stride is the
    product of the inner dims; the base address is assumed 16-byte aligned (allocators give 256).
    """
    eb = elem_bytes(key)
    if any(d < 1 or d > _TMA_MAX_DIM for d in shape):
        return False, f"a dim of {tuple(shape)} is outside [1, 2^32]"
    if any(b < 1 or b > _TMA_MAX_BOX for b in box):
        return False, f"box {tuple(box)} has a dim outside [1, 256]"
    inner_box_bytes = box[-1] * eb
    if inner_box_bytes % 16:
        return False, (f"inner box dim {box[-1]} x {eb:g} B = {inner_box_bytes:g} B, not a "
                       "multiple of 16")
    stride = shape[-1] * eb
    for dim in reversed(shape[1:]):
        if stride % 16 or stride >= _TMA_MAX_STRIDE:
            return False, (f"row stride {stride:g} B ({shape[-1]} x {eb:g} B) is not a multiple "
                           "of 16 bytes")
        stride *= dim
    return True, "strides 16-byte aligned, box within 256, inner box a multiple of 16 B"


def gemm_tma_check(p: GemmProblem, key: str, tile: tuple[int, int, int],
                   ctas: int = 1) -> tuple[bool, str]:
    """TMA legality of A [M,K], B [N,K] (K-major weight) and C [M,N] for a CTA tile."""
    tm, tn, tk = tile
    inner = max(1, int(min(tk * elem_bytes(key), 128) // elem_bytes(key)))
    for name, shape, box in (("A", (p.M, p.K), (min(tm // ctas, p.M), inner)),
                             ("B", (p.N, p.K), (min(tn, p.N), inner)),
                             ("C", (p.M, p.N), (min(tm // ctas, p.M), min(tn, p.N, 64)))):
        ok, why = tma_check(shape, key, box)
        if not ok:
            return False, f"TMA not usable for {name}: {why}"
    return True, "TMA ok: " + why


def _n_candidates(engine: Engine, n: int) -> range:
    step = engine.n_step
    lo = max(step, min(_MIN_WIDE_N, -(-n // step) * step))
    return range(lo, engine.n_max + 1, step)


def _instruction(engine: Engine, key: str, tm: int, tn: int, cc: tuple[int, int] | None) -> str:
    t = _PTX_TYPE.get(key, key)
    acc = "s32" if key in ("int8", "int4") else "f64" if key == "fp64" else "f32"
    if engine is WGMMA:
        return f"wgmma.mma_async.sync.aligned.m64n{tn}k{WGMMA.k_step[key]}.{acc}.{t}.{t}"
    if engine is TCGEN05:
        kind = {"fp16": "f16", "bf16": "f16", "tf32": "tf32", "fp8": "f8f6f4", "int8": "i8",
                "fp4": "mxf4nvf4.block_scale"}[key]
        group = 2 if tm == 256 else 1
        k = TCGEN05.k_step[key]
        return f"tcgen05.mma.cta_group::{group}.kind::{kind} (M={tm}, N={tn}, K={k})"
    if engine is SIMT:
        return f"fma.rn.{'f64' if key == 'fp64' else 'f32'} (CUDA cores)"
    if cc is not None and cc < (7, 5):
        return "mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32"
    k = 8 if cc is not None and cc < (8, 0) else MMA_SYNC.k_step.get(key, 16)
    if key == "fp4":
        return f"mma.sync.aligned.kind::mxf4nvf4.block_scale.m16n8k{k}.row.col.f32.e2m1.e2m1.f32"
    if key == "fp64":  # DMMA
        return "mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64"
    return f"mma.sync.aligned.m16n8k{k}.row.col.{acc}.{t}.{t}.{acc}"


def _budget(t: HardwareProfile) -> float:
    return (t.smem_per_sm_bytes or 48 * KB) - _SMEM_SYSTEM_RESERVED - _EPILOGUE_RESERVE


def gemm_config(p: GemmProblem, key: str, t: HardwareProfile, engine: Engine, *,
                tma: bool = False) -> KernelConfig:
    """Best CTA tile for ``engine`` by the per-tile roofline in the module docstring."""
    sms = max(1, t.sm_count or 1)
    eb = elem_bytes(key)
    tile_k = max(engine.k_step.get(key, 1), int((128 if tma else engine.k_tile_bytes) // eb))
    if engine is SIMT:
        tile_k = 8
    peak = (t.vector_flops.get("fp32") or t.peak_flops.get("fp32", 1.0)) if engine is SIMT \
        else t.peak_flops.get(key) or t.peak_flops.get("fp32", 1.0)
    flops_sm, bw_sm = peak / sms, t.bandwidth_bytes_per_s / sms
    budget, k_iters = _budget(t), math.ceil(p.K / tile_k)
    useful = p.M * p.N * p.batch
    ranked: list[tuple[Any, ...]] = []
    for tm in engine.m_tiles:
        ctas = 2 if engine is TCGEN05 and tm == 256 else 1  # 2-SM CTA pair [PTX-TC05]
        for tn in _n_candidates(engine, p.N):
            if engine.max_acc and tm * tn > engine.max_acc:
                continue
            stage = (tm + tn) * tile_k * eb / ctas
            fit = int(budget // stage)
            if fit < 2:
                continue
            slots = sms // ctas
            waves = math.ceil(math.ceil(p.M / tm) * math.ceil(p.N / tn) * p.batch / slots)
            est = waves * max(2 * tm * tn / (flops_sm * ctas), (tm + tn) * eb / (bw_sm * ctas))
            eff = useful / (waves * slots * tm * tn) if waves else 0.0  # no tiles: M*N*batch=0
            filled = min(tm, p.M) * min(tn, p.N)  # tile area that holds real data
            ranked.append((est, -filled, -eff, tm, (tm, tn, ctas, fit, waves, eff, stage)))
    if ranked:
        # Within _EST_TOLERANCE of the best estimate the tile holding more real data wins (more
        # operand reuse, fewer per-CTA prologues/epilogues than this model sees), then the one
        # wasting less on padding and waves.
        floor = min(r[0] for r in ranked) * (1 + _EST_TOLERANCE)
        choice = min((r for r in ranked if r[0] <= floor), key=lambda r: r[1:4])[4]
    else:  # nothing double-buffers: smallest tile, single stage
        tm, tn = engine.m_tiles[0], _n_candidates(engine, p.N)[0]
        stage = (tm + tn) * tile_k * eb
        choice = (tm, tn, 1, 1, math.ceil(math.ceil(p.M / tm) * math.ceil(p.N / tn) * p.batch
                                          / sms), 0.0, stage)
    tm, tn, ctas, fit, waves, eff, stage = choice
    async_copy = "async_copy" in t.capabilities  # no cp.async before sm_80: register staging
    stages = min(fit, _MAX_STAGES, max(2, k_iters)) if async_copy else min(fit, 2)
    if engine is WGMMA:
        block = 128 * ((1 if tm == 64 else 2) + 1)  # consumer warpgroups + 1 TMA producer
    elif engine is TCGEN05:
        block = 192  # TMA warp + MMA-issue warp + 4 epilogue warps (CUTLASS sm100 style)
    else:
        block = 256 if tm * tn >= 128 * 128 else 128
    row = tile_k * eb
    return KernelConfig(
        template=f"gemm_{engine.name}", instruction=_instruction(engine, key, tm, tn,
                                                                  t.compute_capability),
        reason=(f"{tm}x{tn}x{tile_k} tile: {waves} wave(s) over {sms} SMs, "
                f"{eff:.1%} of SM tile slots useful (padding + wave quantization); "
                f"{stages} stage(s) of {stage / KB:.1f} KB in {budget / KB:.0f} KB of shared "
                "memory"),
        tile=(tm, tn, tile_k), stages=stages, k_iters=k_iters,
        swizzle_bytes=swizzle_bytes(min(row, 128)) if tma else None, waves=waves,
        efficiency=round(eff, 4),
        grid=(math.ceil(p.M / tm) * ctas, math.ceil(p.N / tn), p.batch), block=(block, 1, 1),
        cluster=(ctas, 1, 1), smem_bytes=int(math.ceil(stages * stage)),
        vector_width=max(1, int(16 // eb)))


def attention_config(p: GemmProblem, key: str, t: HardwareProfile, engine: Engine) -> KernelConfig:
    """Flash-attention-style template: a block of query rows streams K/V blocks (2 stages)."""
    eb, hd = elem_bytes(key), p.K
    br = 128 if p.M >= 128 else 64
    bc = 128 if hd <= 128 else 64
    while (br + 2 * bc * 2) * hd * eb > _budget(t) and bc > 16:
        bc //= 2
    if engine in (WGMMA, TCGEN05):
        block = 128 * (br // 64 + 1)  # one consumer warpgroup per 64 query rows + producer
    else:
        block = 32 * (br // 16)  # one warp per 16 query rows (mma m16)
    return KernelConfig(
        template=f"attention_{engine.name}", instruction=_instruction(engine, key, br, bc,
                                                                       t.compute_capability),
        reason=f"query block {br} x key block {bc} x head_dim {hd}, K/V double-buffered",
        tile=(br, bc, hd), stages=2, k_iters=math.ceil(p.N / bc),
        swizzle_bytes=swizzle_bytes(min(hd * eb, 128)) if engine in (WGMMA, TCGEN05) else None,
        grid=(math.ceil(p.M / br), p.batch, 1), block=(block, 1, 1),
        smem_bytes=int((br + 4 * bc) * hd * eb), vector_width=max(1, int(16 // eb)))


def gemv_config(p: GemmProblem, key: str, t: HardwareProfile) -> KernelConfig:
    """One warp per output element, 16-byte vector loads along K (memory-bound)."""
    eb, rows = elem_bytes(key), max(p.M, p.N)
    warps = _THREADS // 32
    vec = max(1, int(16 // eb))
    return KernelConfig(
        template="gemv", instruction="ld.global.v4 + fma (CUDA cores), warp-shuffle reduce",
        reason=f"{rows} outputs, one warp each, {warps} per block; {vec}-wide loads along K",
        tile=(warps, 1, 32 * vec), k_iters=math.ceil(p.K / (32 * vec)),
        grid=(math.ceil(rows / warps), p.batch, 1), block=(_THREADS, 1, 1), vector_width=vec)


def elementwise_config(numel: int, key: str, t: HardwareProfile) -> KernelConfig:
    """Vectorized grid-stride loop capped at one resident wave (no tail wave)."""
    vec = max(1, int(16 // elem_bytes(key)))
    blocks = max(1, math.ceil(numel / (_THREADS * vec)))
    resident = _MAX_THREADS_PER_SM.get(t.compute_capability or (8, 0), 2048) // _THREADS
    grid = min(blocks, max(1, t.sm_count or 1) * resident)
    iters = math.ceil(blocks / grid)
    return KernelConfig(
        template="elementwise", instruction=f"ld/st.global.v{min(vec, 4)} (16-byte vectors)",
        reason=(f"{numel} elements, {vec} per 16-byte access; {grid} blocks x {_THREADS} "
                f"threads, {iters} grid-stride iteration(s)"),
        grid=(grid, 1, 1), block=(_THREADS, 1, 1), vector_width=vec, k_iters=iters)


def rowwise_config(rows: int, cols: int, key: str, t: HardwareProfile) -> KernelConfig:
    """Row reductions (softmax, norms): one block per row, threads cover the row once."""
    vec = max(1, int(16 // elem_bytes(key)))
    threads = min(1024, max(32, -(-math.ceil(cols / vec) // 32) * 32))
    return KernelConfig(
        template="rowwise", instruction="ld.global.v4 + warp-shuffle/shared-memory reduce",
        reason=f"{rows} rows of {cols}: one block of {threads} threads per row",
        grid=(max(1, rows), 1, 1), block=(threads, 1, 1), vector_width=vec,
        k_iters=math.ceil(cols / (threads * vec)))


# CPU register-blocked micro-kernels: (rows, cols, K step, instruction, SIMD bytes). Shapes come
# from the register budget: AVX2 has 16 ymm (6x2 accumulators + 2 B + 1 broadcast A), AVX-512
# and NEON 32 registers (AVX-512: 14x2 zmm + 2 + 1; NEON: 8x3 q-regs + 3 + 2); AMX holds 8 tile
# registers of 16 rows x 64 B: 2x2 C tiles + 2 A + 2 B (Intel SDM vol. 1, ch. 18 "AMX").
_CPU_KERNELS = {
    ("amx", "bf16"): (32, 32, 32, "tdpbf16ps (AMX tiles)", 64),
    ("amx", "int8"): (32, 32, 64, "tdpbssd (AMX tiles)", 64),
    ("vnni", "int8"): (14, 32, 4, "vpdpbusd (AVX512-VNNI)", 64),
    ("avx512", "bf16"): (14, 32, 2, "vdpbf16ps (AVX512-BF16)", 64),
    ("avx512", "fp16"): (14, 64, 1, "vfmadd231ph (AVX512-FP16)", 64),
    ("avx512", "*"): (14, 32, 1, "vfmadd231ps zmm (AVX-512)", 64),
    ("avx2", "int8"): (6, 16, 4, "vpmaddubsw + vpmaddwd (AVX2)", 32),
    ("avx2", "*"): (6, 16, 1, "vfmadd231ps ymm (AVX2+FMA)", 32),
    ("neon", "int8"): (8, 12, 4, "sdot (Armv8.2 dot product)", 16),
    ("neon", "bf16"): (8, 12, 2, "bfdot (Armv8.6 BF16)", 16),
    ("neon", "*"): (8, 12, 1, "fmla v.4s (NEON)", 16),
    ("generic", "*"): (4, 4, 1, "scalar fma", 8),
}
_GRAIN = 32768  # elements per thread before parallelizing (PyTorch at::internal::GRAIN_SIZE)


def cpu_config(path: str, key: str, t: HardwareProfile, p: GemmProblem | None,
               numel: int = 0) -> KernelConfig:
    """CPU micro-kernel (GEMM-like) or vector loop (other nodes), one thread per core."""
    cores = max(1, t.cores or 1)
    if p is None:
        simd = _CPU_KERNELS.get((path, "*"), _CPU_KERNELS[("generic", "*")])[4]
        threads = max(1, min(cores, math.ceil(numel / _GRAIN)))
        return KernelConfig(
            template="cpu_vector", instruction=f"{simd * 8}-bit SIMD loads/stores",
            reason=f"{numel} elements over {threads} thread(s) ({_GRAIN}-element grain)",
            vector_width=max(1, int(simd // elem_bytes(key))), threads=threads)
    mr, nr, ks, instr, simd = _CPU_KERNELS.get((path, key)) or _CPU_KERNELS.get(
        (path, "*"), _CPU_KERNELS[("generic", "*")])
    blocks = math.ceil(p.M / mr) * math.ceil(p.N / nr) * p.batch
    threads = max(1, min(cores, blocks))
    return KernelConfig(
        template=f"cpu_gemm_{path}", instruction=instr,
        reason=f"{mr}x{nr} register block, K step {ks}; {blocks} blocks over {threads} thread(s)",
        tile=(mr, nr, ks), k_iters=math.ceil(p.K / ks), threads=threads,
        vector_width=max(1, int(simd // elem_bytes(key))))
