"""Kernel configuration templates: the CTA tile, pipeline stages and launch shape per node.

These are the configurations a code generator (or an autotuner's first guess) would START from,
not tuned kernels: they respect the instruction shapes and hardware limits cited below and rank
tiles with a simple per-tile roofline; CUTLASS/cuBLASLt still benchmark around such a guess.

Tile choice (GPU GEMMs): for every legal (tile_m, tile_n) of the MMA engine,
``est = waves x max(2*tm*tn / flops_per_sm, (tm+tn)*bytes / dram_bw_per_sm)`` (per unit of K),
with ``waves = ceil(tiles / SMs)``; the smallest estimate wins, estimates within 3% count as
ties and go to the tile holding more real data, then to less padding/wave waste. Stages are as
many K-slices of A and B as fit in shared memory.

Legality (which tiles, instructions and TMA boxes exist at all) is in ``kernels.tiles``; this
module chooses among them and sizes the launch.

Sources: [PTX-*], [CU-TMAP] as in :mod:`graphopt.decisions.kernels.tiles`;
  [PG]        CUDA C++ Programming Guide, technical specifications per compute capability:
              max resident threads per SM, 1 KB of shared memory per SM reserved by the system.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from graphopt.decisions.kernels.tiles import (
    CPU_KERNELS,
    SIMT,
    TCGEN05,
    WGMMA,
    Engine,
    GemmProblem,
    elem_bytes,
    mma_instruction,
    swizzle_bytes,
)
from graphopt.hardware.profile import HardwareProfile
from graphopt.ir.decision_details import Launch, Tile

__all__ = [
    "KernelConfig", "attention_config", "cpu_config", "elementwise_config", "gemm_config",
    "gemv_config", "rowwise_config",
]

logger = logging.getLogger(__name__)

KB = 1024
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
_THREADS = 256  # elementwise/GEMV block: 8 warps, a common occupancy-friendly choice


@dataclass(frozen=True, slots=True)
class KernelConfig:
    """A launch template for one node; its records are the report's ``tile`` and ``launch``."""

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

    def tile_record(self) -> Tile:
        """The exec_path decision's ``tile``: the instruction, and what of the tile is fixed."""
        m, n, k = self.tile if self.tile is not None else (None, None, None)
        return Tile(self.instruction, m, n, k, self.stages, self.k_iters, self.swizzle_bytes,
                    self.waves, self.efficiency, True if self.swap_ab else None)

    def launch_record(self) -> Launch:
        """The exec_path decision's ``launch``."""
        return Launch(self.grid, self.block, self.cluster, self.smem_bytes, self.vector_width,
                      self.threads)


def _n_candidates(engine: Engine, n: int) -> range:
    step = engine.n_step
    lo = max(step, min(_MIN_WIDE_N, -(-n // step) * step))
    return range(lo, engine.n_max + 1, step)


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
        template=f"gemm_{engine.name}", instruction=mma_instruction(engine, key, tm, tn,
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
        template=f"attention_{engine.name}", instruction=mma_instruction(engine, key, br, bc,
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


_GRAIN = 32768  # elements per thread before parallelizing (PyTorch at::internal::GRAIN_SIZE)


def cpu_config(path: str, key: str, t: HardwareProfile, p: GemmProblem | None,
               numel: int = 0) -> KernelConfig:
    """CPU micro-kernel (GEMM-like) or vector loop (other nodes), one thread per core."""
    cores = max(1, t.cores or 1)
    if p is None:
        simd = CPU_KERNELS.get((path, "*"), CPU_KERNELS[("generic", "*")])[4]
        threads = max(1, min(cores, math.ceil(numel / _GRAIN)))
        return KernelConfig(
            template="cpu_vector", instruction=f"{simd * 8}-bit SIMD loads/stores",
            reason=f"{numel} elements over {threads} thread(s) ({_GRAIN}-element grain)",
            vector_width=max(1, int(simd // elem_bytes(key))), threads=threads)
    mr, nr, ks, instr, simd = CPU_KERNELS.get((path, key)) or CPU_KERNELS.get(
        (path, "*"), CPU_KERNELS[("generic", "*")])
    blocks = math.ceil(p.M / mr) * math.ceil(p.N / nr) * p.batch
    threads = max(1, min(cores, blocks))
    return KernelConfig(
        template=f"cpu_gemm_{path}", instruction=instr,
        reason=f"{mr}x{nr} register block, K step {ks}; {blocks} blocks over {threads} thread(s)",
        tile=(mr, nr, ks), k_iters=math.ceil(p.K / ks), threads=threads,
        vector_width=max(1, int(simd // elem_bytes(key))))
