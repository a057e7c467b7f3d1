"""Shape ranges (issue 11 item 1): plan at min/opt/max, a module that takes the whole range and
matches the original there, symbolic ONNX dims, the CLI form."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from torch.export import Dim

import graphopt
from graphopt.backends.torch.verify import compare_outputs
from graphopt.decisions.tolerance import Tolerance
from graphopt.errors import GraphoptError
from graphopt.frontends.onnx_range import parse_dim_spec
from graphopt.ir.shape_range import DimRange, ShapeRange, evaluate
from tests.zoo import Attention, OddMLP, OddResidualCNN, TransformerBlock

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


def test_dim_expressions_evaluate_like_torch_prints_them():
    v = {"batch": 3, "seq": 10}
    assert evaluate("batch", v) == 3
    assert evaluate("2*seq - 1", v) == 19
    assert evaluate("(seq//4)", v) == 2
    assert evaluate("Max(1, seq - 12)", v) == 1
    assert evaluate("CeilDiv(seq, 4)", v) == 3
    assert evaluate("unknown + 1", v) is None
    assert evaluate("__import__('os')", v) is None  # plain arithmetic only


def test_range_check_names_the_problem():
    rng = ShapeRange((DimRange("batch", 1, 4, 32), DimRange("seq", 2, 8, None)),
                     {"ids": ("batch", "seq"), "mask": ("batch", "seq"), "img": (3, "batch")})
    assert rng.check({"ids": (32, 1000), "mask": (32, 1000)}) is None  # seq is unbounded
    assert "outside [1, 32]" in rng.check({"ids": (33, 8)})
    assert "outside [2, inf]" in rng.check({"ids": (4, 1)})
    assert "static at 3" in rng.check({"img": (4, 4)})
    assert "4 in one input and 5" in rng.check({"ids": (4, 8), "mask": (5, 8)})
    assert ShapeRange.from_dict(rng.to_dict()) == rng


def test_a_plan_over_a_range_costs_min_opt_and_max():
    x = torch.randn(2, 16, 288)
    spec = ({0: Dim("batch", min=1, max=64), 1: Dim("seq", min=4, max=512)},)
    p = graphopt.plan(Attention().eval(), (x,), target="h100", dynamic_shapes=spec)
    rng = p.shape_range
    assert [(d.name, d.min, d.opt, d.max) for d in rng.dims] == [
        ("batch", 1, 2, 64), ("seq", 4, 16, 512)]
    est = rng.est_latency_s
    assert est.min <= est.opt < est.max
    qkv = p.node("linear")
    assert qkv.analysis.dims["M"] == 2 * 16  # decided at opt
    assert qkv.at_points.min.dims["M"] == 1 * 4
    assert qkv.at_points.max.dims["M"] == 64 * 512
    assert qkv.to_dict()["range"]["max"]["flops"] == 64 * 512 * 864 * (2 * 288 + 1)  # + bias
    assert any("batch a multiple of 8" in h for h in rng.hints)
    # the same plan at one shape is the opt point: same decisions, same cost
    static = graphopt.plan(Attention().eval(), (x,), target="h100")
    assert static.est_latency_s == pytest.approx(est.opt, rel=1e-9)
    assert "Shape range" in p.to_markdown() and "Shape range" in p.to_html()


def test_an_unbounded_dim_is_accepted_and_said():
    p = graphopt.plan(OddMLP().eval(), (torch.randn(4, 61),), target="h100",
                      dynamic_shapes=({0: Dim.DYNAMIC},))
    assert p.shape_range.dims[0].max is None
    assert any("no max given" in w for w in p.warnings)


CASES = {
    # padding (carried, sliced) in fp16 over a dynamic batch
    "odd_mlp_pad_fp16": (OddMLP, (torch.randn(4, 61),), {0: Dim("batch", min=1, max=16)},
                         "a100", dict(pad="always", precision="fp16"),
                         [(1, 61), (5, 61), (16, 61)]),
    # padding + channels_last + folded BN, dynamic batch AND image size
    "odd_cnn_pad_layout": (OddResidualCNN, (torch.randn(2, 3, 16, 16),),
                           {0: Dim("batch", min=1, max=8), 2: Dim("h", min=4, max=32),
                            3: Dim("w", min=4, max=32)},
                           "a100", dict(pad="always", layout="channels_last"),
                           [(1, 3, 4, 4), (3, 3, 9, 31), (8, 3, 32, 32)]),
    # attention head-dim padding through symbolic reshapes, bf16 elsewhere
    "transformer_bf16": (TransformerBlock, (torch.randn(2, 10, 288),),
                         {0: Dim("batch", min=1, max=8), 1: Dim("seq", min=2, max=64)},
                         "h100", dict(pad="always"), [(1, 2, 288), (3, 37, 288), (8, 64, 288)]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_module_takes_every_shape_in_the_range_and_matches(case):
    make, args, spec, target, options, shapes = CASES[case]
    torch.manual_seed(0)
    model = make().eval()
    opt = graphopt.optimize(model, args, target=target, dynamic_shapes=(spec,), measure=False,
                            **options)
    applied = opt.info.passes_applied
    assert "padding" in applied, opt.info.notes.get("padding")
    assert all(c.within for c in opt.info.range_checks)
    tol = Tolerance.of(opt.info.tolerance)
    for shape in shapes:
        x = torch.randn(*shape)
        with torch.no_grad():
            result = compare_outputs(model(x), opt.module(x), tol)
        assert all(c.within for c in result), (shape, [c.describe() for c in result])
    top = [d.max for d in opt.plan.shape_range.dims]
    too_big = list(shapes[-1])
    too_big[0] = top[0] + 1
    with pytest.raises(GraphoptError, match=r"outside \[1, \d+\].*optimized for batch in"):
        opt.module(torch.randn(*too_big))


def test_range_decisions_are_the_static_decisions():
    model, x = OddMLP().eval(), torch.randn(4, 61)
    kw = dict(target="a100", pad="always", precision="fp16", measure=False)
    static = graphopt.optimize(model, (x,), **kw)
    ranged = graphopt.optimize(model, (x,), dynamic_shapes=({0: Dim("b", min=1, max=64)},),
                               **kw)

    def padding(o):
        return {n.name: (d.applied, d.detail)
                for n in o.plan.nodes if (d := n.decisions.get("padding"))}

    assert padding(static) == padding(ranged) and padding(static)
    with pytest.raises(GraphoptError, match="built for inputs of shapes"):
        static.module(torch.randn(5, 61))  # the static module still says it is static
    assert ranged.module(torch.randn(5, 61)).shape == (5, 17)


def test_export_onnx_keeps_the_range_symbolic(tmp_path):
    torch.manual_seed(0)
    model, x = Attention().eval(), torch.randn(2, 16, 288)
    opt = graphopt.optimize(model, (x,), target="cpu", measure=False, precision="fp32",
                            dynamic_shapes=(
        {0: Dim("batch", min=1, max=16), 1: Dim("seq", min=2, max=128)},))
    path = opt.export_onnx(tmp_path / "m.onnx")
    proto = onnx.load(str(path))
    dims = [[d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in (*proto.graph.input, *proto.graph.output)]
    assert dims == [["batch", "seq", 288], ["batch", "seq", 288]]
    assert opt.onnx_info.range_samples == 2  # the ONNX checks ran at min and max too
    session = graphopt.ort_session(path)
    for shape in [(1, 2, 288), (3, 45, 288), (16, 128, 288)]:
        y = torch.randn(*shape)
        got = session.run(None, {session.get_inputs()[0].name: y.numpy()})[0]
        want = model(y).detach().numpy()
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


def _symbolic_matmul() -> onnx.ModelProto:
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 64])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 32])
    w = onnx.numpy_helper.from_array(np.random.default_rng(0).standard_normal(
        (64, 32)).astype(np.float32), "w")
    g = onnx.helper.make_graph([onnx.helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
                               "g", [x], [y], [w])
    return onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", 17)],
                                  ir_version=8)  # ONNX Runtime reads IR <= 13


def test_onnx_symbolic_dims_are_planned_and_checked_at_the_users_opt():
    opt = graphopt.optimize(_symbolic_matmul(), target="cpu", measure=False,
                            dynamic_shapes={"N": (1, 48, 256)})
    assert opt.plan.node("mm").analysis.dims["M"] == 48
    shapes = [s["x"][0] for s in opt.info.sample_shapes]
    assert shapes[:2] == [48, 48] and sorted(shapes[2:]) == [1, 256]  # opt, then min and max
    default = graphopt.optimize(_symbolic_matmul(), target="cpu", measure=False)
    assert {s["x"][0] for s in default.info.sample_shapes} == {1}  # the stated default
    assert any("default sizes: N=1" in w for w in default.plan.warnings)
    with pytest.raises(GraphoptError, match="no input of the model has"):
        graphopt.plan(_symbolic_matmul(), target="cpu", dynamic_shapes={"batch": 4})
    with pytest.raises(GraphoptError, match="min <= opt <= max"):
        parse_dim_spec("N", (8, 4, 16))


def test_cli_dynamic_for_onnx_and_python_models(tmp_path):
    onnx.save(_symbolic_matmul(), str(tmp_path / "m.onnx"))
    (tmp_path / "model.py").write_text(textwrap.dedent("""
        import torch

        def build():
            return torch.nn.Sequential(torch.nn.Linear(8, 24)).eval(), (torch.randn(4, 8),)
    """))
    cli = [sys.executable, "-m", "graphopt.cli", "plan"]
    out = subprocess.run([*cli, str(tmp_path / "m.onnx"), "--dynamic", "N=1:64:512"],
                         capture_output=True, text=True, check=True).stdout
    assert "shape range (N 1/64/512)" in out
    spec = f"{tmp_path / 'model.py'}:build"
    out = subprocess.run([*cli, spec, "--dynamic", "input.0=batch:1:64"],
                         capture_output=True, text=True, check=True).stdout
    assert "shape range (batch 1/4/64)" in out
    bad = subprocess.run([*cli, spec, "--dynamic", "batch=1:64"], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "INPUT.AXIS=NAME:MIN:MAX" in bad.stderr


def test_a_range_that_cannot_be_exported_is_said(tmp_path):
    class Branchy(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2 if x.shape[0] > 3 else x  # specializes the batch

    p = graphopt.plan(Branchy(), (torch.randn(4, 8),), target="cpu",
                      dynamic_shapes=({0: Dim("batch", min=1, max=8)},))
    assert any("dynamic_shapes could not be kept" in w for w in p.warnings)
    assert p.shape_range is None
    with pytest.raises(GraphoptError, match="torch.export"):
        graphopt.optimize(Branchy().eval(), (torch.randn(4, 8),), target="cpu",
                          dynamic_shapes=({0: Dim("batch", min=1, max=8)},))


def test_python_spec_can_return_dynamic_shapes(tmp_path: Path):
    (tmp_path / "model.py").write_text(textwrap.dedent("""
        import torch
        from torch.export import Dim

        def build():
            model = torch.nn.Sequential(torch.nn.Linear(8, 24)).eval()
            return model, (torch.randn(4, 8),), ({0: Dim("batch", min=2, max=32)},)
    """))
    p = graphopt.plan(f"{tmp_path / 'model.py'}:build", target="h100")
    assert p.shape_range.dims[0].max == 32


def test_inputs_sharing_a_dim_must_agree():
    class Masked(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            return self.lin(x) * mask

    batch = Dim("batch", min=1, max=32)
    model = Masked().eval()
    opt = graphopt.optimize(model, (torch.randn(4, 8), torch.ones(4, 1)), target="cpu",
                            precision="fp32",  # a host with native bf16 would pick it
                            measure=False, dynamic_shapes=({0: batch}, {0: batch}))
    x, mask = torch.randn(6, 8), torch.ones(6, 1)
    torch.testing.assert_close(opt.module(x, mask), model(x, mask))
    with pytest.raises(GraphoptError, match="batch is 6 in one input and 5"):
        opt.module(x, torch.ones(5, 1))


def test_an_onnx_file_with_symbolic_axes_optimizes_for_a_gpu(tmp_path):
    torch.manual_seed(0)
    model, x = TransformerBlock().eval(), torch.randn(2, 16, 288)
    path = tmp_path / "block.onnx"
    torch.onnx.export(model, (x,), str(path), dynamo=False, opset_version=17,
                      input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "batch", 1: "seq"}, "y": {0: "batch", 1: "seq"}})
    opt = graphopt.optimize(str(path), target="h100", measure=False,
                            dynamic_shapes={"batch": (1, 2, 8), "seq": (1, 16, 64)})
    assert opt.info.passes_applied and opt.info.compute_dtype == "fp16"
    assert sorted({s["x"][1] for s in opt.info.sample_shapes}) == [1, 16, 64]
    session = graphopt.ort_session(opt.export_onnx(tmp_path / "fast.onnx"))
    tol = opt.info.tolerance.rel_to_scale
    for shape in [(1, 1, 288), (3, 40, 288), (8, 64, 288)]:
        y = torch.randn(*shape)
        got = session.run(None, {"x": y.numpy()})[0]
        want = model(y).detach().numpy()
        assert np.abs(got - want).max() <= tol * np.abs(want).max(), shape


def test_runtime_settings_know_the_shapes_vary():
    x = torch.randn(2, 3, 16, 16)
    static = graphopt.plan(OddResidualCNN().eval(), (x,), target="h100")
    ranged = graphopt.plan(OddResidualCNN().eval(), (x,), target="h100",
                           dynamic_shapes=({0: Dim("batch", min=1, max=64)},))
    assert static.runtime_settings.cudnn_benchmark.value is True
    bench = ranged.runtime_settings.cudnn_benchmark
    assert bench.value is False and "dynamic shapes" in bench.reason
    # the batch setting is the memory plan's recommended batch, with the maximum beside it
    for p in (static, ranged):
        batch = p.runtime_settings.batch_size
        assert batch.value == p.memory.recommended_batch_size
        assert str(p.memory.max_batch_size) in batch.reason.replace(",", "")


def test_onnx_default_sizes_the_model_refuses_are_fitted_and_said():
    """A position table of 64 rows: the default seq (128) cannot run. A bare optimize fits a
    seq the model takes (issue 31: made-up inputs that fit the model) and says so; the
    user's range still works."""
    h = onnx.helper
    x = h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", "seq", 8])
    y = h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", "seq", 8])
    table = onnx.numpy_helper.from_array(np.random.default_rng(0).standard_normal(
        (64, 8)).astype(np.float32), "table")
    consts = [onnx.numpy_helper.from_array(np.array(v, np.int64), n)
              for n, v in (("one", 1), ("zero", [0]), ("axes", [0]))]
    nodes = [h.make_node("Shape", ["x"], ["shape"]),
             h.make_node("Gather", ["shape", "one"], ["seq_len"]),
             h.make_node("Unsqueeze", ["seq_len", "axes"], ["end"]),
             h.make_node("Slice", ["table", "zero", "end", "axes"], ["pos"]),
             h.make_node("Add", ["x", "pos"], ["y"])]
    model = h.make_model(h.make_graph(nodes, "pos", [x], [y], [table, *consts]),
                         opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    bare = graphopt.optimize(model, target="cpu", measure=False)
    seq = next(d for d in bare.plan.optimization.shape_range.dims
               if d.name == "seq")
    assert seq.source == "fitted" and seq.opt <= 64 and seq.min == seq.opt
    assert any("fitted" in w and "seq=" in w for w in bare.plan.warnings)
    assert all(n.within for n in bare.info.numerics)
    opt = graphopt.optimize(model, target="cpu", measure=False,
                            dynamic_shapes={"batch": (1, 2, 4), "seq": (1, 16, 64)})
    assert all(n.within for n in opt.info.numerics)
