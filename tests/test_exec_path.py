"""Execution paths per generation, kernel-config templates, TMA legality and swizzle."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphopt.analysis.kernel_class import KernelClass
from graphopt.analysis.record import NodeAnalysis
from graphopt.decisions.kernels.config import elementwise_config, gemm_config, gemv_config
from graphopt.decisions.kernels.exec_path import CPU_PATHS, GPU_PATHS, exec_path
from graphopt.decisions.kernels.tiles import (
    MMA_SYNC,
    TCGEN05,
    WGMMA,
    GemmProblem,
    elem_bytes,
    swizzle_bytes,
    tma_check,
)
from graphopt.hardware.registry import get_target

GPUS = ("a100", "h100", "b200", "rtx-5090", "l4", "rtx-4090", "v100", "t4")


def gemm(m: int, n: int, k: int, dtype: str = "bf16", kc: KernelClass = KernelClass.GEMM,
         **extra: int) -> NodeAnalysis:
    return NodeAnalysis(kc, {"M": m, "N": n, "K": k, "batch": 1, **extra}, 2 * m * n * k, 0, 0,
                        0, dtype)


def path(a: NodeAnalysis, target: str, dtype: str | None = None) -> str:
    return exec_path(a, get_target(target), dtype).detail.path


BIG = gemm(8192, 8192, 8192)


@pytest.mark.parametrize(("target", "expected"), [
    ("a100", "standard"), ("h100", "tma_wgmma"), ("b200", "tma_tcgen05"), ("rtx-5090", "tma"),
    ("l4", "standard"), ("rtx-4090", "standard"), ("v100", "standard"), ("t4", "standard")])
def test_large_bf16_gemm_path_per_generation(target: str, expected: str) -> None:
    d = exec_path(BIG, get_target(target))
    assert d.detail.path == expected
    assert d.reason and d.detail.tile.instruction and d.detail.launch.to_json()
    json.dumps(d.to_dict())  # the report must serialize it


@pytest.mark.parametrize("target", GPUS)
def test_wgmma_only_on_hopper_tcgen05_only_on_datacenter_blackwell(target: str) -> None:
    t = get_target(target)
    for dtype in ("bf16", "fp16", "fp8", "int8", "fp4"):
        d = exec_path(gemm(8192, 8192, 8192, dtype), t)
        instr = d.detail.tile.instruction
        assert ("wgmma" in d.detail.path or "wgmma" in instr) == (
            t.generation == "hopper" and dtype != "fp4"), (target, dtype)
        assert "tcgen05" in instr or d.detail.path == "fp4_cluster" or not t.has("tcgen05")
        if not t.has("tcgen05"):
            assert "tcgen05" not in d.detail.path and "tcgen05" not in instr
        assert d.detail.path in GPU_PATHS


def test_ada_fp8_runs_on_mma_sync() -> None:
    d = exec_path(gemm(8192, 8192, 8192, "fp8_e4m3"), get_target("l4"))
    assert d.detail.path == "standard"
    assert d.detail.tile.instruction.startswith("mma.sync.aligned.m16n8k32")
    assert "e4m3" in d.detail.tile.instruction
    assert path(gemm(8192, 8192, 8192, "fp8"), "a100") == "standard"  # no FP8 at all


def test_sm120_uses_tma_with_warp_level_mma() -> None:
    d = exec_path(BIG, get_target("rtx-5090"))
    assert d.detail.path == "tma" and "mma.sync" in d.detail.tile.instruction
    assert "no wgmma/tcgen05" in d.reason and "consumer Blackwell" in d.reason
    fp4 = exec_path(gemm(8192, 8192, 8192, "fp4"), get_target("rtx-5090"))
    assert fp4.detail.path == "tma" and "mxf4nvf4" in fp4.detail.tile.instruction


def test_blackwell_uses_2sm_cta_pair_and_fp4_cluster() -> None:
    d = exec_path(BIG, get_target("b200"))
    assert d.detail.launch.cluster == (2, 1, 1) and "TMEM" in d.reason
    assert "cta_group::2" in d.detail.tile.instruction
    fp4 = exec_path(gemm(8192, 8192, 8192, "fp4"), get_target("b200"))
    assert fp4.detail.path == "fp4_cluster" and "mxf4nvf4" in fp4.detail.tile.instruction
    assert path(gemm(8192, 8192, 8192, "fp4"), "h100") == "standard"  # Hopper has no FP4


@pytest.mark.parametrize(("target", "fallback"), [
    ("h100", "wgmma"), ("b200", "tcgen05"), ("rtx-5090", "standard")])
def test_misaligned_gemm_is_not_tma_compatible(target: str, fallback: str) -> None:
    d = exec_path(gemm(8192, 8192, 4095, "fp16"), get_target(target))
    assert d.detail.path == fallback
    assert "TMA not usable" in d.reason and "multiple of 16" in d.reason
    assert d.detail.tma in (False, None)


def test_small_gemm_falls_back_with_reason() -> None:
    tiny = exec_path(gemm(32, 32, 32), get_target("h100"))
    assert tiny.detail.path == "standard" and "under 64" in tiny.reason
    one_k = exec_path(gemm(64, 64, 64), get_target("b200"))
    assert one_k.detail.path == "standard" and "too small" in one_k.reason


def test_small_m_swaps_operands_instead_of_padding() -> None:
    d = exec_path(gemm(16, 4096, 4096), get_target("h100"))
    assert d.detail.path == "tma_wgmma" and d.detail.tile.swap_ab is True
    assert "m64n16k16" in d.detail.tile.instruction


def test_fp32_uses_cuda_cores_unless_tf32_is_allowed() -> None:
    a = gemm(4096, 4096, 4096, "fp32")
    d = exec_path(a, get_target("h100"))
    assert d.detail.path == "standard" and "TF32" in d.reason
    tf32 = exec_path(a, get_target("h100"), dtype="tf32")
    assert tf32.detail.path == "tma_wgmma" and "k8" in tf32.detail.tile.instruction


def test_non_gemm_nodes_get_vectorized_paths() -> None:
    ew = NodeAnalysis(KernelClass.ELEMENTWISE, {"numel": 1 << 20}, 1 << 20, 0, 0, 0, "bf16")
    d = exec_path(ew, get_target("h100"))
    assert d.detail.path == "standard" and "memory-bound" in d.reason
    assert d.detail.launch.vector_width == 8
    sm = NodeAnalysis(KernelClass.SOFTMAX, {"numel": 4096 * 1000, "rows": 4096, "cols": 1000},
                      0, 0, 0, 0, "fp32")
    assert exec_path(sm, get_target("a100")).detail.launch.grid == (4096, 1, 1)
    gv = exec_path(gemm(1, 4096, 4096), get_target("b200"))
    assert gv.detail.path == "standard" and "matrix-vector" in gv.reason
    view = exec_path(NodeAnalysis(KernelClass.VIEW, {"numel": 8}, 0, 0, 0, 0, "fp32"),
                     get_target("h100"))
    assert view.detail.path == "none" and not view.applied


def test_conv_and_attention_paths() -> None:
    conv = gemm(64 * 56 * 56, 256, 64 * 9, "bf16", KernelClass.CONV, groups=1, C_in=64,
                C_out=256)
    assert path(conv, "h100") == "tma_wgmma" and path(conv, "a100") == "standard"
    dw = gemm(64 * 56 * 56, 256, 9, "bf16", KernelClass.CONV, groups=256, C_in=256, C_out=256)
    assert path(dw, "h100") == "standard"
    att = NodeAnalysis(KernelClass.ATTENTION, {"batch": 8, "heads": 16, "seq_q": 2048,
                                               "seq_kv": 2048, "head_dim": 128}, 0, 0, 0, 0,
                       "bf16")
    assert path(att, "h100") == "tma_wgmma" and path(att, "a100") == "standard"
    assert path(att, "b200") == "tma_tcgen05"


@pytest.mark.parametrize(("target", "dtype", "expected"), [
    ("epyc-7763", "fp32", "avx2"), ("xeon-8380", "int8", "vnni"), ("xeon-8380", "fp32", "avx512"),
    ("xeon-8480", "bf16", "amx"), ("xeon-8480", "int8", "amx"), ("graviton3", "fp32", "neon"),
    ("graviton3", "int8", "neon"), ("epyc-7763", "int8", "avx2")])
def test_cpu_paths(target: str, dtype: str, expected: str) -> None:
    d = exec_path(gemm(1024, 1024, 1024, dtype), get_target(target))
    assert d.detail.path == expected and d.detail.launch.threads >= 1


def test_cpu_host_path_follows_its_flags() -> None:
    t = get_target("cpu")
    p = path(gemm(512, 512, 512, "fp32"), "cpu")
    assert p in CPU_PATHS
    want = "avx512" if t.has("avx512f") else "avx2" if t.has("avx2") else None
    if want:
        assert p == want
    # a dtype the CPU lacks is computed in fp32: no bf16 instruction on Ice Lake
    d = exec_path(gemm(512, 512, 512, "bf16"), get_target("xeon-8380"))
    assert "fp32 after conversion" in d.reason and "bf16" not in d.detail.tile.instruction
    ew = NodeAnalysis(KernelClass.ELEMENTWISE, {"numel": 1 << 20}, 0, 0, 0, 0, "bf16")
    assert path(ew, "xeon-8480") == "avx512"  # AMX is for GEMMs only


# --- kernels.config -------------------------------------------------------------------------

dims = st.integers(min_value=1, max_value=20000)


def _check_gemm(cfg, p: GemmProblem, key: str, target: str, engine) -> None:  # noqa: ANN001
    t = get_target(target)
    tm, tn, tk = cfg.tile
    ctas = cfg.cluster[0]
    assert cfg.k_iters == math.ceil(p.K / tk)
    assert cfg.stages >= 1
    stage = (tm + tn) * tk * elem_bytes(key) / ctas
    assert cfg.stages * stage <= t.smem_per_sm_bytes - 1024  # fits the SM's shared memory
    assert cfg.smem_bytes <= t.smem_per_sm_bytes - 1024
    assert cfg.grid[0] * tm // ctas >= p.M and cfg.grid[1] * tn >= p.N  # grid covers C
    assert cfg.grid[2] == p.batch
    tiles = math.ceil(p.M / tm) * math.ceil(p.N / tn) * p.batch
    assert cfg.waves * (t.sm_count // ctas) >= tiles
    if engine.k_step:
        assert tk % engine.k_step[key] == 0


@settings(max_examples=150, deadline=None)
@given(m=dims, n=dims, k=dims, key=st.sampled_from(sorted(WGMMA.k_step)))
def test_wgmma_tiles_obey_ptx_shapes(m: int, n: int, k: int, key: str) -> None:
    p = GemmProblem("gemm", m, n, k)
    cfg = gemm_config(p, key, get_target("h100"), WGMMA, tma=True)
    tm, tn, _ = cfg.tile
    assert tm % 64 == 0 and 8 <= tn <= 256 and tn % 8 == 0
    assert f"m64n{tn}k{ {'fp16': 16, 'bf16': 16, 'tf32': 8, 'fp8': 32, 'int8': 32}[key]}." \
        .replace(" ", "") in cfg.instruction
    assert tm * tn <= 32768  # fp32 accumulators in half the register file
    _check_gemm(cfg, p, key, "h100", WGMMA)


@settings(max_examples=80, deadline=None)
@given(m=dims, n=dims, k=dims, key=st.sampled_from(sorted(TCGEN05.k_step)))
def test_tcgen05_tiles_obey_ptx_shapes(m: int, n: int, k: int, key: str) -> None:
    p = GemmProblem("gemm", m, n, k)
    cfg = gemm_config(p, key, get_target("b200"), TCGEN05, tma=True)
    tm, tn, _ = cfg.tile
    assert tm in (64, 128, 256) and tn % 16 == 0 and 16 <= tn <= 256
    assert cfg.cluster == ((2, 1, 1) if tm == 256 else (1, 1, 1))
    _check_gemm(cfg, p, key, "b200", TCGEN05)


@settings(max_examples=80, deadline=None)
@given(m=dims, n=dims, k=dims, target=st.sampled_from(["a100", "l4", "t4", "rtx-5090"]))
def test_mma_sync_tiles_fit_and_cover(m: int, n: int, k: int, target: str) -> None:
    p = GemmProblem("gemm", m, n, k)
    cfg = gemm_config(p, "fp16", get_target(target), MMA_SYNC)
    _check_gemm(cfg, p, "fp16", target, MMA_SYNC)
    if target == "t4":  # no cp.async on Turing: register-staged double buffer
        assert cfg.stages <= 2


def test_tile_choice_avoids_wave_and_padding_waste() -> None:
    h100 = get_target("h100")
    cfg = gemm_config(GemmProblem("gemm", 8192, 8192, 8192), "bf16", h100, WGMMA, tma=True)
    assert cfg.tile == (128, 256, 64) and cfg.stages == 4 and cfg.efficiency > 0.95
    odd = gemm_config(GemmProblem("gemm", 65536, 200, 4096), "bf16", h100, WGMMA, tma=True)
    assert odd.tile[1] == 200  # N tile matches N exactly instead of padding to 256
    # under one wave, two 104-column tiles (208 of 200 used) keep twice as many SMs busy
    few = gemm_config(GemmProblem("gemm", 4096, 200, 4096), "bf16", h100, WGMMA, tma=True)
    assert few.tile[1] == 104 and few.waves == 1


def test_swizzle_choice() -> None:
    assert swizzle_bytes(128) == 128 and swizzle_bytes(256) == 128
    assert swizzle_bytes(64) == 64 and swizzle_bytes(32) == 32
    assert swizzle_bytes(96) == 32 and swizzle_bytes(16) == 0
    bf16 = gemm_config(GemmProblem("gemm", 4096, 4096, 4096), "bf16", get_target("h100"),
                       WGMMA, tma=True)
    assert bf16.swizzle_bytes == 128  # 64 bf16 = 128-byte rows


def test_tma_check_rules() -> None:
    assert tma_check((4096, 4096), "bf16", (128, 64))[0]
    ok, why = tma_check((128, 4095), "fp16", (128, 64))
    assert not ok and "multiple of 16" in why
    assert not tma_check((4096, 4096), "bf16", (300, 64))[0]  # box dim > 256
    assert not tma_check((4096, 4096), "bf16", (128, 4))[0]  # 8-byte inner box


@settings(max_examples=100, deadline=None)
@given(numel=st.integers(min_value=1, max_value=10**9),
       key=st.sampled_from(["fp32", "bf16", "int8"]), target=st.sampled_from(GPUS))
def test_elementwise_launch_covers_problem(numel: int, key: str, target: str) -> None:
    cfg = elementwise_config(numel, key, get_target(target))
    assert cfg.vector_width * elem_bytes(key) == 16
    assert cfg.grid[0] * cfg.block[0] * cfg.vector_width * cfg.k_iters >= numel


def test_gemv_launch_covers_rows() -> None:
    cfg = gemv_config(GemmProblem("gemv", 1, 11008, 4096), "fp16", get_target("a100"))
    assert cfg.grid[0] * cfg.tile[0] >= 11008 and cfg.vector_width == 8
