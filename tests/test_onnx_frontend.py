"""ONNX frontend: small models built with onnx.helper and one torch export, loaded into the IR
(ops, attribute defaults, shapes, tensor kinds, names, warnings).

Models on disk (external data, unsafe paths) and every bad input are in
test_onnx_frontend_files.py; the shared helpers are in tests/onnx_frontend_models.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphopt.frontends.onnx_attrs import SUBGRAPH
from graphopt.frontends.onnx_frontend import load_onnx
from tests.onnx_frontend_models import F, init, load, make, matmul_add, rng_array, vi

# ---------------------------------------------------------------- graphs that load


def test_matmul_add_shapes_kinds_and_dynamic_dim() -> None:
    g = load(matmul_add())
    assert [n.op_type for n in g.nodes] == ["MatMul", "Add"]
    assert [n.source_op for n in g.nodes] == ["MatMul", "Add"]
    assert [n.name for n in g.nodes] == ["mm", "add"]
    assert g.source == "onnx" and g.name == "g"
    assert g.inputs == ["X"] and g.outputs == ["Y"]
    x, w, b = g.tensors["X"], g.tensors["W"], g.tensors["B"]
    assert (x.kind, x.shape, x.dtype) == ("input", ("N", 4), "fp32")
    assert (w.kind, w.shape, w.dtype) == ("param", (4, 8), "fp32")
    assert b.kind == "param"
    assert g.tensors["H"].shape == ("N", 8) and g.tensors["H"].kind == "activation"
    assert g.tensors["Y"].shape == ("N", 8)  # inferred: the model stored no output shape
    assert g.warnings == []
    assert isinstance(g.source_model, onnx.ModelProto)


def test_gemm_trans_b_and_defaults() -> None:
    m = make([helper.make_node("Gemm", ["A", "W", "C"], ["Y"], transB=1)],
             [vi("A", [2, 4])], [vi("Y", [2, 8])],
             [init("W", rng_array(8, 4)), init("C", rng_array(8))])
    (node,) = load(m).nodes
    assert node.op_type == "Gemm"
    assert node.attrs == {"transA": 0, "transB": 1, "alpha": 1.0, "beta": 1.0}


def test_conv_groups_and_window_defaults() -> None:
    m = make([helper.make_node("Conv", ["X", "W"], ["Y"], group=4)],
             [vi("X", [1, 8, 16, 16])], [vi("Y", None)], [init("W", rng_array(8, 2, 3, 3))])
    g = load(m)
    a = g.nodes[0].attrs
    assert a["group"] == 4 and a["kernel_shape"] == [3, 3]
    assert a["strides"] == [1, 1] and a["dilations"] == [1, 1] and a["pads"] == [0, 0, 0, 0]
    assert g.tensors["Y"].shape == (1, 8, 14, 14)


@pytest.mark.parametrize(("mode", "pads"), [("SAME_UPPER", [1, 1, 2, 2]),
                                            ("SAME_LOWER", [2, 2, 1, 1])])
def test_conv_auto_pad_becomes_explicit_pads(mode: str, pads: list[int]) -> None:
    # ceil(15 / 2) = 8 outputs need (8 - 1) * 2 + 4 - 15 = 3 padded elements per axis.
    m = make([helper.make_node("Conv", ["X", "W"], ["Y"], strides=[2, 2], auto_pad=mode)],
             [vi("X", [1, 3, 15, 15])], [vi("Y", None)], [init("W", rng_array(6, 3, 4, 4))])
    g = load(m)
    assert g.nodes[0].attrs["pads"] == pads
    assert g.tensors["Y"].shape == (1, 6, 8, 8)


def test_softmax_layernorm_transpose_defaults() -> None:
    m = make([helper.make_node("Softmax", ["X"], ["S"]),
              helper.make_node("LayerNormalization", ["S", "g", "b"], ["L"]),
              helper.make_node("LayerNormalization", ["L", "g", "b"], ["L2"], axis=1,
                               epsilon=1e-6),
              helper.make_node("Transpose", ["L2"], ["T"])],
             [vi("X", [2, 3, 8])], [vi("T", None)],
             [init("g", np.ones(8, np.float32)), init("b", np.zeros(8, np.float32))])
    g = load(m)
    soft, ln, ln2, tr = g.nodes
    assert soft.attrs == {"axis": -1}
    assert ln.attrs == {"axis": -1, "epsilon": 1e-5}
    assert ln2.attrs["axis"] == 1 and ln2.attrs["epsilon"] == pytest.approx(1e-6)
    assert tr.attrs["perm"] == [2, 1, 0]
    assert g.tensors["T"].shape == (8, 3, 2)


def test_reduce_axes_from_input_attribute_constant_and_dynamic() -> None:
    axes_node = helper.make_node("Constant", [], ["ax"], value_ints=[-1])
    m = make([helper.make_node("ReduceMean", ["X", "axes1"], ["R1"]),
              axes_node,
              helper.make_node("ReduceSum", ["X", "ax"], ["R2"], keepdims=0),
              helper.make_node("ReduceMax", ["X"], ["R3"]),
              helper.make_node("ReduceMin", ["X", "dyn"], ["R4"])],
             [vi("X", [2, 3, 4]), vi("dyn", [1], TensorProto.INT64)],
             [vi("R1", None), vi("R2", None), vi("R3", None), vi("R4", None)],
             [init("axes1", np.array([1], np.int64))], opset=18)
    g = load(m)
    assert [n.op_type for n in g.nodes] == ["ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin"]
    r1, r2, r3, r4 = (n.attrs for n in g.nodes)
    assert (r1["axes"], r1["keepdims"]) == ([1], 1)
    assert (r2["axes"], r2["keepdims"]) == ([-1], 0)
    assert r3["axes"] is None and r4["axes"] is None
    assert g.tensors["axes1"].kind == "constant" and g.tensors["ax"].kind == "constant"
    assert g.tensors["ax"].shape == (1,) and g.tensors["ax"].dtype == "int64"
    assert g.tensors["R1"].shape == (2, 1, 4) and g.tensors["R2"].shape == (2, 3)
    assert g.inputs == ["X", "dyn"]
    assert any("not constant" in w and "ReduceMin" in w for w in g.warnings)


def test_contrib_and_custom_ops() -> None:
    m = make([helper.make_node("FusedMatMul", ["X", "W"], ["H"], domain="com.microsoft",
                               transB=1, alpha=0.5),
              helper.make_node("SimplifiedLayerNormalization", ["H", "s"], ["N"],
                               domain="com.microsoft"),
              helper.make_node("Foo", ["N"], ["Y"], domain="my.domain", color="red")],
             [vi("X", [2, 4])], [vi("Y", None)],
             [init("W", rng_array(8, 4)), init("s", np.ones(8, np.float32))],
             domains=("com.microsoft", "my.domain"))
    g = load(m)
    mm, norm, foo = g.nodes
    assert (mm.op_type, mm.source_op) == ("MatMul", "com.microsoft::FusedMatMul")
    assert mm.attrs["transB"] == 1 and mm.attrs["transA"] == 0
    assert mm.attrs["alpha"] == pytest.approx(0.5)
    assert (norm.op_type, norm.source_op) == ("RMSNormalization",
                                              "com.microsoft::SimplifiedLayerNormalization")
    assert norm.attrs["axis"] == -1
    assert foo.op_type == foo.source_op == "my.domain::Foo"
    assert foo.attrs == {"color": "red"}
    assert any("my.domain::Foo" in w for w in g.warnings)


def test_unnamed_and_duplicate_names_are_made_unique() -> None:
    m = make([helper.make_node("Relu", ["X"], ["a"], name=""),
              helper.make_node("Relu", ["a"], ["b"], name=""),
              helper.make_node("Relu", ["b"], ["c"], name="dup"),
              helper.make_node("Relu", ["c"], ["d"], name="dup"),
              helper.make_node("Relu", ["d"], ["e"], name="Relu_1")],
             [vi("X", [4])], [vi("e", None)])
    g = load(m)
    names = [n.name for n in g.nodes]
    assert names == ["Relu_0", "Relu_1_1", "Relu_2", "Relu_3", "Relu_1"]
    assert [n.name for n in g.source_model.graph.node] == names  # the copy, not the user's


def test_unsorted_nodes_are_sorted() -> None:
    m = make([helper.make_node("Relu", ["a"], ["b"], name="second"),
              helper.make_node("Relu", ["X"], ["a"], name="first")],
             [vi("X", [4])], [vi("b", None)])
    g = load(m)
    assert [n.name for n in g.nodes] == ["first", "second"]
    assert g.tensors["b"].shape == (4,)  # shape inference saw the sorted order
    assert any("topological" in w for w in g.warnings)


def test_dtypes_and_param_constant_rule() -> None:
    m = make([helper.make_node("Cast", ["X"], ["Xf"], to=F),
              helper.make_node("Reshape", ["Xf", "shape"], ["R"]),
              helper.make_node("Mul", ["R", "scale"], ["M"]),
              helper.make_node("Identity", ["q"], ["Q"])],
             [vi("X", [2, 4], TensorProto.FLOAT16)], [vi("M", None), vi("Q", None)],
             [init("shape", np.array([4, 2], np.int64)), init("scale", np.array(2.0, np.float32)),
              init("q", np.arange(4, dtype=np.int8))])
    g = load(m)
    assert g.tensors["X"].dtype == "fp16"
    assert (g.tensors["shape"].kind, g.tensors["shape"].dtype) == ("constant", "int64")
    assert (g.tensors["scale"].kind, g.tensors["scale"].shape) == ("constant", ())
    assert (g.tensors["q"].kind, g.tensors["q"].dtype) == ("param", "int8")
    assert g.tensors["R"].shape == (4, 2) and g.tensors["M"].dtype == "fp32"


def test_initializers_listed_as_inputs_are_params() -> None:
    m = matmul_add()
    m.graph.input.extend([vi("W", [4, 8]), vi("B", [8])])  # IR < 4 exports did this
    g = load(m)
    assert g.inputs == ["X"] and g.tensors["W"].kind == "param"


def _if_model(then_nodes: list) -> onnx.ModelProto:
    then = helper.make_graph(then_nodes, "then", [], [vi("t", [4])])
    other = helper.make_graph([helper.make_node("Neg", ["X"], ["o"])], "else", [], [vi("o", [4])])
    return make([helper.make_node("If", ["c"], ["Y"], then_branch=then, else_branch=other)],
                [vi("c", [], TensorProto.BOOL), vi("X", [4])], [vi("Y", [4])])


def test_control_flow_bodies_become_graphs() -> None:
    """Each branch is a graph of its own (issue 31, item 8), reading X from the outer scope
    with its shape; the graph attributes keep their marker."""
    g = load(_if_model([helper.make_node("Relu", ["X"], ["t"])]))
    attrs = g.nodes[0].attrs
    assert (attrs["then_branch"], attrs["else_branch"]) == (SUBGRAPH, SUBGRAPH)
    assert [name for name, _ in attrs["bodies"]] == ["then_branch", "else_branch"]
    then = attrs["bodies"][0][1]
    assert [n.op_type for n in then.nodes] == ["Relu"]
    assert then.tensors["X"].shape == (4,) and then.tensors["t"].shape == (4,)
    assert attrs["trip_count"] == 1 and g.warnings == []


def test_a_body_that_does_not_build_is_said_and_left_uncosted() -> None:
    g = load(_if_model([helper.make_node("Relu", ["X"], ["t"]),
                        helper.make_node("Neg", ["X"], ["t"])]))  # t written twice
    assert "bodies" not in g.nodes[0].attrs
    assert any("then_branch: the body could not be analysed" in w and "written twice" in w
               for w in g.warnings)
    assert any(w.startswith("control-flow subgraphs are not analysed") for w in g.warnings)


def test_constant_nodes_become_tensors_classed_like_initializers() -> None:
    weight = numpy_helper.from_array(rng_array(4, 4), "cw")
    m = make([helper.make_node("Constant", [], ["Wc"], value=weight),
              helper.make_node("Constant", [], ["one"], value_float=1.0),
              helper.make_node("MatMul", ["X", "Wc"], ["H"]),
              helper.make_node("Add", ["H", "one"], ["Y"])],
             [vi("X", [2, 4])], [vi("Y", None)])
    g = load(m)
    assert [n.op_type for n in g.nodes] == ["MatMul", "Add"]
    assert (g.tensors["Wc"].kind, g.tensors["Wc"].shape) == ("param", (4, 4))
    assert (g.tensors["one"].kind, g.tensors["one"].shape) == ("constant", ())


def test_contrib_attention_keeps_its_source_op() -> None:
    m = make([helper.make_node("MultiHeadAttention", ["Q", "K", "V"], ["Y"],
                               domain="com.microsoft", num_heads=2)],
             [vi("Q", [1, 5, 8]), vi("K", [1, 5, 8]), vi("V", [1, 5, 8])], [vi("Y", None)],
             domains=("com.microsoft",))
    (node,) = load(m).nodes
    assert (node.op_type, node.source_op) == ("MultiHeadAttention",
                                              "com.microsoft::MultiHeadAttention")
    assert node.attrs == {"num_heads": 2, "scale": None, "is_causal": 0}


def test_local_functions_are_inlined() -> None:
    body = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"])]
    func = helper.make_function("local", "ReluNeg", ["x"], ["y"], body,
                                [helper.make_opsetid("", 17)])
    m = make([helper.make_node("ReluNeg", ["X"], ["Y"], domain="local")],
             [vi("X", [4])], [vi("Y", None)], domains=("local",))
    m.functions.append(func)
    g = load(m)
    assert [n.op_type for n in g.nodes] == ["Relu", "Neg"]
    assert g.tensors["Y"].shape == (4,) and g.warnings == []


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_torch_legacy_export(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(16, 32)
            self.norm = torch.nn.LayerNorm(32)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.softmax(self.norm(torch.relu(self.fc(x))), dim=-1)

    path = tmp_path / "block.onnx"
    torch.onnx.export(Block().eval(), (torch.randn(2, 16),), str(path), dynamo=False,
                      opset_version=17, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    g = load_onnx(path)
    ops = [n.op_type for n in g.nodes]
    assert ops == ["Gemm", "Relu", "LayerNormalization", "Softmax"]
    assert g.name == "main_graph" and g.inputs == ["x"] and g.outputs == ["y"]
    assert g.tensors["x"].shape == ("batch", 16)
    assert g.tensors["y"].shape == ("batch", 32) and g.tensors["y"].dtype == "fp32"
    gemm = g.nodes[0]
    assert gemm.attrs["transB"] == 1 and g.tensors[gemm.inputs[1]].kind == "param"
    assert g.tensors[gemm.inputs[1]].shape == (32, 16)
