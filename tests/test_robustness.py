"""Trust first (issue 9): inputs a user can give must end in a plan or in a GraphoptError that
says the problem and the fix; the CLI prints ``graphopt: error: ...`` and exits 2, with no
traceback, and no file is harmed or left behind.

1. Zero-size dims (a batch of 0, an empty ONNX input): planned as zero time, optimized or
   refused cleanly, for torch and ONNX; a hypothesis sweep over shapes with zeros.

Errors that used to be tracebacks and the host CPU a test sees are in test_robustness_errors.py;
the shared helpers are in tests/robustness_helpers.py.
"""

from __future__ import annotations

import json
import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from torch import nn

import graphopt
from graphopt.analysis import KernelClass
from graphopt.cli.main import main
from graphopt.decisions.planner import build_plan
from graphopt.errors import GraphoptError
from graphopt.hardware.registry import get_target
from tests.irbuild import G
from tests.robustness_helpers import _listing, _mlp_onnx, _no_traceback


class _TinyMlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc0, self.fc1 = nn.Linear(20, 30), nn.Linear(30, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc1(torch.relu(self.fc0(x)))


class _TinyConvAttention(nn.Module):
    """A conv with odd channels and an SDPA with an odd head_dim: every padding case."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 12, 3, padding=1)
        self.qkv = nn.Linear(12, 3 * 2 * 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x))  # [B, 12, H, W]
        t = y.flatten(2).transpose(1, 2)  # [B, HW, 12]
        q, k, v = self.qkv(t).unflatten(-1, (3, 2, 6)).permute(2, 0, 3, 1, 4).unbind(0)
        return nn.functional.scaled_dot_product_attention(q, k, v)


def _seeded(model: nn.Module) -> nn.Module:
    torch.manual_seed(0)
    return model.eval()


# --- 1. zero-size dims -------------------------------------------------------------------------

@pytest.mark.parametrize("target", ["h100", "cpu"])
def test_cli_plan_of_an_onnx_model_with_a_zero_batch_is_zero_time(tmp_path, capsys, target):
    src = _mlp_onnx(tmp_path / "z.onnx", 0)
    before = _listing(tmp_path)
    out = tmp_path / "plan.json"
    assert main(["plan", str(src), "--target", target, "--json", str(out)]) == 0
    captured = capsys.readouterr()
    _no_traceback(captured.out + captured.err)
    plan = json.loads(out.read_text())
    assert plan["summary"]["est_latency_s"] == 0.0
    for n in plan["nodes"]:
        assert n["est_time_s"] == 0.0 and n["flops"] == 0 and n["bytes"] == 0
        assert "empty_output" in n["flags"]
        assert n["decisions"]["exec_path"]["path"] == "none"
        assert "zero-size output" in n["decisions"]["exec_path"]["reason"]
    assert any("zero-size" in w for w in plan["warnings"])
    assert plan["memory"]["max_batch_size"] == 0
    assert "batch of 0" in plan["memory"]["batch_note"]
    assert {k: v for k, v in _listing(tmp_path).items() if k != "plan.json"} == before


@pytest.mark.parametrize("target", ["h100", "cpu", "xeon-8480"])
def test_torch_plan_of_a_zero_batch_is_zero_time_with_sane_reports(target):
    plan = graphopt.plan(_seeded(_TinyConvAttention()), torch.randn(0, 3, 4, 4), target=target)
    assert plan.est_latency_s == 0.0
    empty = [n for n in plan.nodes if n.analysis.no_work and "exec_path" in n.decisions]
    assert empty and all(n.cost.est_time_s == 0.0 for n in empty)
    assert all(n.decisions["exec_path"].detail.path == "none" for n in empty)
    text = plan.to_json()
    assert "NaN" not in text and "Infinity" not in text
    json.loads(text)
    assert "0 ns" in plan.to_markdown()
    assert plan.to_html().startswith("<!DOCTYPE html>")


def test_lint_of_a_zero_batch_reports_no_tensor_core_issue_for_empty_gemms():
    from graphopt.decisions.lint import lint

    model = _seeded(_TinyConvAttention())
    empty = lint(graphopt.plan(model, torch.randn(0, 3, 4, 4), target="h100"))
    full = lint(graphopt.plan(model, torch.randn(1, 3, 4, 4), target="h100"))
    assert full and not empty


def test_torch_plan_of_an_empty_reduction_input_still_costs_the_output():
    """A sum over a zero-size axis writes zeros: that output is real work, never negative."""
    class SumRows(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.sum(0) + 1

    plan = graphopt.plan(SumRows(), torch.randn(0, 64), target="h100")
    costs = [n.cost.est_time_s for n in plan.nodes]
    assert all(math.isfinite(c) and c > 0 for c in costs)
    assert not any(n.analysis.no_work for n in plan.nodes)


@pytest.mark.parametrize(("target", "kw"), [("h100", {"pad": "always"}), ("cpu", {})])
def test_torch_optimize_of_a_zero_batch_runs_and_matches(target, kw):
    model = _seeded(_TinyConvAttention())
    x = torch.randn(0, 3, 4, 4)
    opt = graphopt.optimize(model, x, target=target, **kw)
    with torch.no_grad():
        ref, out = model(x), opt.module(x)
    assert out.shape == ref.shape == (0, 2, 16, 6)
    assert opt.numerics and all(c["within"] for c in opt.numerics)
    for n in opt.plan.nodes:
        pad = n.decisions.get("padding")
        if pad is not None:
            assert not pad.applied and "zero-size" in pad.reason


@pytest.mark.parametrize("target", ["h100", "cpu"])
def test_cli_optimize_of_an_onnx_model_with_a_zero_batch_runs_and_matches(tmp_path, capsys,
                                                                         target):
    src = _mlp_onnx(tmp_path / "z.onnx", 0)
    before = _listing(tmp_path)
    out = tmp_path / "out.onnx"
    assert main(["optimize", str(src), "-o", str(out), "--target", target]) == 0
    captured = capsys.readouterr()
    _no_traceback(captured.out + captured.err)
    after = _listing(tmp_path)
    assert {k: after[k] for k in before} == before  # the model is untouched
    assert all(k.startswith("out.") for k in set(after) - set(before))
    feed = {"x": np.zeros((0, 20), np.float32)}
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, feed)
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, feed)
    assert ref[0].shape == got[0].shape == (0, 10)


def test_python_optimize_of_an_onnx_conv_with_a_zero_batch_refuses_to_pad(tmp_path):
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in (("w", (12, 3, 3, 3)), ("b", (12,)), ("w2", (5, 12, 1, 1)))]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w2"], ["y"], name="conv2")]
    g = helper.make_graph(
        nodes, "conv0", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [0, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [0, 5, 8, 8])], inits)
    src = tmp_path / "conv0.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
              src)
    opt = graphopt.optimize(str(src), target="h100", pad="always")
    pads = {n.name: n.decisions["padding"] for n in opt.plan.nodes if "padding" in n.decisions}
    assert set(pads) == {"conv", "conv2"}
    assert all(not d.applied and "zero-size" in d.reason for d in pads.values())
    assert opt.numerics and all(c["within"] for c in opt.numerics)


# A sweep of shapes with zeros through every kernel class, on GPU and CPU targets of every
# generation: no exception, finite non-negative times, zero time exactly where nothing runs.
_DIMS = st.sampled_from([0, 1, 3, 8, 64])
_TARGETS = ("v100", "t4", "a100", "h100", "b200", "rtx-5090", "epyc-7763", "xeon-8380",
            "xeon-8480", "graviton3")


def _zero_graph(b: int, s: int, c_in: int, c_out: int, heads: int, hd: int):
    g = G()
    x = g.input("x", (b, s, c_in))
    y = g.op("Linear", [x, g.param("w", (c_out, c_in)), g.param("bias", (c_out,))],
             (b, s, c_out), name="fc")
    g.op("Relu", [y], (b, s, c_out), name="relu")
    g.op("Softmax", [y], (b, s, c_out), name="softmax", axis=-1)
    g.op("LayerNormalization", [y], (b, s, c_out), name="ln", axis=-1)
    g.op("ReduceSum", [y], (b, c_out), name="sum", axes=[1])
    g.op("Gemm", [g.input("a", (b, c_in)), g.param("gw", (c_out, c_in))], (b, c_out),
         name="gemm", transB=1)
    q = g.input("q", (b, heads, s, hd))
    g.op("MatMul", [q, g.input("kt", (b, heads, hd, s))], (b, heads, s, s), name="bmm")
    g.op("Attention", [q, g.input("k", (b, heads, s, hd)), g.input("v", (b, heads, s, hd))],
         (b, heads, s, hd), name="attn")
    img = g.input("img", (b, c_in, s, s))
    conv = g.op("Conv", [img, g.param("cw", (c_out, c_in, 3, 3))], (b, c_out, s, s),
                name="conv", pads=[1, 1, 1, 1])
    g.op("MaxPool", [conv], (b, c_out, s // 2, s // 2), name="pool", kernel_shape=[2, 2])
    g.op("ConvTranspose", [img, g.param("tw", (c_in, c_out, 2, 2))], (b, c_out, 2 * s, 2 * s),
         name="deconv", strides=[2, 2])
    g.op("Gather", [g.param("emb", (c_in, c_out)), g.input("ids", (b, s), "int64")],
         (b, s, c_out), name="gather")
    g.op("Concat", [x, x], (b, s, 2 * c_in), name="cat", axis=-1)
    g.op("Reshape", [y], (b * s, c_out), name="flat")
    return g.build(["relu", "softmax", "ln", "sum", "gemm", "bmm", "attn", "pool", "deconv",
                    "gather", "cat", "flat"])


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(b=_DIMS, s=_DIMS, c_in=_DIMS, c_out=_DIMS, heads=_DIMS, hd=_DIMS)
def test_shapes_with_zeros_plan_on_every_target(b, s, c_in, c_out, heads, hd):
    graph = _zero_graph(b, s, c_in, c_out, heads, hd)
    for name in _TARGETS:
        plan = build_plan(graph, get_target(name))
        for n in plan.nodes:
            t, view = n.cost.est_time_s, n.analysis.kernel_class is KernelClass.VIEW
            assert math.isfinite(t) and t >= 0, (name, n.name, t)
            if view:
                assert t == 0.0
            elif n.analysis.no_work:
                assert t == 0.0 and n.decisions["exec_path"].detail.path == "none"
            else:
                assert t > 0, (name, n.name)
        assert math.isfinite(plan.summary.predicted_speedup)
        json.loads(plan.to_json(), parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))
    empty_fc = 0 in (b, s, c_out)
    assert plan.node("fc").analysis.no_work is empty_fc


def test_shapes_with_zeros_split_across_devices():
    graph = _zero_graph(0, 8, 8, 8, 2, 8)
    plan = build_plan(graph, get_target("h100"))
    for strategy in ("heft", "pipeline"):
        split = graphopt.api.planning.with_partition(plan, "cuda:0=h100,cuda:1=a100", strategy)
        text = split.to_json()
        assert "NaN" not in text and "Infinity" not in text
        assert all("device" in n.decisions for n in split.nodes)



@pytest.mark.parametrize("n", [0, -2, 1.5, True])
def test_pipeline_stages_refuse_a_microbatch_count_that_is_not_positive(n):
    from graphopt.partition.pipeline_stages import build_pipeline_stages

    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU()).eval()
    with pytest.raises(GraphoptError, match="at least one microbatch"):
        build_pipeline_stages(model, torch.randn(4, 4), [["linear"], ["relu"]], n)
