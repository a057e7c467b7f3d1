"""Per-op fixed costs in ONNX Runtime, for plans of ``.onnx`` models on a calibrated CPU.

ONNX Runtime pays far less per node than eager torch (no Python, no dispatcher: 1-5 us against
5-50 us), so an ONNX plan cannot use torch's table. Calibration builds one ONNX model holding
a few copies of each common op on small inputs (2 x 16 x 64, an image 2 x 16 x 16 x 16), runs it
with graph optimizations off and ORT's profiler on, exactly as ``graphopt profile`` runs an
``.onnx``, and takes each op type's median kernel time. The profile keeps them under
``ort:<OpType>``; :func:`graphopt.cost.calibrated.for_runtime` swaps them in for ONNX graphs.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

from graphopt.cost.calibrated import ORT_PREFIX
from graphopt.measure.ort_runs import node_times_per_run, profile_options

__all__ = ["bench_model", "ort_fixed_costs"]
_COPIES = 4


def bench_model() -> tuple[Any, dict[str, Any]]:
    """(the bench model, its feeds): every op reads graph inputs or initializers, so the
    copies are independent and each node's time is its own; node ``<Op>_<i>`` is copy ``i``
    of op type ``Op`` (OpenVINO's calibration times the same model)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    f32 = np.float32
    inits = {
        "W": rng.standard_normal((64, 64)).astype(f32), "B": rng.standard_normal(64).astype(f32),
        "W2": rng.standard_normal((32, 64)).astype(f32), "B2": rng.standard_normal(32).astype(f32),
        "K": rng.standard_normal((16, 16, 3, 3)).astype(f32),
        "scale": np.ones(16, f32), "bias": np.zeros(16, f32), "mean": np.zeros(16, f32),
        "var": np.ones(16, f32), "gamma": np.ones(64, f32), "two": np.array(2.0, f32),
        "shape": np.array([2, 16, 4, 16], np.int64), "axes0": np.array([0], np.int64),
        "axes1": np.array([1], np.int64),
        "start": np.array([2], np.int64), "end": np.array([10], np.int64),
        "idx": np.array([0, 3, 5, 7], np.int64),
    }
    ops: dict[str, tuple[str, list[str], dict[str, Any]]] = {
        "Add": ("Add", ["X", "Y"], {}), "Sub": ("Sub", ["X", "Y"], {}),
        "Mul": ("Mul", ["X", "Y"], {}), "Div": ("Div", ["X", "Y"], {}),
        "Pow": ("Pow", ["X", "two"], {}), "Neg": ("Neg", ["X"], {}),
        "Sqrt": ("Sqrt", ["Y"], {}), "Exp": ("Exp", ["X"], {}), "Erf": ("Erf", ["X"], {}),
        "Tanh": ("Tanh", ["X"], {}), "Sigmoid": ("Sigmoid", ["X"], {}),
        "Relu": ("Relu", ["X"], {}), "Equal": ("Equal", ["X", "Y"], {}),
        "Where": ("Where", ["M", "X", "Y"], {}), "Cast": ("Cast", ["X"], {"to": 10}),
        "ReduceMean": ("ReduceMean", ["X"], {"axes": [-1]}),
        "Softmax": ("Softmax", ["X"], {"axis": -1}),
        "LayerNormalization": ("LayerNormalization", ["X", "gamma", "B"], {"axis": -1}),
        "MatMul": ("MatMul", ["X", "W"], {}),
        "Gemm": ("Gemm", ["X2", "W2", "B2"], {"transB": 1}),
        "Transpose": ("Transpose", ["X"], {"perm": [0, 2, 1]}),
        "Reshape": ("Reshape", ["X", "shape"], {}),
        "Unsqueeze": ("Unsqueeze", ["X", "axes1"], {}),
        "Squeeze": ("Squeeze", ["X1", "axes0"], {}),
        "Concat": ("Concat", ["X", "Y"], {"axis": -1}),
        "Gather": ("Gather", ["W", "idx"], {"axis": 0}),
        "Slice": ("Slice", ["X", "start", "end", "axes1"], {}),
        "Conv": ("Conv", ["I", "K"], {"pads": [1, 1, 1, 1]}),
        "BatchNormalization": ("BatchNormalization", ["I", "scale", "bias", "mean", "var"], {}),
        "MaxPool": ("MaxPool", ["I"], {"kernel_shape": [2, 2], "strides": [2, 2]}),
        "GlobalAveragePool": ("GlobalAveragePool", ["I"], {}),
    }
    nodes, outputs = [], []
    for op, (op_type, ins, attrs) in ops.items():
        for i in range(_COPIES):
            out = f"{op}_{i}"
            nodes.append(helper.make_node(op_type, ins, [out], name=out, **attrs))
            outputs.append(onnx.ValueInfoProto(name=out))  # ORT infers each output's type
    inputs = [helper.make_tensor_value_info(n, t, s) for n, t, s in (
        ("X", TensorProto.FLOAT, [2, 16, 64]), ("Y", TensorProto.FLOAT, [2, 16, 64]),
        ("M", TensorProto.BOOL, [2, 16, 64]), ("X1", TensorProto.FLOAT, [1, 16, 64]),
        ("X2", TensorProto.FLOAT, [16, 64]), ("I", TensorProto.FLOAT, [2, 16, 16, 16]))]
    graph = helper.make_graph(nodes, "graphopt_calibrate_ort", inputs, outputs,
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = min(model.ir_version, 9)
    feeds = {"X": rng.standard_normal((2, 16, 64)).astype(f32),
             "Y": np.abs(rng.standard_normal((2, 16, 64))).astype(f32) + 0.1,
             "M": rng.standard_normal((2, 16, 64)) > 0,
             "X1": rng.standard_normal((1, 16, 64)).astype(f32),
             "X2": rng.standard_normal((16, 64)).astype(f32),
             "I": rng.standard_normal((2, 16, 16, 16)).astype(f32)}
    return model, feeds


def ort_fixed_costs(rounds: int = 60, warmup: int = 5, threads: int | None = None
                    ) -> dict[str, float]:
    """``ort:<OpType>`` -> median seconds of one node, measured by ORT's profiler."""
    import onnxruntime as ort


    model, feeds = bench_model()
    with tempfile.TemporaryDirectory() as tmp:
        session = ort.InferenceSession(model.SerializeToString(),
                                       profile_options(str(Path(tmp) / "ort"), threads),
                                       providers=["CPUExecutionProvider"])
        for _ in range(warmup + rounds):
            session.run(None, feeds)
        trace = json.loads(Path(session.end_profiling()).read_text())
    samples: dict[str, list[float]] = defaultdict(list)
    for run in node_times_per_run(trace, warmup):
        for node, seconds in run.items():
            samples[node.rpartition("_")[0]].append(seconds)
    return {ORT_PREFIX + op: statistics.median(ts) for op, ts in sorted(samples.items())}
