"""Issue 33, finding 2, torch: ``calibration=`` gives the torch module's lossy passes real
batches, and ``metric=``/``min_metric=`` guard a task metric on both backends.

The model's example inputs and its calibration batches differ in range: one input channel of
the real batches carries values near 1000 against a weight column near 0, so it hardly moves
the output, but dynamic INT8 quantizes each activation tensor by its range and rounds every
other channel to zero. Checked on the example alone, INT8 passes; on the real batches it does
not, and the pass is reverted. The test compares the optimized module with the original on
fresh batches like the real ones.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import graphopt
from graphopt.errors import GraphoptError

from .hostisa import host_isa


class _Outlier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(64, 64)
        self.b = torch.nn.Linear(64, 16)
        with torch.no_grad():
            self.a.weight[:, 0] = 1e-4  # the outlier channel hardly moves the output

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def _batch(seed: int, outlier: bool) -> torch.Tensor:
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(seed))
    if outlier:
        x[:, 0] = 1000.0
    return x


def _error(model: torch.nn.Module, opt: graphopt.Optimized, x: torch.Tensor) -> float:
    with torch.no_grad():
        ref, out = model(x), opt.module(x)
    return float((ref - out).abs().max() / ref.abs().max())


def _int8(model: torch.nn.Module, **kw: object) -> graphopt.Optimized:
    with host_isa("xeon-8380"):  # VNNI, fp32: an INT8 host, whatever runs the test
        return graphopt.optimize(model, (_batch(0, False),), target="cpu",
                                 quantize="int8_dynamic", precision="fp32", measure=False, **kw)


def test_the_guard_checks_the_real_batches_not_only_the_example() -> None:
    model = _Outlier().eval()
    opt = _int8(model, calibration=[(_batch(1, True),), (_batch(2, True),)])
    info = opt.plan.optimization
    # dynamic INT8 chooses nothing from data: every given batch checks
    assert info.held_out_batches == 2 and info.calibration_batches == 0
    assert "all held out" in info.calibration_use
    budget = info.tolerance.rel_to_scale
    for seed in (11, 12):  # fresh inputs like the real batches
        assert _error(model, opt, _batch(seed, True)) <= budget
    assert "quantize" not in info.passes_applied
    reasons = " ".join(r.reason for r in info.passes_reverted)
    assert "held-out" in reasons


def test_without_the_real_batches_the_same_pass_is_kept() -> None:
    """The example alone lets INT8 through: the test above is about the batches."""
    model = _Outlier().eval()
    opt = _int8(model)
    info = opt.plan.optimization
    assert "quantize" in info.passes_applied
    assert info.held_out_batches == 0
    assert _error(model, opt, _batch(11, True)) > info.tolerance.rel_to_scale


def test_the_stated_error_is_the_given_batches() -> None:
    model = _Outlier().eval()
    batches = [_batch(i, False) for i in range(1, 4)]
    opt = _int8(model, calibration=[{"x": b} for b in batches])
    info = opt.plan.optimization
    assert info.held_out_batches == 3
    with torch.no_grad():
        ref = torch.cat([model(b) for b in batches])
        out = torch.cat([opt.module(b) for b in batches])
    stated = info.numerics[0]
    assert stated.max_abs == pytest.approx(float((ref - out).abs().max()), rel=1e-6)
    assert stated.scale == pytest.approx(float(ref.abs().max()), rel=1e-6)


@pytest.mark.parametrize("bad, says", [
    ("calib.npz", "list of batches"),
    ([(torch.randn(8, 64), torch.randn(8, 64))], "takes 1 input"),
    ([{"y": torch.randn(8, 64)}], "inputs are ['x']"),
    ([torch.randn(4, 64)], "shape [4, 64]"),
    ([torch.zeros(8, 64, dtype=torch.long)], "torch.int64"),
    ([], "no batches"),
])
def test_a_bad_calibration_form_names_the_expected_form(bad: object, says: str) -> None:
    with pytest.raises(GraphoptError) as e:
        graphopt.optimize(_Outlier().eval(), (_batch(0, False),), target="h100",
                          calibration=bad, measure=False)
    assert says in str(e.value) and "tuple of tensors" in str(e.value)


def _top1(reference: torch.Tensor, outputs: torch.Tensor) -> float:
    return float((reference.argmax(-1) == outputs.argmax(-1)).float().mean())


def test_a_metric_below_its_floor_reverts_the_lossy_pass_and_is_reported() -> None:
    model = _Outlier().eval()
    batches = [(_batch(i, False),) for i in range(1, 3)]
    kept = _int8(model, calibration=batches, metric=_top1, min_metric=0.5)
    refused = _int8(model, calibration=batches, metric=_top1, min_metric=1.01)
    metric = kept.plan.optimization.metric
    assert metric.min_metric == 0.5 and metric.on == "held-out calibration batches"
    value = metric.passes["quantize"].value
    with torch.no_grad():  # the value is the mean of the metric over the held-out batches
        expect = np.mean([_top1(model(b), kept.module(b)) for (b,) in batches])
    assert value == pytest.approx(expect)
    assert "quantize" in kept.plan.optimization.passes_applied
    info = refused.plan.optimization
    assert "quantize" not in info.passes_applied
    assert any("below min_metric" in r.reason for r in info.passes_reverted)
    assert info.metric.passes["quantize"].kept is False


def test_a_metric_without_held_out_batches_warns() -> None:
    opt = _int8(_Outlier().eval(), metric=_top1, min_metric=0.0)
    assert opt.plan.optimization.metric.on == "the example inputs"
    assert any("not on held-out batches" in w for w in opt.plan.warnings)


@pytest.mark.parametrize("kw, says", [
    ({"metric": _top1}, "without min_metric"),
    ({"min_metric": 0.9}, "without metric"),
    ({"metric": "top1", "min_metric": 0.9}, "must be a function"),
    ({"metric": _top1, "min_metric": float("nan")}, "finite number"),
])
def test_metric_arguments_are_checked(kw: dict[str, object], says: str) -> None:
    with pytest.raises(GraphoptError, match=says):
        graphopt.optimize(_Outlier().eval(), (_batch(0, False),), target="h100",
                          measure=False, **kw)


@pytest.mark.parametrize("metric, says", [
    (lambda r, o: 1 / 0, "raised on check batch 0"),
    (lambda r, o: float("nan"), "not a finite number"),
    (lambda r, o: "good", "not a finite number"),
])
def test_a_metric_that_fails_is_named(metric: object, says: str) -> None:
    with pytest.raises(GraphoptError, match=says) as e:
        _int8(_Outlier().eval(), calibration=[_batch(1, False)], metric=metric,
              min_metric=0.5)
    assert "<lambda>" in str(e.value)


def _onnx_mlp() -> onnx.ModelProto:
    w = np.random.default_rng(0).standard_normal((64, 16)).astype(np.float32) / 8
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 16])],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_the_onnx_path_reports_and_enforces_the_metric() -> None:
    seen: list[tuple[type, type]] = []

    def agree(reference: list[np.ndarray], outputs: list[np.ndarray]) -> float:
        seen.append((type(reference[0]), type(outputs[0])))
        return float(np.mean(reference[0].argmax(-1) == outputs[0].argmax(-1)))

    feeds = [{"x": np.random.default_rng(i).standard_normal((8, 64)).astype(np.float32)}
             for i in range(4)]
    opt = graphopt.optimize(_onnx_mlp(), target="cpu", quantize="int8_static",
                            calibration=feeds, measure=False, metric=agree, min_metric=1.01)
    info = opt.plan.optimization
    assert seen and all(t == (np.ndarray, np.ndarray) for t in seen)
    assert info.metric.on == "held-out calibration batches"
    assert info.metric.passes["quantize"].kept is False
    assert "quantize" not in info.passes_applied
