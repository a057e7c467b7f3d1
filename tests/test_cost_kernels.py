"""The kernel-level GPU cost rules against the numbers they were built from (issue 12).

Each test would fail if the rule were dropped or its parameter changed: the cited efficiency
table, the per-tap padding of tiny-C convs, the calibrated misalignment penalty, int8 GEMVs
without split-K, and split-KV decode attention.
"""

from __future__ import annotations

import re

import pytest

import graphopt.cost.efficiency as eff_mod
from graphopt.cost import estimate_op
from graphopt.cost.attention import kv_splits
from graphopt.cost.efficiency import MATRIX_EFFICIENCY, matrix_efficiency
from graphopt.cost.roofline import UNALIGNED_TC_EFFICIENCY
from graphopt.hardware import get_target


def test_every_efficiency_entry_cites_a_source_defined_in_the_module() -> None:
    doc = eff_mod.__doc__ or ""
    defined = set(re.findall(r"^\s+\[(\w+)\]", doc, re.M))
    assert {"MAMF", "DB", "LC"} <= defined
    for family, table in MATRIX_EFFICIENCY.items():
        for key, entry in table.items():
            assert 0.5 < entry.fraction <= 1.0, (family, key)
            refs = set(re.findall(r"\[(\w+)\]", entry.source))
            assert refs and refs <= defined, (family, key, entry.source)


def test_efficiency_is_per_family_and_dtype() -> None:
    h100, a100, t4 = get_target("h100"), get_target("a100"), get_target("t4")
    # ml-engineering MAMF: H100 BF16 794.5 / 989; FP8 below it (H100 70.9%, H200 73.4%)
    assert matrix_efficiency(h100, "bf16").fraction == pytest.approx(0.803)
    assert matrix_efficiency(h100, "fp8").fraction == pytest.approx(0.72)
    assert matrix_efficiency(a100, "bf16").fraction == pytest.approx(0.869)
    # DeepBench T4: cuBLAS 46.5 of 65 TFLOP/s, cuDNN's best conv 40.0
    assert matrix_efficiency(t4, "fp16").fraction == pytest.approx(0.716)
    assert matrix_efficiency(t4, "fp16", conv=True).fraction == pytest.approx(0.615)
    # no measurement for Ada: the generic fraction, said so
    ada = matrix_efficiency(get_target("l4"), "bf16")
    assert ada.fraction == 0.75 and "no published measurement" in ada.source


def _conv(c_in: int, target: str, **kw: int):
    return estimate_op("conv", batch=16, c_in=c_in, c_out=64, h=224, w=224, kernel=7, stride=2,
                       dtype="fp16", target=target, **kw)


@pytest.mark.parametrize(("target", "granule"), [("v100", 32), ("t4", 32), ("a100", 8),
                                                 ("h100", 8)])
def test_tiny_c_conv_is_slower_per_flop_by_its_padded_taps(target: str, granule: int) -> None:
    tiny, wide = _conv(3, target), _conv(64, target)
    per_flop_tiny = tiny.time_s / tiny.flops
    per_flop_wide = wide.time_s / wide.flops
    assert per_flop_tiny > 2 * per_flop_wide
    # compute-bound both: the rate ratio is the per-tap fill, 3 of the K step's channels
    assert tiny.bound == wide.bound == "compute"
    assert tiny.compute_fraction / wide.compute_fraction == pytest.approx(3 / granule, rel=0.02)
    assert f"fill 3 of {granule} K elements" in tiny.reason


def test_tiny_c_first_layer_matches_deepbench_within_2x() -> None:
    # DeepBench conv_bench, cuDNN 7.6.2: 16 x 3 x 224^2, 64 filters 7x7 stride 2
    for target, measured in (("v100", 466e-6), ("t4", 1177e-6)):
        ratio = _conv(3, target).time_s / measured
        assert 0.8 < ratio < 1.25, (target, ratio)


def test_misaligned_k_costs_the_calibrated_1_46x_not_2_85x() -> None:
    """H100 fp16 K = 10922 (4-byte rows) measured 1.46x slower than K = 10944 (issue 12)."""
    odd = estimate_op("gemm", M=8192, N=8192, K=10922, dtype="fp16", target="h100")
    even = estimate_op("gemm", M=8192, N=8192, K=10944, dtype="fp16", target="h100")
    assert odd.alignment_efficiency == UNALIGNED_TC_EFFICIENCY[4] == pytest.approx(0.68)
    per_flop = (odd.time_s / odd.flops) / (even.time_s / even.flops)
    assert per_flop == pytest.approx(1.46, rel=0.03)
    # M is not a leading dimension: an odd M costs nothing extra
    m_odd = estimate_op("gemm", M=8191, N=8192, K=10944, dtype="fp16", target="h100")
    assert m_odd.alignment_efficiency == 1.0


def test_volta_keeps_tensor_cores_at_8_byte_rows_only() -> None:
    # DeepBench V100: N = 5124 (8-byte rows) ran at 94-103 TFLOP/s, above the 31 TFLOP/s
    # CUDA-core peak
    eight = estimate_op("gemm", M=9124, N=5124, K=4096, dtype="fp16", target="v100")
    assert eight.kernel == "tensor cores, fp16" and eight.alignment_efficiency == 0.83
    assert 0.85 < eight.time_s / 3.702e-3 < 1.2
    four = estimate_op("gemm", M=9124, N=5122, K=4096, dtype="fp16", target="v100")
    assert four.kernel.startswith("CUDA cores")


def test_int8_gemv_without_split_k_streams_on_the_sms_it_occupies() -> None:
    t4 = get_target("t4")
    few = estimate_op("gemv", N=512, K=500_000, dtype="int8", target="t4")
    many = estimate_op("gemv", N=8448, K=2816, dtype="int8", target="t4")
    # 512 outputs = 8 blocks of 64 rows on 40 SMs: 8/40 of the achievable bandwidth
    assert few.bound == "memory" and few.memory_fraction == pytest.approx(0.85 * 8 / 40)
    assert many.memory_fraction == pytest.approx(0.85)
    assert "without split-K" in few.reason and t4.sm_count == 40
    # DeepBench measured 3.779 ms; bandwidth alone would say 0.95 ms
    assert 0.8 < few.time_s / 3.779e-3 < 1.3
    # floating-point GEMVs split K, so the same shape in fp16 is not limited
    assert estimate_op("gemv", N=512, K=500_000, dtype="fp16",
                       target="t4").memory_fraction == pytest.approx(0.85)


def test_kv_splits_follow_flash_attention_heuristic() -> None:
    assert kv_splits(query_tiles=256, sms=132, kv_blocks=64) == 1  # >= 80% of the SMs
    # decode, batch 1 x 32 heads on 132 SMs, 32 KV blocks: 4 splits fill 128 of 132
    assert kv_splits(query_tiles=32, sms=132, kv_blocks=32) == 4
    # never more splits than KV blocks
    assert kv_splits(query_tiles=1, sms=132, kv_blocks=3) <= 3


def test_decode_attention_is_memory_bound_on_the_kv_cache_and_fills_the_sms() -> None:
    mha = estimate_op("attention", batch=1, heads=32, seq=1, seq_kv=8192, head_dim=128,
                      dtype="bf16", target="h100")
    gqa = estimate_op("attention", batch=1, heads=32, kv_heads=8, seq=1, seq_kv=8192,
                      head_dim=128, dtype="bf16", target="h100")
    assert mha.bound == gqa.bound == "memory"
    assert mha.utilization > 0.9 and "split-KV" in mha.reason
    kv_bytes = 2 * 32 * 8192 * 128 * 2
    assert mha.bytes == pytest.approx(kv_bytes, rel=0.01)
    # GQA reads a quarter of the KV cache
    assert gqa.bytes == pytest.approx(kv_bytes / 4, rel=0.02)
    bandwidth = get_target("h100").bandwidth_bytes_per_s * 0.85
    assert gqa.time_s == pytest.approx(gqa.bytes / bandwidth + 5e-6, rel=0.01)


def test_tile_quantization_charges_narrow_convs() -> None:
    # 16 output channels fill a quarter of the 64-wide tile: 4x the time of 64 channels'
    # quarter of the work would be equal; here it is the same time for a quarter of the FLOPs
    narrow = estimate_op("conv", batch=16, c_in=64, c_out=16, h=56, w=56, kernel=3,
                         dtype="fp16", target="a100")
    wide = estimate_op("conv", batch=16, c_in=64, c_out=64, h=56, w=56, kernel=3,
                       dtype="fp16", target="a100")
    assert narrow.flops * 4 == wide.flops
    assert narrow.compute_fraction == pytest.approx(wide.compute_fraction / 4, rel=0.05)


@pytest.mark.parametrize("target, family", [("v100", "memory-efficient (CUTLASS)"),
                                            ("a100", "FlashAttention-2"),
                                            ("h100", "FlashAttention-3"),
                                            ("b200", "FA4 / cuDNN")])
def test_attention_names_the_sdpa_kernel_each_generation_runs(target: str, family: str) -> None:
    e = estimate_op("attention", batch=4, heads=16, seq=2048, head_dim=64, dtype="fp16",
                    target=target)
    assert e.reason.count(family) == 1 and "math path" not in e.reason


def test_a_head_dim_flash_cannot_take_runs_the_math_path_through_memory() -> None:
    dims = dict(batch=4, heads=16, seq=2048, dtype="fp16", target="h100")
    fused = estimate_op("attention", head_dim=24, **dims)
    math_path = estimate_op("attention", head_dim=20, **dims)  # not a multiple of 8
    assert "math path" in math_path.reason and "math path" not in fused.reason
    scores = 4 * 4 * 16 * 2048 * 2048 * 2  # S and P, each written and read, fp16
    bandwidth = get_target("h100").bandwidth_bytes_per_s * 0.85
    assert math_path.bound == "memory"
    assert math_path.time_s >= scores / bandwidth
    assert math_path.time_s > 3 * fused.time_s  # fewer FLOPs, yet far slower
