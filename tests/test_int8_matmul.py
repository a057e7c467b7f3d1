"""graphopt's dynamic INT8 MatMuls (``backends/onnx/int8_matmul``) against ONNX Runtime's
``quantize_dynamic`` (``quantize_ort.ort_dynamic_int8``): the same nodes with the same names,
the same initializer values, and the same outputs in ONNX Runtime, on a hand-built graph with
every case the writer handles and on GPT-2 as torch exports it."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import graphopt
from graphopt.backends.onnx import quantize, quantize_ort
from graphopt.backends.onnx.int8_matmul import dynamic_int8_matmuls, quantized_weight
from graphopt.backends.onnx.quantize import _gemms_as_matmuls
from graphopt.backends.onnx.quantize_ort import ort_dynamic_int8
from graphopt.frontends.onnx_export import export_torch
from tests.arch_zoo import build

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning",
                                        "ignore::DeprecationWarning")


def many_cases() -> onnx.ModelProto:
    """Two MatMuls sharing an activation, a weight shared with a MatMul left in float, an
    unnamed MatMul, an all-zero column, large weights, and a MatMul reading another's output."""
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((16, 8)).astype(np.float32)
    w1[:, 3] = 0.0
    w2 = (rng.standard_normal((16, 4)) * 1e3).astype(np.float32)
    w3 = rng.standard_normal((8, 5)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["y1"], name="mm1"),
             helper.make_node("MatMul", ["x", "w2"], ["y2"], name="mm2"),
             helper.make_node("MatMul", ["x", "w1"], ["y4"], name=""),
             helper.make_node("Relu", ["y1"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w3"], ["y3"], name="mm3"),
             helper.make_node("MatMul", ["r", "w3"], ["y5"], name="mm5")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 3, 16])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
         for n in ("y1", "y2", "y3", "y4", "y5")],
        [numpy_helper.from_array(w, n) for w, n in ((w1, "w1"), (w2, "w2"), (w3, "w3"))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def node_set(model: onnx.ModelProto) -> list[tuple[object, ...]]:
    return sorted((n.op_type, n.name, tuple(n.input), tuple(n.output),
                   tuple((a.name, helper.get_attribute_value(a)) for a in n.attribute))
                  for n in model.graph.node)


def assert_same(ours: onnx.ModelProto, theirs: onnx.ModelProto,
                feeds: list[dict[str, np.ndarray]]) -> None:
    assert node_set(ours) == node_set(theirs)
    mine = {t.name: numpy_helper.to_array(t) for t in ours.graph.initializer}
    ref = {t.name: numpy_helper.to_array(t) for t in theirs.graph.initializer}
    assert mine.keys() == ref.keys()
    for name, value in ref.items():
        assert mine[name].dtype == value.dtype, name
        np.testing.assert_array_equal(mine[name], value, err_msg=name)
    a, b = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
            for m in (ours, theirs))
    for feed in feeds:
        for x, y in zip(a.run(None, feed), b.run(None, feed), strict=True):
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("reduce_range", [True, False])
def test_the_same_graph_as_onnxruntimes_quantizer(reduce_range: bool) -> None:
    model = many_cases()
    before = model.SerializeToString()
    picked = ["mm1", "mm2", "mm3"]
    ours = dynamic_int8_matmuls(model, picked, reduce_range=reduce_range)
    theirs = ort_dynamic_int8(model, picked, reduce_range=reduce_range)
    rng = np.random.default_rng(1)
    feeds = [{"x": (rng.standard_normal((2, 3, 16)) * s).astype(np.float32)} for s in (1, 50)]
    assert_same(ours, theirs, feeds)
    assert model.SerializeToString() == before  # the input model is untouched
    ops = [n.op_type for n in ours.graph.node]
    assert ops.count("DynamicQuantizeLinear") == 2  # x once for two MatMuls, and r
    assert ops.count("DequantizeLinear") == 2  # w1 and w3 are still read in float
    assert "w1" not in {t.name for t in ours.graph.initializer}


def test_weights_quantize_as_onnxruntime_computes_them() -> None:
    """Column by column through ORT's own ``quantize_data``: scale and integers equal."""
    from onnxruntime.quantization.quant_utils import quantize_data

    rng = np.random.default_rng(2)
    w = rng.standard_normal((40, 6)).astype(np.float32) * np.array([1, 1e-3, 1e4, 0, 1, 7],
                                                                    np.float32)
    w[:, 4] = np.abs(w[:, 4])  # a column without negatives
    for reduce_range in (True, False):
        q, scale = quantized_weight(w, reduce_range)
        for c in range(w.shape[1]):
            zp, s, qc = quantize_data(w[:, c], TensorProto.INT8, True, reduce_range=reduce_range)
            assert zp == 0 and s.dtype == scale.dtype == np.float32
            assert s == scale[c], (c, s, scale[c])
            np.testing.assert_array_equal(qc, q[:, c])


def test_gpt2_export_quantizes_as_onnxruntime_does() -> None:
    model, inputs = build("gpt2")
    proto = export_torch(model, inputs).model
    gemms = {n.name for n in proto.graph.node if n.op_type == "Gemm"}  # GPT-2's Conv1D
    proto = _gemms_as_matmuls(proto, gemms)  # as the int8_dynamic pass does first
    inits = {t.name for t in proto.graph.initializer}
    matmuls = [n.name for n in proto.graph.node if n.op_type == "MatMul" and n.input[1] in inits]
    assert len(matmuls) == 4 * 2 + 1  # four per block, and the tied LM head
    ours = dynamic_int8_matmuls(proto, matmuls, reduce_range=True)
    theirs = ort_dynamic_int8(proto, matmuls, reduce_range=True)
    name = proto.graph.input[0].name
    ids = np.random.default_rng(3).integers(0, 64, tuple(inputs[0].shape)).astype(np.int64)
    assert_same(ours, theirs, [{name: ids}])


def test_optimize_quantizes_through_graphopts_writer(monkeypatch) -> None:
    """The ``int8_dynamic`` pass runs the writer (ORT's quantizer is not called: the ONNX
    frontend raises every model to opset 13, and the pass no longer imports it), and the
    quantized model stays near the original."""
    def not_called(*_: object, **__: object) -> None:
        raise AssertionError("ORT's dynamic quantizer was called")

    calls: list[int] = []
    writer = quantize.dynamic_int8_matmuls

    def spy(*a: object, **k: object) -> object:
        calls.append(1)
        return writer(*a, **k)

    monkeypatch.setattr(quantize_ort, "ort_dynamic_int8", not_called)
    monkeypatch.setattr(quantize, "dynamic_int8_matmuls", spy)
    model, inputs = build("gpt2")
    proto = export_torch(model, inputs).model
    opt = graphopt.optimize(proto, target="cpu", quantize="int8_dynamic", measure=False)
    ops = {n.op_type for n in opt.onnx_model.graph.node}
    assert "MatMulInteger" in ops and "DynamicQuantizeLinear" in ops
    assert calls  # the guard's rounds went through graphopt's writer
    sess = ort.InferenceSession(opt.onnx_model.SerializeToString(),
                                providers=["CPUExecutionProvider"])
    with torch.no_grad():
        want = model(*inputs).numpy()
    got = sess.run(None, {proto.graph.input[0].name: inputs[0].numpy()})[0]
    assert np.allclose(got, want, atol=0.1 * np.abs(want).max())
