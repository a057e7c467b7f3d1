"""Execution path per node and target: which MMA engine and data mover a kernel should use.

GPU paths (autoopt's names, plus the Blackwell ones autoopt lacks):

1. ``standard``    warp-level ``mma.sync`` with ``cp.async`` (sm_80+) or register staging
                   (Volta/Turing); CUDA-core FFMA for dtypes without tensor cores; vectorized
                   loops for memory-bound nodes. Ampere and Ada (FP8 there runs on mma.sync:
                   no TMA, no wgmma) always land here [PTX-MMA].
2. ``tma``         TMA bulk tensor copies + warp-level mma.sync: consumer Blackwell (sm_120),
                   which has TMA and FP8/FP6/FP4 block-scaled mma.sync but neither wgmma nor
                   tcgen05 [PTX-MMA, CU-TMAP].
3. ``tma_wgmma``   Hopper (sm_90a): TMA loads into swizzled shared memory, warpgroup
                   ``wgmma.mma_async`` reading both operands there [PTX-WGMMA].
4. ``wgmma``       Hopper when TMA is not legal (strides not 16-byte aligned): cp.async fills
                   shared memory, wgmma still computes.
5. ``tma_tcgen05`` datacenter Blackwell (sm_100a): TMA loads, single-thread-issued
                   ``tcgen05.mma`` accumulating in tensor memory (TMEM), 2-SM CTA pairs
                   (``cta_group::2``, cluster 2x1) for 256-row tiles [PTX-TC05].
6. ``tcgen05``     the same without TMA (cp.async into shared memory).
7. ``fp4_cluster`` FP4 on datacenter Blackwell: block-scaled ``tcgen05.mma.kind::mxf4nvf4``
                   (scale factors in TMEM) issued by a 2-SM CTA pair in a cluster, operands by
                   TMA. Only when the tile really is the 2-SM 256-row tile; otherwise
                   ``tma_tcgen05`` with an FP4 1-SM tile.

Fallbacks: both M and N below 64 (a 64-row wgmma/tcgen05 tile would be mostly padding) ->
``standard``; only M below 64 -> operands swapped (C^T = B^T A^T) so M maps to the
instruction's N (8..256); a single K iteration under one wave -> ``standard`` (nothing for an
asynchronous pipeline to overlap). CPU paths: ``amx``, ``vnni``, ``avx512``, ``avx2``,
``neon``, ``generic`` by ISA flag and dtype (rules in :func:`cpu_path`).

Sources: [PTX-*] and [CU-TMAP] as in :mod:`graphopt.decisions.kernels.tiles`; the Hopper/
Blackwell capability split comes from :mod:`graphopt.hardware.generations`.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from graphopt.analysis.kernel_class import GEMM_LIKE, KernelClass
from graphopt.analysis.record import NodeAnalysis
from graphopt.cost.roofline import peak_key
from graphopt.decisions.kernels.config import (
    KernelConfig,
    attention_config,
    cpu_config,
    elementwise_config,
    gemm_config,
    gemv_config,
    rowwise_config,
)
from graphopt.decisions.kernels.tiles import (
    MMA_SYNC,
    SIMT,
    TCGEN05,
    WGMMA,
    Engine,
    GemmProblem,
    elem_bytes,
    gemm_problem,
    gemm_tma_check,
    tma_check,
)
from graphopt.hardware.generations import family_for
from graphopt.hardware.profile import HardwareProfile
from graphopt.ir.decision_details import ExecPath, ExecPathDetail
from graphopt.ir.plan import Decision

__all__ = ["CPU_PATHS", "GPU_PATHS", "cpu_compute_dtype", "cpu_path", "exec_path",
           "tensor_core_dtype"]

logger = logging.getLogger(__name__)

GPU_PATHS = ("standard", "tma", "wgmma", "tma_wgmma", "tcgen05", "tma_tcgen05", "fp4_cluster")
CPU_PATHS = ("amx", "vnni", "avx512", "avx2", "neon", "generic")
_MIN_MMA_ROWS = 64  # smallest M of a wgmma (m64) / tcgen05 (M=64) instruction

# dtype key -> capability flag its tensor-core (mma.sync) path needs [generations.py table].
_TC_FLAG = {"fp16": "tensor_cores", "bf16": "bf16", "tf32": "tf32", "fp8": "fp8",
            "int8": "int8_tensor", "int4": "int4_tensor", "fp4": "fp4", "fp64": "fp64_tensor"}


def tensor_core_dtype(key: str, t: HardwareProfile) -> bool:
    """Does ``t`` run ``key`` on tensor cores at all? (fp32 never does; TF32 is its own key.)"""
    flag = _TC_FLAG.get(key)
    return flag is not None and t.has(flag)


def exec_path(analysis: NodeAnalysis, target: HardwareProfile,
              dtype: str | None = None) -> Decision:
    """The execution path of one node; ``dtype`` overrides the analysed one (e.g. ``"tf32"``)."""
    key = peak_key(dtype or analysis.dtype)
    kc = analysis.kernel_class
    if kc is KernelClass.VIEW:
        return Decision("free view: no kernel is launched", ExecPathDetail(ExecPath.NONE),
                        applied=False)
    if analysis.no_work:
        return Decision("zero-size output: nothing to compute, no kernel is launched",
                        ExecPathDetail(ExecPath.NONE), applied=False)
    if not target.is_gpu:
        return _cpu(analysis, target, key)
    if kc not in GEMM_LIKE:
        return _memory_bound(analysis, target, key)
    return _gpu_gemm(analysis, target, key)


def _decision(path: str, reason: str, cfg: KernelConfig, instruction: str | None = None,
              tma: bool | None = None) -> Decision:
    logger.debug("exec_path %s: %s", path, reason)
    return Decision(reason, ExecPathDetail(ExecPath(path), cfg.tile_record(),
                                           cfg.launch_record(), instruction, tma))


def _memory_bound(a: NodeAnalysis, t: HardwareProfile, key: str) -> Decision:
    d = a.dims
    if d.get("rows") and d.get("cols"):
        cfg = rowwise_config(d["rows"], d["cols"], key, t)
    else:
        cfg = elementwise_config(d.get("input_numel") or d.get("numel", 1), key, t)
    return _decision("standard", f"{a.kernel_class.value} is memory-bound: no tensor-core path "
                     f"applies; vectorized {cfg.template} kernel ({cfg.reason})", cfg)


def _name(t: HardwareProfile) -> str:
    cc = t.compute_capability
    return f"{t.display_name} ({t.generation}, sm_{cc[0]}{cc[1]})" if cc else t.display_name


def _gpu_gemm(a: NodeAnalysis, t: HardwareProfile, key: str) -> Decision:
    p = gemm_problem(a)
    who = _name(t)
    if p.kind == "gemv":
        cfg = gemv_config(p, key, t)
        return _decision("standard", f"{who}: matrix-vector product is memory-bound (each weight "
                         f"is used once), tensor cores would idle; {cfg.reason}", cfg)
    if a.kernel_class is KernelClass.QUANT_GEMM and key == "int4" and not t.has("int4_tensor"):
        d = _gpu_gemm(a, t, "fp16")  # mixed-input GEMM: int4 weights widened in registers
        return Decision(f"weight-only int4 without int4 tensor cores: weights dequantized to "
                        f"fp16 in registers, then {d.reason}", d.detail)
    if not tensor_core_dtype(key, t):
        cfg = gemm_config(p, key, t, SIMT)
        why = ("fp32 without TF32 runs on CUDA cores (pass dtype='tf32' when the plan allows "
               "TF32)" if key == "fp32" else f"{t.generation} has no {key} tensor cores")
        return _decision("standard", f"{who}: {why}; {cfg.reason}", cfg)
    if p.kind == "conv" and min(p.N, p.K) < 8:
        cfg = elementwise_config(p.M * p.N * p.batch, key, t)
        return _decision("standard", f"{who}: grouped/depthwise conv with {p.N} output and "
                         f"{p.K} reduction channels per group is memory-bound; direct kernel",
                         cfg)
    family = family_for(t.compute_capability or (8, 0))
    if family == "hopper" and key in WGMMA.k_step:
        return _async_mma(p, t, key, WGMMA, "tma_wgmma", "wgmma", who)
    if family == "blackwell_datacenter" and key in TCGEN05.k_step:
        return _async_mma(p, t, key, TCGEN05, "tma_tcgen05", "tcgen05", who)
    if family == "blackwell_consumer":
        return _tma_mma_sync(p, t, key, who)
    if t.has("tma"):  # Hopper / datacenter Blackwell, dtype outside wgmma/tcgen05 (e.g. fp64)
        return _standard(p, t, key, who, f"{key} has no wgmma/tcgen05 form: warp-level mma.sync")
    return _standard(p, t, key, who, f"{t.generation} has no TMA/wgmma/tcgen05: warp-level "
                     f"mma.sync{' + cp.async' if t.has('async_copy') else ''}")


def _config(p: GemmProblem, key: str, t: HardwareProfile, engine: Engine,
            tma: bool) -> KernelConfig:
    if p.kind == "attention":
        return attention_config(p, key, t, engine)
    return gemm_config(p, key, t, engine, tma=tma)


def _standard(p: GemmProblem, t: HardwareProfile, key: str, who: str, why: str) -> Decision:
    cfg = _config(p, key, t, MMA_SYNC, tma=False)
    return _decision("standard", f"{who}: {why}; {cfg.reason}", cfg, instruction=cfg.instruction)


def _tma_mma_sync(p: GemmProblem, t: HardwareProfile, key: str, who: str) -> Decision:
    cfg = _config(p, key, t, MMA_SYNC, tma=True)
    ok, why = _tma_ok(p, key, cfg)
    if not ok:
        return _standard(p, t, key, who, f"{why}; cp.async + mma.sync instead")
    if cfg.k_iters == 1 and (cfg.waves or 1) <= 1:
        return _standard(p, t, key, who, "a single K iteration under one wave: nothing for a "
                         "TMA pipeline to overlap")
    return _decision("tma", f"{who}: consumer Blackwell has TMA but no wgmma/tcgen05: TMA loads + "
                     f"warp-level {cfg.instruction}; {why}; {cfg.reason}", cfg,
                     instruction=cfg.instruction)


def _tma_ok(p: GemmProblem, key: str, cfg: KernelConfig) -> tuple[bool, str]:
    tile = cfg.tile or (64, 64, 64)
    if p.kind != "attention":
        return gemm_tma_check(p, key, tile, (cfg.cluster or (1, 1, 1))[0])
    # Q/O are [seq_q, head_dim], K/V [seq_kv, head_dim]; the scores never reach memory.
    inner = max(1, int(min(p.K * elem_bytes(key), 128) // elem_bytes(key)))
    for name, rows, box in (("Q/O", p.M, tile[0]), ("K/V", p.N, tile[1])):
        ok, why = tma_check((rows, p.K), key, (min(box, rows), inner))
        if not ok:
            return False, f"TMA not usable for {name}: {why}"
    return True, "TMA ok: " + why


def _async_mma(p: GemmProblem, t: HardwareProfile, key: str, engine: Engine, tma_path: str,
               plain_path: str, who: str) -> Decision:
    swap = False
    if p.kind != "attention" and p.M < _MIN_MMA_ROWS:
        if p.N < _MIN_MMA_ROWS:
            return _standard(p, t, key, who, f"M={p.M} and N={p.N} are both under 64: a "
                             f"{engine.name} tile (M >= 64) would be mostly padding; mma.sync "
                             "m16n8 tiles fit")
        p, swap = GemmProblem(p.kind, p.N, p.M, p.K, p.batch), True
    cfg = _config(p, key, t, engine, tma=True)
    if swap:
        cfg = _swapped(cfg)
    if p.kind != "attention" and cfg.k_iters == 1 and (cfg.waves or 1) <= 1:
        return _standard(p, t, key, who, f"too small for a {engine.name} pipeline: one K "
                         f"iteration (K={p.K}) and under one wave of tiles leave no load/compute "
                         "overlap to win; mma.sync has less setup")
    ok, why = _tma_ok(p, key, cfg)
    swapped = " (A/B swapped: C^T = B^T A^T so the small M becomes the instruction's N)" \
        if swap else ""
    if not ok:
        cfg = _config(p, key, t, engine, tma=False)
        cfg = _swapped(cfg) if swap else cfg
        return _decision(plain_path, f"{who}: {why}; falling back to cp.async loads + "
                         f"{cfg.instruction}{swapped}; {cfg.reason}", cfg,
                         instruction=cfg.instruction, tma=False)
    path = tma_path
    if engine is TCGEN05 and key == "fp4" and (cfg.cluster or (1,))[0] == 2:
        path = "fp4_cluster"
    mover = "TMA loads, accumulator in TMEM" if engine is TCGEN05 else "TMA loads"
    return _decision(path, f"{who}: {mover} + {cfg.instruction}{swapped}; {why}, swizzle "
                     f"{cfg.swizzle_bytes} B; {cfg.reason}", cfg, instruction=cfg.instruction,
                     tma=True)


def _swapped(cfg: KernelConfig) -> KernelConfig:
    return replace(cfg, swap_ab=True)


def cpu_compute_dtype(t: HardwareProfile, key: str) -> str:
    """The dtype a CPU kernel computes in: ``key`` if the profile has native arithmetic for it,
    else fp32 (operands converted on load, e.g. bf16 on Ice Lake)."""
    return key if key in t.peak_flops else "fp32"


def cpu_path(t: HardwareProfile, key: str, gemm: bool) -> tuple[str, str]:
    """(path, reason) for a CPU: matrix engines for GEMMs of their dtype, else widest SIMD.

    1. AMX for bf16/int8 GEMMs (TMUL tiles: ~8-16x AVX-512's MACs per cycle).
    2. VNNI (VPDPBUSD: 4 int8 MACs per 32-bit lane) for int8 GEMMs without AMX.
    3. NEON dot-product / BF16 instructions on Arm (SDOT, BFDOT).
    4. AVX-512 > AVX2 > NEON for fp32 and everything memory-bound; ``generic`` otherwise.
    """
    caps = t.capabilities
    if gemm and key == "bf16" and "amx_bf16" in caps:
        return "amx", "bf16 GEMM on AMX tiles (TDPBF16PS)"
    if gemm and key == "int8" and "amx_int8" in caps:
        return "amx", "int8 GEMM on AMX tiles (TDPBSSD)"
    if gemm and key == "int8" and caps & {"avx512_vnni", "avx_vnni"}:
        return "vnni", "int8 GEMM with VNNI VPDPBUSD (no AMX here)"
    if gemm and key == "int8" and "asimddp" in caps:
        return "neon", "int8 GEMM with Armv8.2 SDOT"
    if gemm and key == "bf16" and "bf16" in caps and "neon" in caps:
        return "neon", "bf16 GEMM with Armv8.6 BFDOT/BFMMLA (SVE kernels are an alternative)"
    native = "" if cpu_compute_dtype(t, key) == key else \
        f"; {key} has no native arithmetic here, computed in fp32 after conversion"
    if "avx512f" in caps:
        return "avx512", f"widest SIMD is AVX-512 (2 x 512-bit FMA){native}"
    if "avx2" in caps:
        return "avx2", f"widest SIMD is AVX2 + FMA (no AVX-512){native}"
    if "neon" in caps:
        return "neon", f"widest SIMD is NEON (128-bit){native}"
    return "generic", f"no known SIMD extension in the profile's flags{native}"


def _cpu(a: NodeAnalysis, t: HardwareProfile, key: str) -> Decision:
    gemm = a.kernel_class in GEMM_LIKE
    path, why = cpu_path(t, key, gemm)
    compute = cpu_compute_dtype(t, key)
    if gemm:
        cfg = cpu_config(path, compute, t, gemm_problem(a))
    else:
        numel = a.dims.get("input_numel") or a.dims.get("numel", 1)
        cfg = cpu_config(path, compute, t, None, numel=numel)
        why = f"{a.kernel_class.value} is memory-bound: {why}"
    return _decision(path, f"{t.display_name}: {why}; {cfg.reason}", cfg,
                     instruction=cfg.instruction)
