"""Issue 34, item 2: static INT8 for convolutions where it pays, with calibration data.

On pinned CPU profiles, never the host's ISA: Zen 3 (AVX2 u8s8, no VNNI), Ice Lake
(AVX512-VNNI), Sapphire Rapids (AMX) and a copy of Zen 3 without any int8 path. The model: dense
3x3 convs sharing one bias initializer (as torch's TorchScript exporter writes them after
BatchNorm folding: the first conv reads the initializer, the others an ``Identity`` of it), a
depthwise conv between them.

* ``quantize="auto"`` with calibration data quantizes the dense convs as static QDQ, every one
  fused by ONNX Runtime into ``QLinearConv`` (a QDQ conv left unfused runs in fp32 between a
  Dequantize and a Quantize: slower than not quantizing), and stays within the int8 tolerance on
  fresh inputs;
* the depthwise conv stays float, with the measured reason; on a CPU without an int8 path no
  conv is quantized, and each says why;
* the held-out check: calibration batches that do not represent the held-out ones (a range 100x
  narrower) make the pass revert, with the held-out numbers in the reason.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphopt
from graphopt.backends.onnx.quantize import quantize
from graphopt.decisions.quantization.cpu_int8 import GROUPED_CONV_INT8_MEASURED
from graphopt.decisions.tolerance import tolerance_for
from graphopt.hardware.profile import HardwareProfile
from graphopt.hardware.registry import get_target
from tests.onnx_rewrite_models import checked, context, rel_err, run

C, HW, N = 64, 56, 4
DENSE = ("conv0", "conv1", "conv3")
NO_VNNI, VNNI, AMX = get_target("epyc-7763"), get_target("xeon-8380"), get_target("xeon-8480")


def no_int8_path(cpu: HardwareProfile) -> HardwareProfile:
    """``cpu`` without AVX2 (an AVX-only core): no int8 GEMM path at all."""
    return replace(cpu, capabilities=cpu.capabilities - {"avx2", "avx512_vnni", "avx_vnni",
                                                         "amx_int8"},
                   peak_flops={k: v for k, v in cpu.peak_flops.items() if k != "int8"})


def convnet() -> onnx.ModelProto:
    rng = np.random.default_rng(0)

    def w(name: str, *shape: int) -> onnx.TensorProto:
        fan_in = int(np.prod(shape[1:]))
        return numpy_helper.from_array(
            (rng.standard_normal(shape) * np.sqrt(2 / fan_in)).astype(np.float32), name)

    bias = numpy_helper.from_array((rng.standard_normal(C) * 0.1).astype(np.float32), "b")
    conv = helper.make_node
    nodes = [
        conv("Identity", ["b"], ["b_a"], name="bias_a"),
        conv("Identity", ["b"], ["b_b"], name="bias_b"),
        conv("Conv", ["x", "w0", "b"], ["c0"], name="conv0", pads=[1, 1, 1, 1]),
        conv("Relu", ["c0"], ["r0"], name="relu0"),
        conv("Conv", ["r0", "w1", "b_a"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        conv("Relu", ["c1"], ["r1"], name="relu1"),
        conv("Conv", ["r1", "w2"], ["c2"], name="dw", pads=[1, 1, 1, 1], group=C),
        conv("Relu", ["c2"], ["r2"], name="relu2"),
        conv("Conv", ["r2", "w3", "b_b"], ["y"], name="conv3", pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(
        nodes, "convnet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [N, C, HW, HW])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [N, C, HW, HW])],
        [w("w0", C, C, 3, 3), w("w1", C, C, 3, 3), w("w2", C, 1, 3, 3), w("w3", C, C, 3, 3),
         bias])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def batch(seed: int, scale: float = 1.0) -> dict[str, np.ndarray]:
    x = np.random.default_rng(seed).standard_normal((N, C, HW, HW)) * scale
    return {"x": x.astype(np.float32)}


CALIBRATION = [batch(s) for s in range(1, 5)]


def fused(model: onnx.ModelProto, tmp_path) -> dict[str, int]:
    """Op counts of the graph ONNX Runtime runs (its optimizations at ENABLE_EXTENDED: the QDQ
    fusions, without the NCHWc layout the ALL level adds)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    counts: dict[str, int] = {}
    for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node:
        counts[n.op_type] = counts.get(n.op_type, 0) + 1
    return counts


@pytest.mark.parametrize("target", [NO_VNNI, VNNI, AMX],
                         ids=["zen3-avx2", "icelake-vnni", "sapphire-rapids-amx"])
def test_dense_convs_run_static_int8_as_qlinearconv_within_tolerance(target, tmp_path) -> None:
    src, ctx = context(convnet(), target, calibration=CALIBRATION, quantize="auto")
    planned = {n.name for n in ctx.plan.nodes
               if n.decisions["precision"].detail.format == "int8"}
    assert planned == set(DENSE)  # the plan's cost: INT8 pays for each dense conv here
    out = checked(quantize(src, ctx))
    applied = {n for n, d in ctx.decisions.items() if d["quantize"].applied}
    assert applied == set(DENSE)
    assert all("static QDQ U8S8" in ctx.decisions[n]["quantize"].reason for n in DENSE)
    saturates = target is NO_VNNI  # AVX2's int16 pair sums: 7-bit activations
    assert all(("reduce_range" in ctx.decisions[n]["quantize"].reason) == saturates
               for n in DENSE)
    assert "Identity" not in {n.op_type for n in out.graph.node}  # the biases read directly
    ops = fused(out, tmp_path)
    assert ops.get("QLinearConv") == len(DENSE) and ops.get("Conv") == 1  # the depthwise one
    budget = tolerance_for("int8").rel_to_scale
    for seed in (11, 12):  # fresh inputs, not calibrated on
        feed = batch(seed)
        assert rel_err(run(convnet(), feed), run(out, feed)) < budget  # measured 0.01-0.02


@pytest.mark.parametrize("target", [NO_VNNI, VNNI], ids=["zen3-avx2", "icelake-vnni"])
def test_a_depthwise_conv_stays_float_with_the_measured_reason(target) -> None:
    src, ctx = context(convnet(), target, calibration=CALIBRATION, quantize="auto")
    dw = next(n for n in ctx.plan.nodes if n.name == "dw").decisions["precision"]
    assert dw.detail.format == "fp32" and GROUPED_CONV_INT8_MEASURED in dw.reason
    quantize(src, ctx)
    d = ctx.decisions["dw"]["quantize"]
    assert not d.applied and d.reason.startswith("not applied: the plan keeps fp32")


@pytest.mark.parametrize("target", [NO_VNNI, VNNI], ids=["zen3-avx2", "icelake-vnni"])
def test_a_shallow_pointwise_conv_stays_float_for_its_depth(target) -> None:
    """A 1x1 conv from 8 channels: its dot products are 8 long, where an int8 conv was measured
    to gain least (``cost.cpu_int8_cost``, case 5); the reason gives the factor."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [N, 8, HW, HW])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [N, C, HW, HW])
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((C, 8, 1, 1))
                                .astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="pw")], "pw",
                              [x], [y], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    _, ctx = context(model, target, calibration=[], quantize="auto")
    prec = ctx.plan.nodes[0].decisions["precision"]
    assert prec.detail.format == "fp32" and "x 0.14 for its depth" in prec.reason


def test_no_conv_is_quantized_on_a_cpu_without_an_int8_path() -> None:
    src, ctx = context(convnet(), no_int8_path(NO_VNNI), calibration=CALIBRATION,
                       quantize="auto")
    assert quantize(src, ctx) is None
    for name in DENSE:
        prec = next(n for n in ctx.plan.nodes if n.name == name).decisions["precision"]
        assert prec.detail.format == "fp32" and "has no int8 GEMM path" in prec.reason
        assert not ctx.decisions[name]["quantize"].applied


def test_the_held_out_check_rejects_calibration_that_does_not_represent_the_data() -> None:
    """The first half (scale 0.01) chooses the activation ranges, the second (scale 1) checks:
    held out, static INT8 saturates; the pass is reverted with the held-out error."""
    calibration = [batch(1, 0.01), batch(2, 0.01), batch(3), batch(4)]
    opt = graphopt.optimize(convnet(), target=NO_VNNI, calibration=calibration,
                            measure=False)
    info = opt.plan.optimization
    assert info.held_out_batches == 2
    assert "quantize" not in info.passes_applied
    reverted = {r.name: r.reason for r in info.passes_reverted}
    assert "held-out" in reverted["quantize"]
    feed = batch(21)
    assert rel_err(run(convnet(), feed), run(opt.onnx_model, feed)) < 1e-4


def test_representative_calibration_keeps_the_static_convs() -> None:
    opt = graphopt.optimize(convnet(), target=NO_VNNI, calibration=CALIBRATION, measure=False)
    info = opt.plan.optimization
    assert "quantize" in info.passes_applied
    assert sum(n.op_type == "QuantizeLinear" for n in opt.onnx_model.graph.node) >= len(DENSE)
    feed = batch(31)
    assert rel_err(run(convnet(), feed), run(opt.onnx_model, feed)) < \
        tolerance_for("int8").rel_to_scale
