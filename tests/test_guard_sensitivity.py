"""The accuracy guard's per-node sensitivity (``backends/onnx/probe.py``, ``sensitivity.py``,
``guard.py``): the probe reproduces the candidate and the model exactly, the node made
sensitive ranks first and is the one kept in higher precision, the outputs end within
tolerance, sessions and runs are bounded, and the report shows the numbers.

Targets are pinned (h100 for fp16; an AVX2 CPU without VNNI, ``epyc-7763``, for INT8, whose
``reduce_range`` scheme is exact on any host) and timing is off: nothing depends on the host.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from graphopt.backends.onnx import guard as guard_module
from graphopt.backends.onnx.context import OnnxContext
from graphopt.backends.onnx.ort_runner import OrtModel, emulate_fp16, sample_feeds
from graphopt.backends.onnx.pipeline import optimize_onnx
from graphopt.backends.onnx.precision import reduce_precision
from graphopt.backends.onnx.probe import build_probe
from graphopt.backends.onnx.sensitivity import GROUPS
from graphopt.decisions.planner import build_plan
from graphopt.frontends.onnx_frontend import load_onnx
from graphopt.hardware import get_target
from graphopt.ir.options import Options
from graphopt.report import render_html, render_markdown
from tests.report_plans import typed

FP16_RTOL = 1e-2  # decisions.tolerance: fp16
INT8_RTOL = 5e-2  # decisions.tolerance: int8


def _mlp(weights: list[np.ndarray], rows: int, norm_after: int | None = None
         ) -> onnx.ModelProto:
    """x -> MatMul -> Relu -> ... -> MatMul (no Relu after the last); a LayerNormalization
    after MatMul number ``norm_after``. Nodes are named MatMul_<i>, Relu_<i>, Norm."""
    nodes, inits, x = [], [], "x"
    for i, w in enumerate(weights):
        inits.append(numpy_helper.from_array(w.astype(np.float32), f"w{i}"))
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"mm{i}"], name=f"MatMul_{i}"))
        x = f"mm{i}"
        if i == norm_after:
            width = w.shape[1]
            inits += [numpy_helper.from_array(np.ones(width, np.float32), "g"),
                      numpy_helper.from_array(np.zeros(width, np.float32), "beta")]
            nodes.append(helper.make_node("LayerNormalization", [x, "g", "beta"], ["ln"],
                                          name="Norm", axis=-1))
            x = "ln"
        if i < len(weights) - 1:
            nodes.append(helper.make_node("Relu", [x], [f"r{i}"], name=f"Relu_{i}"))
            x = f"r{i}"
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", T.FLOAT, [rows, weights[0].shape[0]])],
        [helper.make_tensor_value_info(x, T.FLOAT, [rows, weights[-1].shape[1]])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def _overflowing() -> onnx.ModelProto:
    """MatMul_1's weights fit fp16 but its products do not (|out| ~ 1e5 > 65504): in fp16 it
    returns inf, the LayerNormalization after it NaN."""
    rng = np.random.default_rng(0)
    ws = [rng.standard_normal((32, 32)) / math.sqrt(32) for _ in range(4)]
    ws[1] = rng.uniform(-4e4, 4e4, (32, 32))  # every weight fits fp16
    return _mlp(ws, 8, norm_after=1)


def _wide_range() -> onnx.ModelProto:
    """MatMul_0 makes feature 0 ~1e4 times the others; MatMul_1 ignores it (row 0 is zero),
    so in float MatMul_1's output comes from the small features alone. Dynamic INT8 scales
    MatMul_1's input per tensor to that one feature: the small ones round to a few steps, and
    MatMul_1's output is lost. The other MatMuls quantize well."""
    rng = np.random.default_rng(1)
    ws = [rng.standard_normal((64, 64)) / 8 for _ in range(4)]
    ws[0][:, 0] *= 1e4
    ws[1][0, :] = 0.0
    return _mlp(ws, 16)


def _run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    return OrtModel(emulate_fp16(model)).run(feed)


def _within(ref: list[np.ndarray], out: list[np.ndarray], rtol: float) -> None:
    for r, o in zip(ref, out, strict=True):
        assert np.all(np.isfinite(o))
        assert np.abs(r - o).max() <= rtol * np.abs(r).max()


@pytest.fixture
def counted(monkeypatch):
    """ORT sessions built and runs made, counted at ONNX Runtime's own session class."""
    counts = {"sessions": 0, "runs": 0}

    class Counting(ort.InferenceSession):
        def __init__(self, *args, **kwargs):
            counts["sessions"] += 1
            super().__init__(*args, **kwargs)

        def run(self, *args, **kwargs):
            counts["runs"] += 1
            return super().run(*args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", Counting)
    return counts


def _fp16_context(model: onnx.ModelProto) -> tuple[onnx.ModelProto, OnnxContext]:
    graph = load_onnx(model)
    plan = build_plan(graph, get_target("h100"))
    ctx = OnnxContext(plan, plan.target, Options(), [], compute_dtype="fp16")
    assert graph.source_model is not None
    return graph.source_model, ctx


# ------------------------------------------------------------------------------------ probe
def test_probe_is_the_candidate_with_nothing_kept_and_the_model_with_everything_kept():
    """Cases 1 and 2 of probe.py, bit for bit, and case 4: with every node kept, each lowered
    output from exact inputs is its local error (inf where fp16 overflows)."""
    model, ctx = _fp16_context(_overflowing())
    cand = reduce_precision(model, ctx)
    assert cand is not None
    lowered = [n for n, d in ctx.decisions.items() if d["precision"].applied]
    probe = build_probe(model, cand, lowered)
    assert set(probe.switched) == set(lowered) and not probe.skipped
    feed = sample_feeds(model)[0]
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    as_is = OrtModel(emulate_fp16(cand), options=opts).run(feed)
    for a, b in zip(probe.run(feed, ()), as_is, strict=True):
        np.testing.assert_array_equal(a, b)
    original = OrtModel(model, options=opts).run(feed)
    for a, b in zip(probe.run(feed, set(lowered)), original, strict=True):
        np.testing.assert_array_equal(a, b)
    hi, lo = probe.run(feed, set(lowered), ["__hi/mm1", "__lo/mm1"])[1:]
    assert np.all(np.isfinite(hi)) and not np.all(np.isfinite(lo))


def _gemms(rows: int = 8) -> onnx.ModelProto:
    """Two Gemms with biases and a Relu: ONNX Runtime's QDQ quantizer writes its bias
    DequantizeLinear over the float bias's name."""
    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32) / 4, n)
             for n, s in (("w0", (32, 32)), ("b0", (32,)), ("w1", (32, 16)), ("b1", (16,)))]
    nodes = [helper.make_node("Gemm", ["x", "w0", "b0"], ["h"], name="Gemm_0"),
             helper.make_node("Relu", ["h"], ["r"], name="Relu_0"),
             helper.make_node("Gemm", ["r", "w1", "b1"], ["y"], name="Gemm_1")]
    graph = helper.make_graph(nodes, "gemms",
                              [helper.make_tensor_value_info("x", T.FLOAT, [rows, 32])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [rows, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("mode", ["int8_dynamic", "int8_static"])
def test_probe_of_a_quantized_model_is_exact_at_both_ends(mode):
    """The same two cases for ONNX Runtime's quantizers (dynamic: MatMulInteger; static: QDQ,
    whose bias DequantizeLinear reuses the float bias's name)."""
    from graphopt.backends.onnx.quantize import QUANTIZE_PASSES

    model = _gemms() if mode == "int8_static" else _wide_range()
    graph = load_onnx(model)
    plan = build_plan(graph, get_target("epyc-7763"))
    feeds = sample_feeds(model, count=2, seed=5)
    ctx = OnnxContext(plan, plan.target, Options(quantize=mode), feeds, calibration=feeds)
    assert graph.source_model is not None
    cand = QUANTIZE_PASSES[mode](graph.source_model, ctx, frozenset())
    assert cand is not None
    lowered = [n for n, d in ctx.decisions.items() if "quantize" in d and d["quantize"].applied]
    probe = build_probe(graph.source_model, cand, lowered)
    assert set(probe.switched) == set(lowered) and lowered
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    for got, want in ((probe.run(feeds[0], ()), OrtModel(cand, options=opts).run(feeds[0])),
                      (probe.run(feeds[0], set(lowered)),
                       OrtModel(graph.source_model, options=opts).run(feeds[0]))):
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------------------------ fp16
def test_fp16_overflow_ranks_first_is_the_one_kept_and_ends_within_tolerance(counted):
    model = _overflowing()
    feed = sample_feeds(model)[0]
    reference = OrtModel(model).run(feed)
    before = counted["sessions"]
    done = optimize_onnx(model, "h100", Options(quantize="none", measure=False),
                         samples=[feed])
    sessions = counted["sessions"] - before
    report = next(g for g in done.report.guard if g.name == "precision")
    assert not report.reverted and not report.initial[0].within
    top = report.sensitivity.top
    assert top[0].node == "MatMul_1" and top[0].local == "overflow"
    assert top[0].rank == 1 and top[0].kept
    assert [t.node for t in top if t.kept] == ["MatMul_1"]
    assert report.fallbacks[0].node == "MatMul_1"
    assert report.fallbacks[0].score == "overflow"
    # every other lowered node was measured and stays fp16
    others = [t for t in top if t.node != "MatMul_1"]
    assert others and all(isinstance(t.local, float) and t.local < 0.01 for t in others)
    decisions = {n.name: n.decisions["precision"] for n in done.plan.nodes
                 if "precision" in n.decisions}
    kept = decisions["MatMul_1"]
    assert not kept.applied and "accuracy guard" in kept.reason
    assert kept.detail.sensitivity.rank == 1 and kept.detail.sensitivity.kept
    for name in ("MatMul_0", "MatMul_2", "MatMul_3"):
        assert decisions[name].applied and decisions[name].detail.sensitivity is not None
    assert done.report.numerics[0].within
    _within(reference, _run(done.model, feed), FP16_RTOL)
    # the original, the probe, one check of the re-run, the final check: sessions do not grow
    # with the bisection
    assert report.sensitivity.sessions == 2
    assert sessions == 4


# ------------------------------------------------------------------------------------ INT8
def test_int8_wide_range_input_ranks_first_and_is_the_one_kept_in_float():
    model = _wide_range()
    feeds = sample_feeds(model, count=2, seed=3)
    references = [OrtModel(model).run(f) for f in feeds]
    done = optimize_onnx(model, "epyc-7763",
                         Options(quantize="int8_dynamic", measure=False), samples=feeds)
    report = next(g for g in done.report.guard if g.name == "quantize")
    assert not report.reverted, report.reason
    top = report.sensitivity.top
    assert top[0].node == "MatMul_1" and top[0].kept
    assert top[0].local > 10 * max(t.local for t in top[1:])
    assert [t.node for t in top if t.kept] == ["MatMul_1"]
    # the others stay INT8, MatMul_1 is float
    ops = {n.name: n.op_type for n in done.model.graph.node}
    assert ops.get("MatMul_1") == "MatMul"
    assert sum(n.op_type == "MatMulInteger" for n in done.model.graph.node) == 3
    decision = next(n for n in done.plan.nodes if n.name == "MatMul_1").decisions["quantize"]
    assert not decision.applied and decision.detail.sensitivity.kept
    assert all(n.within for n in done.report.numerics)
    for feed, ref in zip(feeds, references, strict=True):
        _within(ref, OrtModel(done.model).run(feed), INT8_RTOL)


# ---------------------------------------------------------------------------------- bounds
def test_sessions_stay_bounded_when_most_nodes_must_be_kept(counted):
    """A tolerance only fp32 nearly meets: the bisection keeps most nodes, in probe runs of
    one session; the real checks are at most MAX_CHECKS sessions more, whatever the size."""
    rng = np.random.default_rng(2)
    ws = [rng.standard_normal((48, 48)) / math.sqrt(48) * 1.4 for _ in range(24)]
    model = _mlp(ws, 8)
    feed = sample_feeds(model)[0]
    done = optimize_onnx(model, "h100", Options(quantize="none", measure=False,
                                                tolerance=1e-3), samples=[feed])
    report = next(g for g in done.report.guard if g.name == "precision")
    sens = report.sensitivity
    assert sens.nodes == 47  # 24 MatMuls and 23 Relus
    assert report.reverted or sens.kept > 0
    assert sens.sessions <= 1 + guard_module.MAX_CHECKS + 1  # probe, checks, a revert
    n = sens.nodes
    bound = 2 + GROUPS + math.ceil(math.log2(n)) + 2 + guard_module.MAX_TRIES
    assert sens.runs <= bound
    # the pipeline's own sessions: the original and the final check
    assert counted["sessions"] <= sens.sessions + 2
    if not report.reverted:
        assert report.final[0].within
        _within(OrtModel(model).run(feed), _run(done.model, feed), 1e-3)


# ---------------------------------------------------------------------------------- report
def test_report_shows_each_nodes_sensitivity():
    model = _overflowing()
    done = optimize_onnx(model, "h100", Options(quantize="none", measure=False),
                         samples=sample_feeds(model))
    md = render_markdown(done.plan)
    assert render_markdown(typed(done.plan.to_dict())) == md  # the JSON read back: the same
    assert "Per-node sensitivity (accuracy guard)" in md
    assert "| 1 | `MatMul_1` |  | overflow |" in md  # no format column for the ONNX guard
    assert "kept in higher precision" in md
    top = done.report.guard[0].sensitivity.top
    other = next(t for t in top if t.node == "MatMul_0")
    assert f"`MatMul_0` |  | {other.local:.3g} |" in md
    html = render_html(done.plan)
    assert "Per-node sensitivity (accuracy guard)" in html and "MatMul_1" in html
    assert 'class="sensitivity"' in html
