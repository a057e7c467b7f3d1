"""The quantize decisions (graphopt/decisions/quantize_choice.py) per case: CPUs with and without
VNNI, GPUs with and without FP8, convs vs MatMul/Gemm, calibration data or not; and the rule
both backends share, an explicit precision turns ``quantize="auto"`` off, end to end.

Every target is a pinned profile (never the host's ISA): Ice Lake (AVX512-VNNI), Zen 3 (AVX2,
no VNNI), Ice Lake with its VNNI struck out, A100 (INT8 tensor cores, no FP8), H100 (FP8).
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import onnx
import pytest
import torch
from onnx import helper

import graphopt
from graphopt.decisions.cpu_int8 import CONV_INT8_MEASURED, int8_pays_on_cpu
from graphopt.decisions.quantize_choice import (
    Int8Scheme,
    auto_choice,
    auto_quantize_blocked,
    int8_scheme,
    method_blocked,
    method_description,
)
from graphopt.hardware import get_target
from graphopt.hardware.profile import HardwareProfile
from graphopt.ir.options import Options
from tests.onnx_rewrite_models import init, model

VNNI_CPU = get_target("xeon-8380")
ZEN3 = get_target("epyc-7763")
#: Ice Lake without its int8 dot-product instructions: the same chip on the AVX2 path
NO_VNNI_CPU = dataclasses.replace(VNNI_CPU, capabilities=frozenset(
    c for c in VNNI_CPU.capabilities if c not in ("avx512_vnni", "avx_vnni", "amx_int8")))
A100, H100 = get_target("a100"), get_target("h100")
EXPLICIT = "precision=fp32 was requested explicitly; pass quantize='int8' to add INT8"


def test_the_targets_are_what_the_cases_need() -> None:
    assert int8_pays_on_cpu(VNNI_CPU)[0]
    assert not int8_pays_on_cpu(ZEN3)[0] and not int8_pays_on_cpu(NO_VNNI_CPU)[0]
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
    (VNNI_CPU, "Gemm", True, "int8_static"),
    (VNNI_CPU, "Conv", True, None),  # measured slower: convs stay fp32 on CPUs
    (NO_VNNI_CPU, "MatMul", True, None),
    (ZEN3, "MatMul", False, None),
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
    elif op == "Conv":
        assert why == f"convs stay fp32 on CPUs: {CONV_INT8_MEASURED}"
    else:
        assert why == int8_pays_on_cpu(target)[1] and "no VNNI" in why


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
    ("int8_static", "Conv", NO_VNNI_CPU, "no QLinearConv on a CPU without VNNI"),
    ("int8_static", "Conv", ZEN3, "no QLinearConv on a CPU without VNNI"),
    ("int8_static", "Conv", VNNI_CPU, None),
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
        "dynamic INT8 (int8 per-channel weights, uint8 activations per call, reduce_range: "
        "no VNNI)")
    assert method_description("int8_dynamic", VNNI_CPU, 32) == (
        "dynamic INT8 (int8 per-channel weights, uint8 activations per call)")
    assert method_description("int8_static", VNNI_CPU, 32) == (
        "static QDQ U8S8 (per-channel int8 weights, calibrated uint8 activations)")
    assert method_description("int8_static", ZEN3, 32).endswith(", reduce_range: no VNNI)")
    assert method_description("int8_static", A100, 32) == (
        "static QDQ S8S8 symmetric (TensorRT convention)")
    assert method_description("fp8", H100, 32) == (
        "static QDQ float8e4m3fn (per tensor, calibrated)")
    assert method_description("int4", VNNI_CPU, 32) == (
        "4-bit weight-only MatMulNBits (symmetric, blocks of 32)")


# --- the shared rule, end to end on both backends -----------------------------------------

D = 512  # wide enough that the plan puts the middle MatMuls at int8 on a VNNI CPU


def onnx_mlp() -> onnx.ModelProto:
    """A Conv branch and four 512x512 MatMul+Relu layers."""
    nodes = [helper.make_node("Conv", ["img", "cw"], ["cimg"], name="conv")]
    cur = "x"
    for i in range(4):
        nodes += [helper.make_node("MatMul", [cur, f"w{i}"], [f"m{i}"], name=f"mm{i}"),
                  helper.make_node("Relu", [f"m{i}"], [f"r{i}"], name=f"relu{i}")]
        cur = f"r{i}"
    inits = [init(f"w{i}", D, D, scale=1 / np.sqrt(D)) for i in range(4)]
    return model(nodes, {"x": [64, D], "img": [1, 3, 8, 8]},
                 {cur: [64, D], "cimg": [1, 8, 6, 6]}, [init("cw", 8, 3, 3, 3), *inits])


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
    assert t_opt.info["notes"]["quantize"] == {"applied": 0, "reason": reason}
    assert o_opt.info["notes"]["quantize"]["reason"] == reason
    assert o_opt.info["notes"]["quantize"]["nodes"] == {}
    assert not any(applied for applied, _ in _quantize_decisions(t_opt).values())
    assert _quantize_decisions(o_opt) == {
        n: (False, f"not applied: {reason}") for n in ("conv", "mm0", "mm1", "mm2", "mm3")}
    assert "quantize" not in t_opt.info["passes_applied"]
    assert "quantize" not in o_opt.info["passes_applied"]


def test_without_an_explicit_precision_or_by_name_onnx_still_quantizes(caplog) -> None:
    """The rule's other side on a pinned VNNI CPU: the plan's INT8 under precision="auto", and
    INT8 requested by name beside an explicit precision."""
    caplog.set_level(logging.ERROR)
    auto = graphopt.optimize(onnx_mlp(), target=VNNI_CPU, quantize="auto", measure=False)
    assert "reason" not in auto.info["notes"]["quantize"]
    assert any(applied for applied, _ in _quantize_decisions(auto).values())
    named = graphopt.optimize(onnx_mlp(), target=VNNI_CPU, precision="fp32", quantize="int8",
                              measure=False)
    assert {n for n, (applied, _) in _quantize_decisions(named).items() if applied} == {
        "mm0", "mm1", "mm2", "mm3"}
