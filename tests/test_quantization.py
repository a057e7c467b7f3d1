"""Quantization decisions: format table, model-level recommendation, per-node precision, INT8."""

from __future__ import annotations

import dataclasses
import math

import pytest

from graphopt.analysis.kernel_class import KernelClass
from graphopt.decisions import (
    FORMATS,
    get_format,
    int8_pays_on_cpu,
    node_precision,
    plan_precisions,
    recommend_quant,
    runs_natively,
)
from graphopt.decisions.memory_runtime.memory import GIB, MIB
from graphopt.decisions.planner import build_plan
from graphopt.errors import GraphoptError
from graphopt.hardware.detect import CpuInfo, build_host_profile
from graphopt.hardware.registry import get_target, list_targets
from tests.irbuild import G

GPUS = [t.name for t in list_targets() if t.is_gpu]
AVX2_HOST = build_host_profile(CpuInfo(
    model="test AVX2 host", vendor="intel", arch="x86_64", physical_cores=2, logical_cores=2,
    flags=frozenset({"sse2", "avx", "avx2", "fma", "f16c"}), clock_hz=2.5e9,
    clock_source="test"))


# --- the format table ----------------------------------------------------------------------------

def test_bits_per_weight_include_block_scales() -> None:
    assert FORMATS["nvfp4"].bits_per_weight == 4 + 8 / 16  # E2M1 + E4M3 scale per 16
    assert FORMATS["q8_0"].bits_per_weight == 34 * 8 / 32  # block_q8_0
    assert FORMATS["q6_k"].bits_per_weight == 210 * 8 / 256  # block_q6_K
    assert FORMATS["q4_k_m"].bits_per_weight == 4.84 and FORMATS["q5_k_m"].bits_per_weight == 5.68
    ranks = [f.quality_rank for f in FORMATS.values()]
    assert len(set(ranks)) == len(ranks) and FORMATS["fp32"].quality_rank == 0
    assert get_format("FP8").key == "fp8_e4m3" and get_format("bfloat16").key == "bf16"


def test_native_formats_per_generation() -> None:
    fp8, fp4, int8 = FORMATS["fp8_e4m3"], FORMATS["nvfp4"], FORMATS["int8"]
    for name in ("l4", "rtx-4090", "h100", "b200"):
        assert runs_natively(fp8, get_target(name))[0], name
    assert not runs_natively(fp8, get_target("a100"))[0]
    assert [n for n in GPUS if runs_natively(fp4, get_target(n))[0]] == ["b200", "rtx-5090"]
    assert runs_natively(int8, get_target("t4"))[0]
    assert not runs_natively(int8, get_target("v100"))[0]
    assert runs_natively(int8, get_target("xeon-8380"))[0]
    assert not runs_natively(int8, get_target("epyc-7763"))[0]


# --- model level ---------------------------------------------------------------------------------

SEVEN_B = 7_000_000_000
USABLE_4090 = 24 * GIB - int(0.08 * 24 * GIB)  # 22.08 GiB: reserve max(1 GiB, 8 %)
WS_ADA = 4 * MIB  # cuBLAS workspace before Hopper


def test_7b_bf16_on_a_24gb_card_by_hand() -> None:
    card = get_target("rtx-4090")
    quality = recommend_quant(card, SEVEN_B, "bf16", "quality")
    # bf16: 14e9 B of weights + 4 MiB workspace = 13.04 GiB <= 22.08 GiB usable: keep bf16
    assert (quality.format, quality.fits) == ("bf16", True)
    assert quality.est_memory_bytes == 14_000_000_000 + WS_ADA
    assert quality.usable_bytes == USABLE_4090
    # balanced: the best <= 8.5 bpw format the tensor cores run natively: FP8, 7e9 B
    balanced = recommend_quant(card, SEVEN_B, "bf16", "balanced")
    assert balanced.format == "fp8_e4m3" and balanced.weight_bytes == 7_000_000_000
    # speed: INT8 660.6 TOPS beats FP8 330.3 TFLOPS (GeForce FP8 with FP32 accumulate is halved)
    speed = recommend_quant(card, SEVEN_B, "bf16", "speed")
    assert speed.format == "int8" and "660.6" in speed.reason
    # on an L4 the two rates tie (242.5) and the tie goes to quality: FP8
    assert recommend_quant(get_target("l4"), SEVEN_B, "bf16", "speed").format == "fp8_e4m3"
    assert recommend_quant(get_target("h100"), SEVEN_B, "bf16", "speed").format == "fp8_e4m3"
    assert recommend_quant(get_target("b200"), SEVEN_B, "bf16", "speed").format == "nvfp4"
    assert recommend_quant(get_target("a100"), SEVEN_B, "bf16", "speed").format == "int8"


def test_activations_push_bf16_out() -> None:
    card = get_target("rtx-4090")
    acts = USABLE_4090 - 14_000_000_000 - WS_ADA + 1  # one byte too many for bf16
    r = recommend_quant(card, SEVEN_B, "bf16", "quality", activation_bytes=acts)
    assert r.format == "q8_0" and r.fits  # the next-best quality: 8.5 bpw, 7.4375e9 B


def test_70b_fits_nowhere_on_a_24gb_card() -> None:
    r = recommend_quant(get_target("rtx-4090"), 70_000_000_000, "bf16", "balanced")
    # the smallest format that runs there: INT4 weight-only (g128, 4.25 bpw; torch's tinygemm
    # on a bf16 GPU), smaller than Q4_K_M's 4.84, which this test expected before INT4 existed
    need = math.ceil(70e9 * 4.25 / 8) + WS_ADA
    assert (r.format, r.fits) == ("int4", False)
    assert r.missing_bytes == need - USABLE_4090
    assert f"{(need - USABLE_4090) / GIB:.2f} GiB" in r.reason and "missing" in r.reason
    assert "2 such devices" in r.reason
    # the same model fits an H100 in FP8 (70e9 B + 32 MiB <= 73.6 GiB)
    h100 = recommend_quant(get_target("h100"), 70_000_000_000, "bf16", "speed")
    assert (h100.format, h100.fits) == ("fp8_e4m3", True)


@pytest.mark.parametrize("target", ["rtx-4090", "a100", "h100", "b200", "v100", "xeon-8480"])
@pytest.mark.parametrize("pref", ["quality", "balanced", "speed"])
def test_never_larger_than_the_original(target: str, pref: str) -> None:
    r = recommend_quant(get_target(target), 1_000_000_000, "fp16", pref)
    assert r.bits_per_weight <= 16 and r.format not in ("bf16", "fp32")
    r8 = recommend_quant(get_target(target), 1_000_000_000, "fp8_e4m3", pref)
    assert r8.bits_per_weight <= 8 and r8.format != "q8_0"  # Q8_0 is 8.5 bpw


def test_requested_format_falls_back_with_a_reason() -> None:
    h100 = get_target("h100")
    r = recommend_quant(h100, SEVEN_B, "bf16", "speed", requested="nvfp4")
    assert r.format == "fp8_e4m3" and "requested NVFP4 not used" in r.reason
    r = recommend_quant(get_target("a100"), SEVEN_B, "bf16", "balanced", requested="fp8")
    assert r.format == "int8" and "fp8" in r.reason
    r = recommend_quant(h100, SEVEN_B, "fp16", "quality", requested="fp32")
    assert r.format == "fp16" and "larger than the original" in r.reason
    r = recommend_quant(get_target("a100"), SEVEN_B, "bf16", "speed", requested="q4_k_m")
    assert r.format == "q4_k_m" and "as requested" in r.reason  # weight-only runs anywhere


def test_bad_names_raise_with_a_fix() -> None:
    card = get_target("l4")
    for kwargs in ({"preference": "fastest"}, {"original_format": "fp12"},
                   {"requested": "q3_k_xl"}):
        with pytest.raises(GraphoptError) as e:
            recommend_quant(card, SEVEN_B, **kwargs)
        assert e.value.fix
    with pytest.raises(GraphoptError):
        recommend_quant(card, 0)


# --- per node ------------------------------------------------------------------------------------

def mlp(m: int, d: int, dtype: str = "bf16", layers: int = 3):
    g = G()
    x = g.input("x", (m, d), dtype)
    for i in range(layers):
        w = g.param(f"w{i}", (d, d), dtype)
        x = g.op("Relu", [g.op("Linear", [x, w], (m, d), dtype, name=f"fc{i}")], (m, d), dtype,
                 name=f"relu{i}")
    x = g.op("LayerNormalization", [x], (m, d), dtype, name="ln")
    x = g.op("Softmax", [x], (m, d), dtype, name="sm", axis=-1)
    return g.build([x])


def mid_gemm(target: str, m: int = 4096, d: int = 4096, dtype: str = "bf16"):
    p = build_plan(mlp(m, d, dtype), get_target(target))
    return p.node("fc1"), p


@pytest.mark.parametrize("target", ["l4", "rtx-4090", "h100"])
def test_fp8_for_a_big_gemm_on_ada_and_hopper(target: str) -> None:
    node, _ = mid_gemm(target)
    d = node_precision(node, get_target(target))
    assert d.detail.format == "fp8_e4m3" and d.applied
    # issue 22: graphopt's torch module runs FP8 Linear layers (it was "plan-only" before)
    assert d.detail.runs_on == "torch" and d.detail.kernel == "fp8_e4m3"
    assert "graphopt::fp8_linear over torch._scaled_mm" in d.reason
    assert d.detail.speedup > 1 + 0.10


def test_no_fp8_on_ampere() -> None:
    node, _ = mid_gemm("a100")
    d = node_precision(node, get_target("a100"))
    assert d.detail.format == "int8" and "no FP8 tensor cores on ampere" in d.reason
    v = node_precision(mid_gemm("v100")[0], get_target("v100"))
    assert v.detail.format == "fp16" and "no FP8 or INT8" in v.reason


def test_fp4_only_on_blackwell_and_only_weight_heavy() -> None:
    decode = {t: node_precision(mid_gemm(t, m=16)[0], get_target(t)).detail.format
              for t in GPUS}
    assert {t for t, f in decode.items() if f == "nvfp4"} == {"b200", "rtx-5090"}
    big = node_precision(mid_gemm("b200")[0], get_target("b200"))  # activations dominate
    assert big.detail.format == "fp8_e4m3"


def test_sensitive_nodes_stay_high() -> None:
    _, p = mid_gemm("h100")
    d = plan_precisions(p)
    assert d["fc0"].detail.format == "bf16" and "first" in d["fc0"].reason
    assert d["fc2"].detail.format == "bf16" and "last" in d["fc2"].reason
    assert d["fc1"].detail.format == "fp8_e4m3"
    assert d["ln"].detail.format == "fp32" and d["sm"].detail.format == "fp32"
    assert not d["fc0"].applied  # the model is bf16 already: nothing changes


def test_small_gemm_and_attention_logits_stay() -> None:
    small, _ = mid_gemm("h100", m=8, d=64)
    d = node_precision(small, get_target("h100"))
    assert d.detail.format == "bf16" and "launch-bound" in d.reason
    g = G()
    q, k = g.input("q", (8, 16, 1024, 128), "bf16"), g.input("k", (8, 16, 128, 1024), "bf16")
    s = g.op("MatMul", [q, k], (8, 16, 1024, 1024), "bf16", name="qk")
    p = build_plan(g.build([s]), get_target("h100"))
    d = node_precision(p.node("qk"), get_target("h100"))
    assert d.detail.format == "bf16" and "attention logits" in d.reason


def test_misaligned_gemm_is_not_quantized() -> None:
    node, _ = mid_gemm("h100", d=4100)  # 4100 % 16 != 0
    d = node_precision(node, get_target("h100"))
    assert d.detail.format == "bf16" and "multiples of 16" in d.reason


def test_node_analysis_alone_is_accepted() -> None:
    node, _ = mid_gemm("h100")
    assert node_precision(node.analysis, get_target("h100")).detail.format == "fp8_e4m3"


# --- CPU INT8 ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("target", "m", "fmt", "words"), [
    ("xeon-8380", 4096, "int8", "INT8 (avx512_vnni)"),  # VNNI, fp32 carrier
    ("epyc-7763", 4096, "int8", "INT8 (avx2_u8s8)"),  # AVX2 only: 2x fp32 on paper pays too
    ("xeon-8480", 16, "int8", "INT8 (amx_int8)"),  # AMX: int8 halves the weight traffic
    ("xeon-8480", 4096, "bf16", "eat what the int8 GEMM saves"),  # AMX bf16 is fast already
])
def test_int8_on_cpus_by_cost(target: str, m: int, fmt: str, words: str) -> None:
    """Every int8 path can win; the cost of quantizing the activations (and, against a bf16
    carrier, casting them) decides per node, and the reason gives both times."""
    cpu = get_target(target)
    assert int8_pays_on_cpu(cpu)[0]
    d = node_precision(mid_gemm(target, m=m, dtype="fp32")[0], cpu)
    assert d.detail.format == fmt and words in d.reason
    base = "bf16" if target == "xeon-8480" else "fp32"
    assert f" vs {base} " in d.reason and "quantizing activations" in d.reason
    if fmt == "int8":
        assert d.detail.runs_on == "torch" and d.detail.baseline == base
        assert d.detail.speedup >= 1 / (1 - 0.10) and d.detail.method == "dynamic"


@pytest.mark.parametrize("cpu", [get_target("epyc-7763"), AVX2_HOST, get_target("xeon-8380")],
                         ids=["epyc-7763", "avx2", "xeon-8380-vnni"])
def test_tiny_gemms_stay_fp32(cpu) -> None:
    p = build_plan(mlp(8, 64, "fp32"), cpu)
    d = node_precision(p.node("fc1"), cpu)
    assert d.detail.format == "fp32" and not d.applied
    assert "quantizing the activations and its extra ops" in d.reason


def test_no_int8_without_an_int8_path() -> None:
    """AVX without AVX2 (Sandy Bridge's ISA): no int8 instruction beats fp32."""
    cpu = build_host_profile(CpuInfo(
        model="test AVX host", vendor="intel", arch="x86_64", physical_cores=2,
        logical_cores=2, flags=frozenset({"sse2", "avx"}), clock_hz=2.5e9, clock_source="test"))
    pays, why = int8_pays_on_cpu(cpu)
    assert not pays and "no int8 GEMM path" in why
    d = node_precision(build_plan(mlp(4096, 4096, "fp32"), cpu).node("fc1"), cpu)
    assert d.detail.format == "fp32" and why in d.reason


def test_host_answer_follows_its_flags() -> None:
    host = get_target("cpu")
    assert int8_pays_on_cpu(host)[0] == bool(
        {"avx2", "avx512_vnni", "avx_vnni", "amx_int8", "asimddp"} & host.capabilities)
    assert not int8_pays_on_cpu(get_target("h100"))[0]


def _conv_plan(target: str):
    g = G()
    x = g.input("x", (32, 256, 56, 56))
    w = g.param("w", (256, 256, 3, 3))
    y = g.op("Conv", [x, w], (32, 256, 56, 56), name="conv", pads=[1, 1, 1, 1])
    return build_plan(g.build([y]), get_target(target))


@pytest.mark.parametrize("target", ["xeon-8380", "epyc-7763"])
def test_cpu_convolutions_are_costed_as_static_int8(target: str) -> None:
    """Convs follow the GEMMs' rule, costed as static QDQ (QLinearConv: measured faster);
    never dynamic (ConvInteger: measured slower), and torch has no INT8 conv pass."""
    p = _conv_plan(target)
    assert p.node("conv").analysis.kernel_class is KernelClass.CONV
    d = node_precision(p.node("conv"), get_target(target))
    assert d.detail.format == "int8" and d.detail.method == "static"
    assert d.detail.runs_on == "onnx" and "(static)" in d.reason
    assert "QLinearConv" in d.reason and "never dynamic" in d.reason


def test_int8_model_level_on_cpus() -> None:
    assert recommend_quant(get_target("xeon-8480"), SEVEN_B, "fp32", "speed").format == "int8"
    avx2 = recommend_quant(dataclasses.replace(AVX2_HOST, memory_bytes=64 * GIB), SEVEN_B,
                           "fp32", "speed")
    assert avx2.format != "int8"

