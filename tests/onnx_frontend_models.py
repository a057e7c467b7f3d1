"""Helpers shared by the ONNX frontend tests (test_onnx_frontend.py, test_onnx_frontend_files.py):
small models built with onnx.helper, and a load that checks the user's model is left untouched."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from graphopt.frontends.onnx_frontend import load_onnx
from graphopt.ir.graph import Graph

F = TensorProto.FLOAT


def vi(name: str, shape: list[int | str] | None, dtype: int = F) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, shape)


def init(name: str, array: np.ndarray) -> TensorProto:
    return numpy_helper.from_array(array, name)


def make(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto],
         outputs: list[onnx.ValueInfoProto], inits: list[TensorProto] = (),  # type: ignore[assignment]
         opset: int = 17, domains: tuple[str, ...] = ()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def load(model: onnx.ModelProto) -> Graph:
    """Load and check that the user's ModelProto is left exactly as it was."""
    before = model.SerializeToString()
    graph = load_onnx(model)
    assert model.SerializeToString() == before
    return graph


def rng_array(*shape: int) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


def matmul_add() -> onnx.ModelProto:
    return make([helper.make_node("MatMul", ["X", "W"], ["H"], name="mm"),
                 helper.make_node("Add", ["H", "B"], ["Y"], name="add")],
                [vi("X", ["N", 4])], [vi("Y", None)],
                [init("W", rng_array(4, 8)), init("B", rng_array(8))])
