"""ONNX frontend: small models built with onnx.helper, one torch export, and every bad input."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphopt.errors import GraphoptError, ModelLoadError, UnsafePathError
from graphopt.frontends.onnx_attrs import SUBGRAPH
from graphopt.frontends.onnx_frontend import load_onnx
from graphopt.ir import Graph

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


def test_control_flow_subgraph_is_opaque() -> None:
    then = helper.make_graph([helper.make_node("Relu", ["X"], ["t"])], "then", [], [vi("t", [4])])
    other = helper.make_graph([helper.make_node("Neg", ["X"], ["o"])], "else", [], [vi("o", [4])])
    m = make([helper.make_node("If", ["c"], ["Y"], then_branch=then, else_branch=other)],
             [vi("c", [], TensorProto.BOOL), vi("X", [4])], [vi("Y", [4])])
    g = load(m)
    assert g.nodes[0].attrs == {"then_branch": SUBGRAPH, "else_branch": SUBGRAPH}
    assert any("subgraph" in w for w in g.warnings)


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


# ---------------------------------------------------------------- external data


def save_external(model: onnx.ModelProto, folder: Path) -> Path:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # save_model converts the model it is given to external data
    path = folder / "model.onnx"
    onnx.save_model(copy, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="w.bin", size_threshold=0)
    return path


def test_external_data_loads_weights_and_runs(tmp_path: Path) -> None:
    m = matmul_add()
    path = save_external(m, tmp_path)
    files = {p: p.read_bytes() for p in (path, tmp_path / "w.bin")}
    g = load_onnx(path)
    assert all(p.read_bytes() == data for p, data in files.items())
    assert not any(t.external_data for t in g.source_model.graph.initializer)
    loaded = {t.name: numpy_helper.to_array(t) for t in g.source_model.graph.initializer}
    for t in m.graph.initializer:
        np.testing.assert_array_equal(loaded[t.name], numpy_helper.to_array(t))
    assert g.tensors["W"].kind == "param" and g.name == "g"
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(g.source_model.SerializeToString(),
                                providers=["CPUExecutionProvider"])
    x = rng_array(3, 4)
    (y,) = sess.run(None, {"X": x})
    np.testing.assert_allclose(y, x @ loaded["W"] + loaded["B"], rtol=1e-5, atol=1e-6)


def test_external_data_of_an_in_memory_model(tmp_path: Path) -> None:
    path = save_external(matmul_add(), tmp_path)
    lazy = onnx.load(str(path), load_external_data=False)
    g = load(lazy)
    assert any("external data not loaded" in w for w in g.warnings)
    assert g.tensors["W"].shape == (4, 8)
    g2 = load_onnx(lazy, base_dir=tmp_path)
    assert numpy_helper.to_array(g2.source_model.graph.initializer[0]).shape == (4, 8)


def external_model(folder: Path, locations: list[str]) -> Path:
    """A model whose initializers point at ``locations`` (written by hand, no data check)."""
    m = matmul_add()
    for t, loc in zip(m.graph.initializer, locations, strict=False):
        nbytes = len(t.raw_data)
        t.ClearField("raw_data")
        t.data_location = TensorProto.EXTERNAL
        for key, value in (("location", loc), ("offset", "0"), ("length", str(nbytes))):
            t.external_data.add(key=key, value=value)
    path = folder / "model.onnx"
    path.write_bytes(m.SerializeToString())
    return path


@pytest.mark.parametrize("location", ["../secret.bin", "/etc/passwd", "sub/../../secret.bin"])
def test_external_data_outside_the_folder_is_refused(tmp_path: Path, location: str) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (tmp_path / "secret.bin").write_bytes(b"\0" * 1024)
    with pytest.raises(UnsafePathError) as err:
        load_onnx(external_model(folder, [location]))
    assert err.value.fix


def test_external_data_symlink_escape_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (tmp_path / "secret.bin").write_bytes(b"\0" * 1024)
    os.symlink(tmp_path / "secret.bin", folder / "w.bin")
    with pytest.raises(UnsafePathError):
        load_onnx(external_model(folder, ["w.bin"]))


def test_unsafe_location_is_refused_before_any_missing_file(tmp_path: Path) -> None:
    # The first tensor's file is missing, the second escapes: the escape must be reported.
    with pytest.raises(UnsafePathError):
        load_onnx(external_model(tmp_path, ["missing.bin", "../x.bin"]))


# ---------------------------------------------------------------- bad input


def _valid_file(tmp_path: Path) -> Path:
    path = tmp_path / "ok.onnx"
    onnx.save_model(matmul_add(), str(path))
    return path


def _truncated(tmp_path: Path) -> Path:
    data = _valid_file(tmp_path).read_bytes()
    path = tmp_path / "half.onnx"
    path.write_bytes(data[: len(data) // 2])
    return path


def _random_bytes(seed: int) -> Callable[[Path], Path]:
    def build(tmp_path: Path) -> Path:
        path = tmp_path / f"random{seed}.onnx"
        path.write_bytes(np.random.default_rng(seed).bytes(4096))
        return path
    return build


def _written(model: onnx.ModelProto, name: str = "m.onnx") -> Callable[[Path], Path]:
    def build(tmp_path: Path) -> Path:
        path = tmp_path / name
        path.write_bytes(model.SerializeToString())
        return path
    return build


def _empty(tmp_path: Path) -> Path:
    path = tmp_path / "empty.onnx"
    path.touch()
    return path


def _parses_but_empty(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.onnx"
    path.write_bytes(b"\x08\x07")  # a valid ModelProto (ir_version=7) with no graph
    return path


def _zip(tmp_path: Path) -> Path:
    path = tmp_path / "model.pt"
    path.write_bytes(b"PK\x03\x04" + b"\0" * 100)
    return path


_OPSET11 = make([helper.make_node("Relu", ["X"], ["Y"])], [vi("X", [4])], [vi("Y", [4])],
                opset=11)
_DANGLING = make([helper.make_node("Relu", ["nowhere"], ["Y"])], [vi("X", [4])], [vi("Y", [4])])
_NO_PRODUCER = make([helper.make_node("Relu", ["X"], ["Y"])], [vi("X", [4])], [vi("Z", [4])])
_CYCLE = make([helper.make_node("Add", ["X", "b"], ["a"]), helper.make_node("Relu", ["a"], ["b"])],
              [vi("X", [4])], [vi("b", [4])])
_TWICE = make([helper.make_node("Relu", ["X"], ["Y"]), helper.make_node("Neg", ["X"], ["Y"])],
              [vi("X", [4])], [vi("Y", [4])])
_NO_OPSET = matmul_add()
del _NO_OPSET.opset_import[:]

BAD_INPUTS: dict[str, Callable[[Path], Path]] = {
    "missing": lambda tmp: tmp / "nope.onnx",
    "directory": lambda tmp: tmp,
    "empty": _empty,
    "truncated": _truncated,
    "random0": _random_bytes(0),
    "random1": _random_bytes(1),
    "random2": _random_bytes(2),
    "zip": _zip,
    "parses-but-empty": _parses_but_empty,
    "opset11": _written(_OPSET11),
    "dangling": _written(_DANGLING),
    "no-producer": _written(_NO_PRODUCER),
    "cycle": _written(_CYCLE),
    "written-twice": _written(_TWICE),
    "no-opset": _written(_NO_OPSET),
    "external-missing": lambda tmp: external_model(tmp, ["w.bin", "w.bin"]),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_raises_a_graphopt_error_with_a_fix(tmp_path: Path, case: str) -> None:
    with pytest.raises(GraphoptError) as err:
        load_onnx(BAD_INPUTS[case](tmp_path))
    assert isinstance(err.value, ModelLoadError)
    assert err.value.problem and err.value.fix
    assert err.value.__traceback__ is not None


def test_old_opset_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError) as err:
        load_onnx(_OPSET11)
    assert "opset 11" in err.value.problem and "version_converter" in (err.value.fix or "")


def test_wrong_type_is_a_model_load_error() -> None:
    with pytest.raises(ModelLoadError) as err:
        load_onnx(42)  # type: ignore[arg-type]
    assert err.value.fix


def test_external_data_too_short(tmp_path: Path) -> None:
    path = external_model(tmp_path, ["w.bin", "w.bin"])
    (tmp_path / "w.bin").write_bytes(b"\0" * 8)
    with pytest.raises(ModelLoadError, match="too short") as err:
        load_onnx(path)
    assert err.value.fix
