"""Issue 31, items 2, 3 and 5: ONNX files as other tools write them.

- Paddle's exporter writes ``-1`` for a free dim and keeps weights in ``Constant`` nodes;
- ONNX Runtime's ``quantize_dynamic`` writes uint8 weights under ``ConvInteger`` and
  ``MatMulInteger``.

Each model is built here the way those tools write it, then planned and optimized; the
optimized model runs in ONNX Runtime against the original on the same inputs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import graphopt
from graphopt.frontends.onnx_frontend import load_onnx


def _paddle_style(path: Path) -> Path:
    """x[-1, 64] @ W + b -> Relu, W and b in Constant nodes, the batch dim written as -1."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 64)).astype(np.float32)
    b = rng.standard_normal(64).astype(np.float32)
    nodes = [helper.make_node("Constant", [], ["W"], value=numpy_helper.from_array(w, "Wc")),
             helper.make_node("Constant", [], ["B"], value=numpy_helper.from_array(b, "Bc")),
             helper.make_node("MatMul", ["x", "W"], ["h"]),
             helper.make_node("Add", ["h", "B"], ["h2"]),
             helper.make_node("Relu", ["h2"], ["y"])]
    graph = helper.make_graph(
        nodes, "paddle", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 64])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def _ort_quantized(tmp: Path) -> Path:
    """A conv + linear model through ORT's own quantize_dynamic (uint8 weights)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.conv, self.fc = torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.Linear(1024, 32)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(torch.relu(self.conv(x)).flatten(1))

    float_path, q_path = tmp / "float.onnx", tmp / "q.onnx"
    torch.onnx.export(Net().eval(), (torch.randn(1, 3, 8, 8),), float_path, dynamo=False,
                      input_names=["x"])
    quantize_dynamic(float_path, q_path, weight_type=QuantType.QUInt8)
    return q_path


def _run(model: onnx.ModelProto | Path, x: np.ndarray) -> np.ndarray:
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


def test_a_minus_one_dim_is_a_free_dim(tmp_path: Path) -> None:
    path = _paddle_style(tmp_path / "m.onnx")
    before = path.read_bytes()
    graph = load_onnx(path)
    assert graph.tensors["x"].shape == ("x_0", 64)
    plan = graphopt.plan(path, target="cpu", dynamic_shapes={"x_0": (1, 32, 64)})
    mm = next(n for n in plan.nodes if n.op_type == "MatMul")
    assert mm.analysis.dims.get("M") == 32, mm.analysis.dims
    opt = graphopt.optimize(path, target="cpu", dynamic_shapes={"x_0": (1, 8, 64)})
    x = np.random.default_rng(1).standard_normal((5, 64)).astype(np.float32)
    np.testing.assert_allclose(_run(opt.onnx_model, x), _run(path, x), rtol=1e-5, atol=1e-5)
    assert path.read_bytes() == before  # the user's file is never changed


def test_constant_node_weights_are_quantized_as_weights(tmp_path: Path) -> None:
    path = _paddle_style(tmp_path / "m.onnx")
    opt = graphopt.optimize(path, target="cpu", quantize="int8",
                            dynamic_shapes={"x_0": (1, 8, 64)})
    mm = next(n for n in opt.plan.nodes if n.op_type == "MatMul")
    decision = mm.decisions["quantize"]
    assert "not a constant initializer" not in decision.reason
    assert decision.applied, decision.reason
    assert any(n.op_type == "MatMulInteger" for n in opt.onnx_model.graph.node)
    x = np.random.default_rng(2).standard_normal((8, 64)).astype(np.float32)
    ref, out = _run(path, x), _run(opt.onnx_model, x)
    assert np.abs(ref - out).max() <= 5e-2 * np.abs(ref).max()


def test_a_pre_quantized_model_plans_and_optimizes(tmp_path: Path) -> None:
    path = _ort_quantized(tmp_path)
    plan = graphopt.plan(path, target="cpu")
    assert plan.quantization.original_format == "int8"
    kinds = {n.op_type: n.analysis.kernel_class.value for n in plan.nodes}
    assert kinds["MatMulInteger"] == "quant_dot" and kinds["ConvInteger"] == "conv"
    opt = graphopt.optimize(path, target="cpu")
    x = np.random.default_rng(3).standard_normal((1, 3, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(_run(opt.onnx_model, x), _run(path, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dims", [[-1, 64], [-1, -1]])
def test_load_names_each_free_dim(tmp_path: Path, dims: list[int]) -> None:
    path = _paddle_style(tmp_path / "m.onnx")
    model = onnx.load(path)
    for d, v in zip(model.graph.input[0].type.tensor_type.shape.dim, dims, strict=True):
        d.dim_value = v
    onnx.save(model, path)
    shape = load_onnx(path).tensors["x"].shape
    assert shape == tuple(f"x_{i}" if v < 0 else v for i, v in enumerate(dims))


def _rate_model(path: Path) -> Path:
    """y = reshape(x, [1, (sr // 1000) * 4]): runs only when sr // 1000 * 4 == x's width (64),
    i.e. at a 16 kHz rate; the made-up 0/1 integers make it fail."""
    nodes = [helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(
                np.array(1000, dtype=np.int64), "kc")),
             helper.make_node("Constant", [], ["four"], value=numpy_helper.from_array(
                 np.array(4, dtype=np.int64), "fc")),
             helper.make_node("Constant", [], ["one"], value=numpy_helper.from_array(
                 np.array([1], dtype=np.int64), "oc")),
             helper.make_node("Div", ["sr", "k"], ["khz"]),
             helper.make_node("Mul", ["khz", "four"], ["w"]),
             helper.make_node("Unsqueeze", ["w", "zero"], ["w1"]),
             helper.make_node("Concat", ["one", "w1"], ["shape"], axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["y"])]
    zero = numpy_helper.from_array(np.array([0], dtype=np.int64), "zero")
    graph = helper.make_graph(
        nodes, "rate", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 64]),
                        helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=[zero])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_a_sample_rate_input_gets_a_rate(tmp_path: Path) -> None:
    opt = graphopt.optimize(_rate_model(tmp_path / "rate.onnx"), target="cpu")
    assert opt.plan.optimization.sample_values == {"sr": 16000}
    assert all(n["within"] for n in opt.numerics)


def test_when_no_made_up_input_fits_the_error_asks_for_real_ones(tmp_path: Path) -> None:
    """A width that must be a multiple of 1,000,003: no size a search tries."""
    target = numpy_helper.from_array(np.array([-1, 1000003], dtype=np.int64), "target")
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "target"], ["y"])], "odd",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=[target])
    path = tmp_path / "odd.onnx"
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    with pytest.raises(graphopt.GraphoptError, match="no made-up input ran the model") as e:
        graphopt.optimize(path, target="cpu")
    assert "calibration" in str(e.value)


def test_a_pass_that_breaks_the_model_is_reverted_alone(tmp_path: Path) -> None:
    """A pass whose model fails the checker (an unsorted graph) or does not load in ORT is
    reverted with its reason; the passes around it still apply."""
    from graphopt.backends.driver import Pass
    from graphopt.backends.onnx.pipeline import default_passes, optimize_onnx
    from graphopt.ir.options import Options

    def unsorted(model: onnx.ModelProto, ctx: object) -> onnx.ModelProto:
        out = onnx.ModelProto()
        out.CopyFrom(model)
        nodes = list(out.graph.node)
        del out.graph.node[:]
        out.graph.node.extend(reversed(nodes))
        return out

    def unloadable(model: onnx.ModelProto, ctx: object) -> onnx.ModelProto:
        out = onnx.ModelProto()
        out.CopyFrom(model)
        out.graph.node[0].op_type = "NoSuchOp"
        return out

    path = _paddle_style(tmp_path / "m.onnx")
    passes = [Pass("unsorted", unsorted), Pass("unloadable", unloadable),
              *default_passes()]
    done = optimize_onnx(path, "cpu", Options(quantize="int8"), passes=passes,
                         dynamic_shapes={"x_0": (1, 8, 64)})
    reverted = {r.name: r.reason for r in done.report.passes_reverted}
    assert "does not run or check" in reverted["unsorted"]
    assert "NoSuchOp" in reverted["unloadable"]
    assert "quantize" in done.report.passes_applied


def _ort_formats(tmp: Path) -> dict[str, Path]:
    """One small conv + linear model in ORT's QDQ and QOperator static formats, and a
    bias-free MLP through ORT's MatMulNBits quantizer (4-bit blocks of 32)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    class Batches(CalibrationDataReader):
        def __init__(self) -> None:
            self.left = [{"x": np.random.default_rng(i).standard_normal((1, 3, 8, 8))
                          .astype(np.float32)} for i in range(2)]

        def get_next(self) -> dict[str, np.ndarray] | None:
            return self.left.pop() if self.left else None

    float_path = _ort_quantized(tmp).with_name("float.onnx")
    out = {}
    for fmt in (QuantFormat.QDQ, QuantFormat.QOperator):
        out[fmt.name] = tmp / f"{fmt.name}.onnx"
        quantize_static(float_path, out[fmt.name], Batches(), quant_format=fmt)

    class Mlp(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.a = torch.nn.Linear(256, 256, bias=False)
            self.b = torch.nn.Linear(256, 256, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(torch.relu(self.a(x)))

    torch.onnx.export(Mlp().eval(), (torch.randn(1, 4, 256),), tmp / "mlp.onnx", dynamo=False,
                      input_names=["x"])
    quantizer = MatMulNBitsQuantizer(onnx.load(tmp / "mlp.onnx"), block_size=32,
                                     is_symmetric=True)
    quantizer.process()
    out["NBITS"] = tmp / "nbits.onnx"
    onnx.save(quantizer.model.model, out["NBITS"])
    return out


def test_quantized_op_families_are_costed_at_their_bits(tmp_path: Path) -> None:
    files = _ort_formats(tmp_path)
    want = {"QDQ": ("Conv", "conv", "int8"), "QOperator": ("QLinearConv", "conv", "int8"),
            "NBITS": ("MatMulNBits", "quant_gemm", "int4")}
    for fmt, (op, kernel_class, dtype) in want.items():
        plan = graphopt.plan(files[fmt], target="h100")
        node = next(n for n in plan.nodes if n.op_type == op)
        assert (node.analysis.kernel_class.value, node.analysis.dtype) == (kernel_class, dtype)
        assert plan.quantization.original_format == dtype, fmt
    nbits = graphopt.plan(files["NBITS"], target="h100")
    assert [dict(n.analysis.dims) for n in nbits.nodes if n.op_type == "MatMulNBits"] == \
        [{"M": 4, "N": 256, "K": 256, "batch": 1}] * 2
    qgemm = next(n for n in graphopt.plan(files["QOperator"], target="h100").nodes
                 if n.op_type == "QGemm")
    assert dict(qgemm.analysis.dims) == {"M": 1, "N": 32, "K": 1024, "batch": 1}
    for path in files.values():  # kept as they are; the result matches the file in ORT
        opt = graphopt.optimize(path, target="cpu")
        assert all(n["within"] for n in opt.numerics)
