"""ORT's dynamic quantizer gets the model without its large bystander initializers
(``backends/onnx/quantize_ort._set_aside``): the result is the same model, byte for byte in
what it computes, with the initializers put back."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from graphopt.backends.onnx import quantize_ort
from graphopt.backends.onnx.quantize_ort import ort_dynamic_int8


def embedding_then_matmul() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((5000, 64)).astype(np.float32)  # 1.28 MB: set aside
    w = rng.standard_normal((64, 48)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["emb", "ids"], ["h"], name="embed"),
         helper.make_node("MatMul", ["h", "w"], ["y"], name="mm")], "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 7, 48])],
        [numpy_helper.from_array(emb, "emb"), numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def run(model: onnx.ModelProto, ids: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"ids": ids})[0]


def test_setting_aside_changes_nothing_the_model_computes(monkeypatch) -> None:
    model = embedding_then_matmul()
    before = model.SerializeToString()
    light, aside = quantize_ort._set_aside(model, ["mm"])
    assert list(aside) == ["emb"] and "emb" in [i.name for i in light.graph.input]
    assert model.SerializeToString() == before  # the caller's model is untouched

    ids = np.random.default_rng(1).integers(0, 5000, (2, 7))
    fast = ort_dynamic_int8(model, ["mm"], reduce_range=False)
    monkeypatch.setattr(quantize_ort, "_ASIDE_BYTES", 1 << 62)  # nothing set aside
    plain = ort_dynamic_int8(model, ["mm"], reduce_range=False)
    assert [i.name for i in fast.graph.input] == ["ids"]
    assert any(n.op_type == "MatMulInteger" for n in fast.graph.node)
    emb = next(t for t in fast.graph.initializer if t.name == "emb")
    np.testing.assert_array_equal(numpy_helper.to_array(emb),
                                  numpy_helper.to_array(model.graph.initializer[0]))
    np.testing.assert_array_equal(run(fast, ids), run(plain, ids))
    assert model.SerializeToString() == before
