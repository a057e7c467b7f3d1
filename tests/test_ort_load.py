"""Sessions with the large weights handed to ONNX Runtime in memory (``files/ort_load``):
the same outputs as a session of the whole serialized model, the caller's proto unchanged, and
the buffers kept alive by the session."""

from __future__ import annotations

import gc

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from graphopt.backends.onnx.ort_runner import OrtModel
from graphopt.files.ort_load import (
    IN_MEMORY_BYTES,
    KEEP_ATTR,
    in_memory_session,
    split_weights,
)


def model_with_weights() -> onnx.ModelProto:
    """An embedding (int64 ids), a fp32 MatMul weight, an fp16 one, a small bias, an int64
    shape constant: large and small tensors of several types."""
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((4000, 64)).astype(np.float32)  # 1 MB: in memory
    w = rng.standard_normal((64, 300)).astype(np.float32)  # 77 KB: in memory
    w16 = rng.standard_normal((300, 64)).astype(np.float16)  # 38 KB: serialized
    bias = rng.standard_normal(64).astype(np.float32)
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["h"]),
             helper.make_node("MatMul", ["h", "w"], ["a"]),
             helper.make_node("Cast", ["a"], ["a16"], to=TensorProto.FLOAT16),
             helper.make_node("MatMul", ["a16", "w16"], ["b16"]),
             helper.make_node("Cast", ["b16"], ["b"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["b", "bias"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5, 64])],
        [numpy_helper.from_array(emb, "emb"), numpy_helper.from_array(w, "w"),
         numpy_helper.from_array(w16, "w16"), numpy_helper.from_array(bias, "bias")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_same_outputs_as_the_serialized_model() -> None:
    model = model_with_weights()
    before = model.SerializeToString()
    ids = np.random.default_rng(1).integers(0, 4000, (2, 5))
    light, arrays = split_weights(model)
    assert sorted(arrays) == ["emb", "w"]  # at least IN_MEMORY_BYTES each
    assert all(a.nbytes >= IN_MEMORY_BYTES for a in arrays.values())
    assert light.ByteSize() < 60_000 < model.ByteSize()
    assert model.SerializeToString() == before  # the caller's model is unchanged
    plain = ort.InferenceSession(before, providers=["CPUExecutionProvider"])
    session = in_memory_session(model, None, ["CPUExecutionProvider"])
    gc.collect()  # the arrays ORT reads live as long as the session
    assert getattr(session, KEEP_ATTR)[0].keys() == arrays.keys()
    np.testing.assert_array_equal(session.run(None, {"ids": ids})[0],
                                  plain.run(None, {"ids": ids})[0])
    via_runner = OrtModel(model).run({"ids": ids})[0]
    np.testing.assert_array_equal(via_runner, plain.run(None, {"ids": ids})[0])


def test_an_overridable_initializer_is_serialized() -> None:
    """A weight that is also a graph input (the caller may feed it) stays in the proto."""
    model = model_with_weights()
    model.graph.input.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [64, 300]))
    _, arrays = split_weights(model)
    assert sorted(arrays) == ["emb"]
