"""The quantize decisions (graphopt/decisions/quantize_choice.py) per case: CPUs on each int8
path (VNNI, AVX2 u8s8, none), GPUs with and without FP8, convs vs MatMul/Gemm, calibration data
or not; and the rule both backends share, an explicit precision turns ``quantize="auto"`` off,
end to end.

Every target is a pinned profile (never the host's ISA): Ice Lake (AVX512-VNNI), Zen 3 (AVX2,
no VNNI), Ice Lake with its VNNI struck out (the AVX2 u8s8 path), a Sandy Bridge-like AVX CPU
(no int8 path at all), A100 (INT8 tensor cores, no FP8), H100 (FP8).
"""

from __future__ import annotations

import logging

import onnx
import pytest
import torch

import graphopt
from graphopt.decisions.quantization.choice import (
    Int8Scheme,
    auto_choice,
    auto_quantize_blocked,
    int8_scheme,
    method_blocked,
    method_description,
)
from graphopt.decisions.quantization.cpu_int8 import CONV_INT8_MEASURED, int8_pays_on_cpu
from graphopt.hardware import get_target
from graphopt.hardware.cpus import cpu_profile
from graphopt.hardware.profile import HardwareProfile
from graphopt.ir.options import Options
from tests.onnx_rewrite_models import mlp

VNNI_CPU = get_target("xeon-8380")
ZEN3 = get_target("epyc-7763")
#: Ice Lake without its int8 dot-product instructions (Skylake-SP's ISA): the u8s8 path
NO_VNNI_CPU = cpu_profile(name="icelake-no-vnni", display_name="Ice Lake without VNNI",
                          vendor="intel", generation="avx512", tier="avx512", cores=40,
                          clock_hz=2.3e9, bandwidth_bytes_per_s=VNNI_CPU.bandwidth_bytes_per_s,
                          memory_bytes=VNNI_CPU.memory_bytes, llc_bytes=VNNI_CPU.l2_bytes,
                          capabilities=frozenset(c for c in VNNI_CPU.capabilities
                                                 if c not in ("avx512_vnni", "avx_vnni")),
                          source="test")
#: AVX without AVX2 (Sandy Bridge): no int8 instruction faster than fp32
NO_INT8_CPU = cpu_profile(name="avx-only", display_name="AVX-only CPU", vendor="intel",
                          generation="avx", tier="avx", cores=4, clock_hz=3e9,
                          bandwidth_bytes_per_s=20e9, memory_bytes=2**34, llc_bytes=2**23,
                          capabilities=frozenset({"sse2", "avx"}), source="test")
A100, H100 = get_target("a100"), get_target("h100")
SATURATES = ", reduce_range: AVX2 VPMADDUBSW + VPMADDWD (u8s8) sums pairs in saturating int16)"
EXPLICIT = "precision=fp32 was requested explicitly; pass quantize='int8' to add INT8"


def test_the_targets_are_what_the_cases_need() -> None:
    """Every int8 path can pay (per node, by cost); a CPU without one cannot."""
    for cpu, ratio in ((VNNI_CPU, "4.0x"), (ZEN3, "2.0x"), (NO_VNNI_CPU, "2.0x")):
        pays, why = int8_pays_on_cpu(cpu)
        assert pays and f"at {ratio} its fastest float peak" in why
    pays, why = int8_pays_on_cpu(NO_INT8_CPU)
    assert not pays and "has no int8 GEMM path" in why
    assert not A100.has("fp8") and H100.has("fp8") and A100.is_gpu and H100.is_gpu


# --- 1. an explicit precision turns auto quantization off ---------------------------------

@pytest.mark.parametrize(("options", "reason"), [
    (Options(), None),
    (Options(precision="fp32"), EXPLICIT),
    (Options(precision="bf16"), EXPLICIT.replace("fp32", "bf16")),
    (Options(precision="fp32", quantize="int8"), None),  # asked for by name
    (Options(precision="fp16", quantize="int8_static"), None),
    (Options(precision="fp32", quantize="none"), None),
])
def test_auto_quantize_blocked(options: Options, reason: str | None) -> None:
    assert auto_quantize_blocked(options) == reason


# --- 2. the auto choice per node ----------------------------------------------------------

@pytest.mark.parametrize(("target", "op", "cal", "method"), [
    (VNNI_CPU, "MatMul", False, "int8_dynamic"),
    (VNNI_CPU, "MatMul", True, "int8_static"),
    (VNNI_CPU, "Gemm", False, "int8_dynamic"),  # written as MatMul + Add for ORT
    (VNNI_CPU, "Gemm", True, "int8_static"),
    (VNNI_CPU, "Conv", True, "int8_static"),  # QLinearConv: measured faster
    (VNNI_CPU, "Conv", False, None),  # never dynamic (ConvInteger measured slower)
    (NO_VNNI_CPU, "MatMul", True, "int8_static"),  # the AVX2 path: the plan's cost decides
    (ZEN3, "MatMul", False, "int8_dynamic"),
    (ZEN3, "Conv", True, "int8_static"),
    (A100, "MatMul", False, None),  # GPU INT8 is static QDQ: calibration needed
    (A100, "MatMul", True, "int8_static"),
    (A100, "Conv", True, "int8_static"),
])
def test_auto_choice_for_int8(target: HardwareProfile, op: str, cal: bool,
                              method: str | None) -> None:
    got, why = auto_choice(op, "int8", "the plan's why", target, cal)
    assert got == method
    if method is not None:
        assert why == "plan: int8 (the plan's why)"
    elif target.is_gpu:
        assert "pass calibration data" in why
    else:
        assert why == ("INT8 convs run as static QDQ (QLinearConv), which needs activation "
                       f"scales: pass calibration data; never dynamic: {CONV_INT8_MEASURED}")


def test_auto_choice_for_fp8_4bit_and_float_formats() -> None:
    assert auto_choice("MatMul", "fp8_e4m3", "w", H100, True) == ("fp8", "plan: fp8_e4m3 (w)")
    assert auto_choice("Conv", "fp8_e4m3", "w", H100, False) == (
        None, "FP8 QDQ needs activation scales: pass calibration data")
    for fmt in ("nvfp4", "int4", "q4_k_m", "q3_k"):
        got, why = auto_choice("MatMul", fmt, "w", H100, False)
        assert got == "int4" and why.endswith("ONNX Runtime runs 4-bit weights as MatMulNBits")
    assert auto_choice("MatMul", "bf16", "stays bf16", VNNI_CPU, True) == (
        None, "the plan keeps bf16: stays bf16")


# --- 3. where a method never pays or loses its numerics -----------------------------------

@pytest.mark.parametrize(("mode", "op", "target", "blocked"), [
    ("int8_dynamic", "Conv", VNNI_CPU, "never dynamic INT8 convs"),
    ("int8_dynamic", "Conv", A100, "never dynamic INT8 convs"),
    ("int8_dynamic", "MatMul", NO_VNNI_CPU, None),  # requested by name: reduce_range instead
    ("int8_static", "Conv", NO_VNNI_CPU, None),  # QLinearConv runs on the AVX2 path too
    ("int8_static", "Conv", ZEN3, None),
    ("int8_static", "Conv", VNNI_CPU, None),
    ("int8_static", "Conv", NO_INT8_CPU, None),  # by name: the user's override
    ("int8_static", "Conv", A100, None),
    ("int8_static", "MatMul", NO_VNNI_CPU, None),
    ("fp8", "MatMul", A100, "has no FP8 tensor cores"),
    ("fp8", "MatMul", VNNI_CPU, "has no FP8 tensor cores"),
    ("fp8", "Conv", H100, None),
    ("int4", "MatMul", NO_VNNI_CPU, None),
])
def test_method_blocked(mode: str, op: str, target: HardwareProfile, blocked: str | None
                        ) -> None:
    got = method_blocked(mode, op, target)
    assert (got is None) if blocked is None else (got is not None and blocked in got)


# --- 4. the 8-bit scheme per target and its words -----------------------------------------

@pytest.mark.parametrize(("target", "mode", "scheme"), [
    (NO_VNNI_CPU, "int8_dynamic", Int8Scheme(reduce_range=True, symmetric=False)),
    (ZEN3, "int8_dynamic", Int8Scheme(reduce_range=True, symmetric=False)),
    (NO_INT8_CPU, "int8_dynamic", Int8Scheme(reduce_range=True, symmetric=False)),
    (VNNI_CPU, "int8_dynamic", Int8Scheme(reduce_range=False, symmetric=False)),
    (NO_VNNI_CPU, "int8_static", Int8Scheme(reduce_range=True, symmetric=False)),
    (VNNI_CPU, "int8_static", Int8Scheme(reduce_range=False, symmetric=False)),  # U8S8
    (A100, "int8_static", Int8Scheme(reduce_range=False, symmetric=True)),  # S8S8, TensorRT
    (H100, "fp8", Int8Scheme(reduce_range=False, symmetric=True)),
])
def test_int8_scheme(target: HardwareProfile, mode: str, scheme: Int8Scheme) -> None:
    assert int8_scheme(target, mode) == scheme


def test_int8_scheme_has_no_4bit_mode() -> None:
    with pytest.raises(ValueError, match="int4"):
        int8_scheme(VNNI_CPU, "int4")


def test_method_description() -> None:
    assert method_description("int8_dynamic", NO_VNNI_CPU, 32) == (
        "dynamic INT8 (int8 per-channel weights, uint8 activations per call" + SATURATES)
    assert method_description("int8_dynamic", NO_INT8_CPU, 32).endswith(
        ", reduce_range: no int8 dot-product instruction)")
    assert method_description("int8_dynamic", VNNI_CPU, 32) == (
        "dynamic INT8 (int8 per-channel weights, uint8 activations per call)")
    assert method_description("int8_static", VNNI_CPU, 32) == (
        "static QDQ U8S8 (per-channel int8 weights, calibrated uint8 activations)")
    assert method_description("int8_static", ZEN3, 32).endswith(SATURATES)
    assert method_description("int8_static", A100, 32) == (
        "static QDQ S8S8 symmetric (TensorRT convention)")
    assert method_description("fp8", H100, 32) == (
        "static QDQ float8e4m3fn (per tensor, calibrated)")
    assert method_description("int4", VNNI_CPU, 32) == (
        "4-bit weight-only MatMulNBits (symmetric, blocks of 32)")


# --- the shared rule, end to end on both backends -----------------------------------------

ROWS = 256  # large enough that the plan's cost puts the middle MatMuls at int8 on
# the 40-core VNNI CPU (at 64 rows the activation quantization eats the gain there)


def onnx_mlp() -> onnx.ModelProto:
    """A Conv branch and four 512x512 MatMul+Relu layers on ROWS rows."""
    return mlp(ROWS)


def _quantize_decisions(opt: object) -> dict[str, tuple[bool, str]]:
    return {n.name: (n.decisions["quantize"].applied, n.decisions["quantize"].reason)
            for n in opt.plan.nodes if "quantize" in n.decisions}  # type: ignore[attr-defined]


def test_an_explicit_precision_turns_auto_quantize_off_on_both_backends(caplog) -> None:
    """``quantize="auto"`` with ``precision="fp32"``: the same reason from both backends, no
    node quantized; the ONNX pass records it on every Conv/MatMul (as "not applied")."""
    caplog.set_level(logging.ERROR)
    reason = auto_quantize_blocked(Options(precision="fp32"))
    assert reason == EXPLICIT
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(),
                              torch.nn.Linear(512, 512), torch.nn.GELU(),
                              torch.nn.Linear(512, 128)).eval()
    t_opt = graphopt.optimize(mlp, (torch.randn(32, 256),), target="cpu", precision="fp32",
                              quantize="auto", measure=False)
    o_opt = graphopt.optimize(onnx_mlp(), target="cpu", precision="fp32", quantize="auto",
                              measure=False)
    assert t_opt.info.notes["quantize"] == {"applied": 0, "reason": reason}
    assert o_opt.info.notes["quantize"]["reason"] == reason
    assert o_opt.info.notes["quantize"]["nodes"] == {}
    assert not any(applied for applied, _ in _quantize_decisions(t_opt).values())
    assert _quantize_decisions(o_opt) == {
        n: (False, f"not applied: {reason}") for n in ("conv", "mm0", "mm1", "mm2", "mm3")}
    assert "quantize" not in t_opt.info.passes_applied
    assert "quantize" not in o_opt.info.passes_applied


def test_without_an_explicit_precision_or_by_name_onnx_still_quantizes(caplog) -> None:
    """The rule's other side on a pinned VNNI CPU: the plan's INT8 under precision="auto", and
    INT8 requested by name beside an explicit precision."""
    caplog.set_level(logging.ERROR)
    auto = graphopt.optimize(onnx_mlp(), target=VNNI_CPU, quantize="auto", measure=False)
    assert "reason" not in auto.info.notes["quantize"]
    assert any(applied for applied, _ in _quantize_decisions(auto).values())
    named = graphopt.optimize(onnx_mlp(), target=VNNI_CPU, precision="fp32", quantize="int8",
                              measure=False)
    assert {n for n, (applied, _) in _quantize_decisions(named).items() if applied} == {
        "mm0", "mm1", "mm2", "mm3"}
