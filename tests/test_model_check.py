"""The ONNX checker on a light copy (``backends/onnx/model_check``): the same shapes inferred
as the checker on the whole model, the same failures caught (a weight whose bytes do not fit
its dims, a node reading a missing tensor), and the weights never copied into a new model."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.checker
import onnx.shape_inference
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphopt.backends.onnx import model_check


def mlp(width: int = 256) -> onnx.ModelProto:
    """x[N, 64] -> MatMul (a 64 x width weight, 64 KB or more: split) -> Relu -> MatMul."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((64, width)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((width, 8)).astype(np.float32), "w2")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
         helper.make_node("Relu", ["h"], ["r"], name="relu"),
         helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2")],
        "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w1, w2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def test_the_light_check_infers_what_the_whole_check_does() -> None:
    model = mlp()
    whole = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True,
                                              data_prop=True)
    onnx.checker.check_model(whole, full_check=True)
    weights = [t.SerializeToString() for t in model.graph.initializer]
    got, problem = model_check.check(model)
    assert problem is None and got is model  # annotated in place, not copied
    assert [t.SerializeToString() for t in got.graph.initializer] == weights
    assert [v.SerializeToString() for v in got.graph.value_info] == \
        [v.SerializeToString() for v in whole.graph.value_info]
    assert [o.SerializeToString() for o in got.graph.output] == \
        [o.SerializeToString() for o in whole.graph.output]
    assert got.graph.output[0].type.tensor_type.shape.dim[1].dim_value == 8


def test_a_weight_whose_bytes_do_not_fit_its_dims_fails() -> None:
    model = mlp()
    w1 = model.graph.initializer[0]
    w1.raw_data = w1.raw_data[:-4]  # one float short of its 64 x 256
    got, problem = model_check.check(model)
    assert got is None and "raw_data size" in problem and "w1" in problem


def test_a_node_reading_a_missing_tensor_fails() -> None:
    model = mlp()
    model.graph.node[1].input[0] = "nowhere"
    got, problem = model_check.check(model)
    assert got is None and "relu" in problem


@pytest.mark.parametrize("width", [8, 256])  # nothing split, and a split weight
def test_finalize_returns_a_checked_model_that_runs(width: int) -> None:
    import onnxruntime as ort

    model = mlp(width)
    final = model_check.finalize(model)
    onnx.checker.check_model(final, full_check=True)
    sess = ort.InferenceSession(final.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.ones((3, 64), np.float32)
    w1, w2 = (numpy_helper.to_array(t) for t in model.graph.initializer)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], np.maximum(x @ w1, 0) @ w2,
                               rtol=1e-5, atol=1e-4)
