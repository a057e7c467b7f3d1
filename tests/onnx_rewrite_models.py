"""Helpers shared by the ONNX rewrite tests (test_onnx_rewrites.py, test_onnx_quantize.py).

Seeded hand-built ONNX models, a pass context over a plan, ONNX Runtime runs on the CPU and the
error measures the tests compare with; ``tc_guide`` is NVIDIA's tensor-core guide example.
"""

from __future__ import annotations

import zlib

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from graphopt.backends.onnx.context import OnnxContext
from graphopt.decisions.planner import build_plan
from graphopt.frontends.onnx_frontend import load_onnx
from graphopt.hardware.profile import HardwareProfile
from graphopt.hardware.registry import get_target
from graphopt.ir.options import Options


def init(name: str, *shape: int, scale: float | None = None) -> onnx.TensorProto:
    """A seeded Gaussian initializer (seeded by its name: every build of a model is equal)."""
    s = scale if scale is not None else 1 / np.sqrt(np.prod(shape[1:]) if len(shape) > 1 else 4)
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    return numpy_helper.from_array((rng.standard_normal(shape) * s).astype(np.float32), name)


def model(nodes: list[onnx.NodeProto], inputs: dict[str, list], outputs: dict[str, list],
          inits: list[onnx.TensorProto], opset: int = 17) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(k, T.FLOAT, v)
                                       for k, v in inputs.items()],
                          [helper.make_tensor_value_info(k, T.FLOAT, v)
                           for k, v in outputs.items()], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def mlp(rows: int = 64, width: int = 512) -> onnx.ModelProto:
    """A conv branch and four ``width`` x ``width`` MatMul+Relu layers on ``rows`` rows (the
    quantize tests' model: INT8 candidates beside a conv)."""
    nodes = [helper.make_node("Conv", ["img", "cw"], ["cimg"], name="conv")]
    cur = "x"
    for i in range(4):
        nodes += [helper.make_node("MatMul", [cur, f"w{i}"], [f"m{i}"], name=f"mm{i}"),
                  helper.make_node("Relu", [f"m{i}"], [f"r{i}"], name=f"relu{i}")]
        cur = f"r{i}"
    inits = [init(f"w{i}", width, width, scale=1 / np.sqrt(width)) for i in range(4)]
    return model(nodes, {"x": [rows, width], "img": [1, 3, 8, 8]},
                 {cur: [rows, width], "cimg": [1, 8, 6, 6]}, [init("cw", 8, 3, 3, 3), *inits])


def context(m: onnx.ModelProto, target: str | HardwareProfile = "a100", *, dtype: str = "fp32",
            calibration: list | None = None, **options: object
            ) -> tuple[onnx.ModelProto, OnnxContext]:
    graph = load_onnx(m)
    tgt = get_target(target) if isinstance(target, str) else target
    ctx = OnnxContext(build_plan(graph, tgt), tgt, Options(**options),  # type: ignore[arg-type]
                      samples=[], calibration=calibration, compute_dtype=dtype)
    assert graph.source_model is not None
    return graph.source_model, ctx


def run(m: onnx.ModelProto, feeds: dict[str, np.ndarray], level: str = "ORT_ENABLE_ALL"
        ) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    return ort.InferenceSession(m.SerializeToString(), so,
                                providers=["CPUExecutionProvider"]).run(None, feeds)


def rel_err(ref: list[np.ndarray], out: list[np.ndarray]) -> float:
    assert [r.shape for r in ref] == [o.shape for o in out]
    return max(float(np.abs(r - o).max() / np.abs(r).max()) for r, o in zip(ref, out,
                                                                            strict=True))


def rms_err(ref: list[np.ndarray], out: list[np.ndarray]) -> float:
    """Relative RMS error ||ref - out|| / ||ref||, the worst output: quantization noise is
    spread over every element, a max would measure the one outlier past the calibrated range."""
    return max(float(np.linalg.norm(r - o) / np.linalg.norm(r)) for r, o in zip(ref, out,
                                                                                strict=True))


def checked(m: onnx.ModelProto | None) -> onnx.ModelProto:
    assert m is not None
    onnx.checker.check_model(m, full_check=True)
    return m


def inits_of(m: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    return {t.name: tuple(t.dims) for t in m.graph.initializer}


def ops(m: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in m.graph.node]


def producer(m: onnx.ModelProto, tensor: str) -> onnx.NodeProto:
    return next(n for n in m.graph.node if tensor in n.output)


def tc_guide(size: int = 16) -> onnx.ModelProto:
    """NVIDIA's tensor-core guide example: Conv 3->67->129, then Gemm and MatMul 129->251, on
    ``size`` x ``size`` images."""
    nodes = [helper.make_node("Conv", ["x", "c1w", "c1b"], ["c1"], name="conv1", pads=[1] * 4),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "c2w", "c2b"], ["c2"], name="conv2", pads=[1] * 4),
             helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
             helper.make_node("GlobalAveragePool", ["r2"], ["p"], name="gap"),
             helper.make_node("Flatten", ["p"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], name="fc", transB=1),
             helper.make_node("MatMul", ["f", "mw"], ["mm"], name="mm"),
             helper.make_node("Add", ["mm", "mb"], ["y2"], name="add")]
    inits = [init("c1w", 67, 3, 3, 3), init("c1b", 67), init("c2w", 129, 67, 3, 3),
             init("c2b", 129), init("fw", 251, 129), init("fb", 251), init("mw", 129, 251),
             init("mb", 251)]
    return model(nodes, {"x": ["N", 3, size, size]}, {"y": ["N", 251], "y2": ["N", 251]}, inits)
