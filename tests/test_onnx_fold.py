"""Constant folding before shape inference: torch's F.pad chain, and where it must not fold."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphopt.frontends.onnx_fold import fold_constants
from graphopt.frontends.onnx_frontend import load_onnx

I64 = TensorProto.INT64


def const(name: str, values: list[int]) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], name=f"{name}_node",
                            value=numpy_helper.from_array(np.array(values, np.int64), name))


def pad_conv(extra_inputs: list[onnx.ValueInfoProto] = (),  # type: ignore[assignment]
             inits: list[TensorProto] = ()) -> onnx.ModelProto:  # type: ignore[assignment]
    """X -> Pad -> Conv, pads from the chain torch's TorchScript exporter writes for F.pad.

    F.pad(x, (1, 1, 2, 2)): W by 1 on both sides, H by 2: pads [0, 0, 2, 1, 0, 0, 2, 1].
    """
    w = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    nodes = [
        const("n", [4]), const("torch_pads", [1, 1, 2, 2]), const("pair", [-1, 2]),
        const("start", [-1]), const("end", [-(2 ** 62)]), const("axis", [0]),
        const("step", [-1]), const("flat", [-1]),
        helper.make_node("ConstantOfShape", ["n"], ["zeros"], name="cos",
                         value=numpy_helper.from_array(np.array([0], np.int64))),
        helper.make_node("Concat", ["torch_pads", "zeros"], ["cat"], name="concat", axis=0),
        helper.make_node("Reshape", ["cat", "pair"], ["pairs"], name="reshape"),
        helper.make_node("Slice", ["pairs", "start", "end", "axis", "step"], ["rev"],
                         name="slice"),
        helper.make_node("Transpose", ["rev"], ["t"], name="transpose", perm=[1, 0]),
        helper.make_node("Reshape", ["t", "flat"], ["p"], name="reshape_1"),
        helper.make_node("Cast", ["p"], ["pads"], name="cast", to=I64),
        helper.make_node("Pad", ["X", "pads"], ["padded"], name="pad", mode="constant"),
        helper.make_node("Conv", ["padded", "W"], ["Y"], name="conv", kernel_shape=[3, 3]),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 3, 8, 8]),
                     *extra_inputs],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["n", "c", "h", "w"])],
        [numpy_helper.from_array(w, "W"), *inits])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def folded_copy(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out, fold_constants(out)


def compute_ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node if n.op_type != "Constant"]


def test_the_chain_alone_leaves_shapes_symbolic() -> None:
    """The case the folding exists for: ONNX inference (data_prop too) loses the Conv's dims."""
    inferred = onnx.shape_inference.infer_shapes(pad_conv(), data_prop=True).graph
    conv_in = next(vi for vi in inferred.value_info if vi.name == "padded")
    assert not all(d.HasField("dim_value") for d in conv_in.type.tensor_type.shape.dim)


def test_frontend_gives_static_shapes_and_keeps_every_node() -> None:
    model = pad_conv()
    before = model.SerializeToString()
    graph = load_onnx(model)
    assert model.SerializeToString() == before
    conv = graph.node_by_name["conv"]
    assert graph.tensors[conv.inputs[0]].shape == (1, 3, 12, 10)
    assert graph.tensors[conv.outputs[0]].shape == (1, 4, 10, 8)
    # folded in the shape-inference skeleton only: the chain's nodes and names stay
    assert [n.name for n in graph.nodes] == [
        "cos", "concat", "reshape", "slice", "transpose", "reshape_1", "cast", "pad", "conv"]
    assert graph.tensors["pads"].shape == (8,)
    assert [n.name for n in graph.source_model.graph.node] == [
        n.name for n in model.graph.node]


def test_folded_model_runs_like_the_original() -> None:
    ort = pytest.importorskip("onnxruntime")
    model = pad_conv()
    folded, values = folded_copy(model)
    assert compute_ops(folded) == ["Pad", "Conv"]
    assert values["pads"].tolist() == [0, 0, 2, 1, 0, 0, 2, 1]
    onnx.checker.check_model(folded)
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    ref, got = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
                .run(None, {"X": x})[0] for m in (model, folded))
    assert got.shape == (1, 4, 10, 8)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_nothing_folds_from_a_graph_input() -> None:
    """Pads computed from a graph input, and an initializer a graph input overrides, stay."""
    p = helper.make_tensor_value_info("P", I64, [8])
    model = pad_conv([p])
    for n in model.graph.node:
        if n.name == "pad":
            n.input[1] = "P"
    assert folded_copy(model)[1]  # the now-dead chain still folds, on its own constants
    # an initializer listed as a graph input may be overridden at run time: not a constant
    n_vi = helper.make_tensor_value_info("n_init", I64, [1])
    model = pad_conv([n_vi], [numpy_helper.from_array(np.array([4], np.int64), "n_init")])
    for n in model.graph.node:
        if n.name == "cos":
            n.input[0] = "n_init"
    folded, values = folded_copy(model)
    assert values == {}
    assert folded.SerializeToString() == model.SerializeToString()


@pytest.mark.parametrize("case", ["random", "large", "fails", "log_zero", "graph_output"])
def test_must_not_fold(case: str) -> None:
    shape = [2048] if case == "large" else [3]
    nodes = [const("s", shape), const("bad", [4]),
             helper.make_node("ConstantOfShape", ["s"], ["z"], name="cos")]
    if case == "random":
        nodes.append(helper.make_node("RandomNormalLike", ["z"], ["y"], name="rnd",
                                      dtype=TensorProto.FLOAT))
    elif case == "fails":  # 3 elements cannot be reshaped to 4
        nodes.append(helper.make_node("Reshape", ["z", "bad"], ["y"], name="reshape"))
    elif case == "log_zero":  # -inf: a numpy floating-point error, silent and not folded
        nodes.append(helper.make_node("Log", ["z"], ["y"], name="log"))
    else:
        nodes.append(helper.make_node("Identity", ["z"], ["y"], name="identity"))
    out = "z" if case == "graph_output" else "y"
    graph = helper.make_graph(nodes, "g", [], [helper.make_tensor_value_info(out, 1, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    folded, values = folded_copy(model)
    assert values == {} if case in ("large", "graph_output") else set(values) == {"z"}
    assert compute_ops(folded)[-1] == compute_ops(model)[-1]


@pytest.mark.zoo
def test_torchscript_export_of_mobilenet_v2_has_static_conv_shapes() -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    from graphopt.frontends.onnx_export import export_torch
    from tests.arch_zoo import build

    model, inputs = build("mobilenet_v2")
    graph = load_onnx(export_torch(model, inputs).model)
    convs = [n for n in graph.nodes if n.op_type == "Conv"]
    assert convs and graph.tensors[convs[0].inputs[0]].shape == (2, 3, 33, 33)
    dynamic = [n.name for n in convs
               if not all(isinstance(d, int) for t in (n.inputs[0], n.outputs[0])
                          for d in graph.tensors[t].shape or ("?",))]
    assert dynamic == []
