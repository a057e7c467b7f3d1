"""ONNX quantization passes (int8 dynamic/static, fp8, int4, auto): where they fire, where they
must not, the numbers.

Quantized models are compared at per-format tolerances measured on these seeded models (see each
test). Every rewritten model passes ``onnx.checker.check_model(full_check=True)``. The padding
pass is in test_onnx_rewrites.py; the shared helpers are in tests/onnx_rewrite_models.py.
"""

from __future__ import annotations

import io
from dataclasses import replace

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T

from graphopt.backends.onnx.context import OnnxContext
from graphopt.backends.onnx.padding import pad_channels
from graphopt.backends.onnx.quantize import (
    INT4_BLOCK_SIZE,
    QUANTIZE_PASSES,
    quantize,
    quantize_int8_dynamic,
    quantize_int8_static,
)
from graphopt.errors import GraphoptError
from graphopt.hardware.profile import HardwareProfile
from graphopt.hardware.registry import get_target
from graphopt.ir.decision_details import PrecisionDetail
from graphopt.ir.plan import Decision
from tests.hostisa import real_host_flags
from tests.onnx_rewrite_models import (
    checked,
    context,
    mlp,
    ops,
    producer,
    rms_err,
    run,
    tc_guide,
)

D = 512
#: rows at which the plan's INT8 cost pays on the pinned CPUs below (Zen 3's AVX2 path and Ice
#: Lake's VNNI); at the default 64 rows quantizing the activations eats the gain on both
BIG = 256


def feeds(seed: int, rows: int = 64) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((rows, D)).astype(np.float32),
            "img": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)}


CALIBRATION = [feeds(s) for s in range(1, 5)]
NO_VNNI_CPU, VNNI_CPU = get_target("epyc-7763"), get_target("xeon-8380")
SAMPLE = feeds(0)


def quantized_nodes(ctx: OnnxContext) -> set[str]:
    return {n for n, d in ctx.decisions.items() if d["quantize"].applied}


def test_int8_dynamic_quantizes_matmuls_never_convs_and_respects_exclusions() -> None:
    m = mlp()
    before = m.SerializeToString()
    src, ctx = context(m, "cpu", quantize="int8_dynamic")
    out = checked(quantize_int8_dynamic(src, ctx, frozenset({"mm1"})))
    assert m.SerializeToString() == before
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= set(ops(out))
    assert quantized_nodes(ctx) == {"mm0", "mm2", "mm3"}
    assert "excluded" in ctx.decisions["mm1"]["quantize"].reason
    assert "never dynamic INT8 convs" in ctx.decisions["conv"]["quantize"].reason
    assert any(n.name == "mm1" and n.op_type == "MatMul" for n in out.graph.node)
    assert "ConvInteger" not in ops(out)
    # measured 0.019 relative RMS error on this model (3 quantized layers in a chain)
    assert rms_err(run(m, SAMPLE), run(out, SAMPLE)) < 0.04


def host_has_vnni() -> bool:
    """Does this machine run int8 GEMMs with VNNI/AMX? ONNX Runtime's MLAS picks its U8S8
    kernel by the CPU it runs on, whatever the plan's target was."""
    return bool({"avx512_vnni", "avx_vnni", "amx_int8"} & real_host_flags())


def test_int8_static_emits_qdq_with_calibration_and_needs_it() -> None:
    src, ctx = context(mlp(), VNNI_CPU, quantize="int8_static")
    with pytest.raises(GraphoptError, match="calibration"):
        quantize_int8_static(src, ctx)
    src, ctx = context(mlp(), VNNI_CPU, calibration=CALIBRATION, quantize="int8_static")
    out = checked(quantize(src, ctx))
    assert {"QuantizeLinear", "DequantizeLinear"} <= set(ops(out))
    zero_points = {t.name: t.data_type for t in out.graph.initializer if "zero_point" in t.name}
    assert T.UINT8 in zero_points.values() and T.INT8 in zero_points.values()  # U8S8
    # a static conv is allowed where VNNI is (Ice Lake); see the no-VNNI test for Zen 3
    assert quantized_nodes(ctx) == {"conv", "mm0", "mm1", "mm2", "mm3"}
    assert "reduce_range" not in ctx.decisions["mm0"]["quantize"].reason
    # Per-channel int8 weights, MinMax-calibrated activations from 4 batches. The model runs
    # on this host: with VNNI measured 0.029 (MLP) and 0.038 (conv) relative RMS; without it
    # MLAS's AVX2 U8S8 kernel (VPMADDUBSW) saturates int16 pairs, as planned for a VNNI CPU
    # with no reduce_range: measured 0.054 on an AVX2-only EPYC.
    bound = 0.06 if host_has_vnni() else 0.08
    assert rms_err(run(mlp(), SAMPLE), run(out, SAMPLE)) < bound


def no_vnni_and_vnni() -> tuple[HardwareProfile, HardwareProfile]:
    """Pinned CPUs, not the host: Zen 3 (AVX2, no VNNI) and Ice Lake (AVX512-VNNI)."""
    return NO_VNNI_CPU, VNNI_CPU


def test_static_int8_on_a_cpu_without_vnni_quantizes_convs_with_reduce_range() -> None:
    """QLinearConv runs on the AVX2 u8s8 path too; its int16 pair sums saturate, so 7-bit
    activations (reduce_range) on every node."""
    no_vnni, _ = no_vnni_and_vnni()
    src, ctx = context(mlp(), no_vnni, calibration=CALIBRATION, quantize="int8_static")
    out = checked(quantize(src, ctx))
    assert quantized_nodes(ctx) == {"conv", "mm0", "mm1", "mm2", "mm3"}
    assert all("reduce_range: AVX2 VPMADDUBSW" in ctx.decisions[n]["quantize"].reason
               for n in ("conv", "mm0"))
    assert rms_err(run(mlp(), SAMPLE), run(out, SAMPLE)) < 0.08  # measured 0.038


@pytest.mark.parametrize("target", [NO_VNNI_CPU, VNNI_CPU], ids=["zen3-avx2", "icelake-vnni"])
def test_auto_on_a_cpu_quantizes_the_plans_nodes_on_every_int8_path(target) -> None:
    """No ISA flag rules INT8 out: at 64 rows quantizing the activations eats the gain (the
    reason says so), at 256 rows mm0-mm3 pay (mm3, the last weight GEMM, too: marked ``edge``
    for the guard to measure); the pass quantizes exactly the plan's INT8 nodes, dynamically
    (no calibration), never a conv (static only, with calibration data)."""
    src, ctx = context(mlp(), target, quantize="auto")
    assert quantize(src, ctx) is None
    small = ctx.decisions["mm1"]["quantize"].reason
    assert " vs fp32 " in small and "quantizing activations" in small
    assert "eat what the int8 GEMM saves" in small or "below the 10% margin" in small
    src, ctx = context(mlp(BIG), target, quantize="auto")
    out = checked(quantize(src, ctx))
    planned = {n.name for n in ctx.plan.nodes
               if n.decisions["precision"].detail.format == "int8"}
    assert planned == {"mm0", "mm1", "mm2", "mm3"} and quantized_nodes(ctx) == planned
    mm3 = next(n for n in ctx.plan.nodes if n.name == "mm3")
    assert mm3.decisions["precision"].detail.edge == "last"
    assert "ConvInteger" not in ops(out) and "MatMulInteger" in ops(out)
    assert not ctx.decisions["conv"]["quantize"].applied
    sample = feeds(0, BIG)
    assert rms_err(run(mlp(BIG), sample), run(out, sample)) < 0.04  # measured 0.012-0.013


def with_formats(ctx: OnnxContext, formats: dict[str, str]) -> OnnxContext:
    """The context with the plan's precision decisions replaced (what a big model would get)."""
    nodes = tuple(replace(n, decisions={**n.decisions, "precision": Decision(
        "test", PrecisionDetail(formats[n.name]))}) if n.name in formats else n
        for n in ctx.plan.nodes)
    return OnnxContext(replace(ctx.plan, nodes=nodes), ctx.target, ctx.options, ctx.samples,
                       ctx.calibration, ctx.compute_dtype)


def test_fp8_qdq_on_hopper_with_float8_types() -> None:
    """ORT 1.31's CPU EP runs FP8 Q/DQ only up to ORT_ENABLE_BASIC (see quantize_ort)."""
    src, ctx = context(mlp(), "h100", quantize="fp8")
    with pytest.raises(GraphoptError, match="calibration"):
        quantize(src, ctx)
    src, ctx = context(mlp(), "h100", calibration=CALIBRATION, quantize="fp8")
    out = checked(quantize(src, ctx, frozenset({"conv"})))
    assert {"QuantizeLinear", "DequantizeLinear"} <= set(ops(out))
    types = {t.data_type for t in out.graph.initializer if "zero_point" in t.name}
    assert types == {T.FLOAT8E4M3FN}
    weights = {t.name: t.data_type for t in out.graph.initializer}
    mm0 = next(n for n in out.graph.node if n.name == "mm0")
    deq = producer(out, mm0.input[1])
    assert deq.op_type == "DequantizeLinear" and weights[deq.input[0]] == T.FLOAT8E4M3FN
    inferred = onnx.shape_inference.infer_shapes(out).graph.value_info
    q_out = {vi.name: vi.type.tensor_type.elem_type for vi in inferred}
    assert {q_out[n.output[0]] for n in out.graph.node if n.op_type == "QuantizeLinear"} == {
        T.FLOAT8E4M3FN}
    assert ctx.notes["quantize"]["ort_cpu_graph_optimization_level"] == "ORT_ENABLE_BASIC"
    # measured 0.12 relative RMS: 4 per-tensor E4M3 layers (3 mantissa bits) in a chain
    assert rms_err(run(mlp(), SAMPLE), run(out, SAMPLE, "ORT_ENABLE_BASIC")) < 0.2
    src, ctx = context(mlp(), "a100", calibration=CALIBRATION, quantize="fp8")
    assert quantize(src, ctx) is None  # Ampere: no FP8 tensor cores; a reason, no error
    assert "no FP8 tensor cores" in ctx.decisions["mm0"]["quantize"].reason


def test_int4_matmulnbits_runs_in_ort_cpu() -> None:
    src, ctx = context(mlp(), "cpu", quantize="int4")
    out = checked(QUANTIZE_PASSES["int4"](src, ctx, frozenset({"mm3"})))
    nbits = [n for n in out.graph.node if n.op_type == "MatMulNBits"]
    assert {n.domain for n in nbits} == {"com.microsoft"} and len(nbits) == 3
    assert {a.i for n in nbits for a in n.attribute if a.name == "block_size"} == {
        INT4_BLOCK_SIZE}
    assert "MatMulNBits replaces MatMul only" in ctx.decisions["conv"]["quantize"].reason
    # one 4-bit layer: 8.7% relative RMS (16 levels per block of 32 Gaussian weights: step
    # ~0.3 sigma, noise step/sqrt(12)); measured 0.14 over the 3 chained layers here
    assert rms_err(run(mlp(), SAMPLE), run(out, SAMPLE)) < 0.25


def test_auto_on_gpus_follows_plan_formats() -> None:
    """fp8 decisions need calibration data (else: reasons); nvfp4 decisions become 4-bit."""
    src, ctx = context(mlp(), "h100", quantize="auto")
    ctx = with_formats(ctx, {"mm1": "fp8_e4m3", "mm2": "fp8_e4m3"})
    assert quantize(src, ctx) is None
    assert "calibration" in ctx.decisions["mm1"]["quantize"].reason
    ctx = with_formats(context(mlp(), "h100", calibration=CALIBRATION, quantize="auto")[1],
                       {"mm1": "fp8_e4m3", "mm2": "fp8_e4m3"})
    checked(quantize(src, ctx))
    assert quantized_nodes(ctx) == {"mm1", "mm2"}
    ctx = with_formats(context(mlp(), "b200", quantize="auto")[1], {"mm2": "nvfp4"})
    out = checked(quantize(src, ctx))
    assert [n.op_type for n in out.graph.node if n.name.startswith("mm2")] == ["MatMulNBits"]
    assert quantized_nodes(ctx) == {"mm2"}


def test_quantize_none_and_registry() -> None:
    src, ctx = context(mlp(), "cpu", quantize="none")
    assert quantize(src, ctx) is None and not ctx.decisions
    assert set(QUANTIZE_PASSES) == {"auto", "int8_dynamic", "int8_static", "fp8", "int4"}


def test_padding_then_quantization_compose(tmp_path) -> None:
    """A padded model is still an ordinary ONNX model for the quantizers."""
    src, ctx = context(tc_guide(), dtype="fp16", pad="always")
    padded = checked(pad_channels(src, ctx))
    buf = io.BytesIO(padded.SerializeToString())
    again, qctx = context(onnx.load_model_from_string(buf.getvalue()), "cpu", quantize="int4")
    out = checked(quantize(again, qctx))
    assert "MatMulNBits" in ops(out)
