"""Steps ``optimize`` no longer repeats (issue 34, item 3: within 20 s): the torch module is not
timed against the user's model when no pass changed it, and the ONNX checker (strict shape
inference, ``full_check``) does not check the final model again when the last pass's check
already passed that very model. Both keep what they return: the same outputs, a checked file."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

import graphopt
from graphopt.backends.onnx import model_check
from graphopt.backends.torch import pipeline
from graphopt.frontends.onnx_export import export_torch


def test_nothing_applied_is_not_timed(monkeypatch) -> None:
    def timed(*_: object, **__: object) -> None:
        raise AssertionError("the unchanged module was timed")

    monkeypatch.setattr(pipeline, "faster_or_equal", timed)
    x = torch.randn(4, 8)
    for model in (nn.Sequential(nn.ReLU(), nn.Tanh()).eval(),  # no pass applies
                  nn.Sequential(nn.Tanh(), nn.Dropout(0.2)).eval()):  # an eval dropout dropped
        opt = graphopt.optimize(model, x, target="cpu", measure=True)
        assert opt.info.passes_applied == ()
        assert [(r.name, r.reason) for r in opt.info.passes_reverted] == \
            [("all", pipeline.NOTHING_APPLIED)]
        assert opt.module is not model
        with torch.no_grad():
            torch.testing.assert_close(opt.module(x), model(x), rtol=0, atol=0)


def test_a_folded_batchnorm_is_timed(monkeypatch) -> None:
    calls: list[bool] = []
    real = pipeline.faster_or_equal

    def timed(*a: object, **k: object) -> object:
        calls.append(True)
        return real(*a, **k)

    monkeypatch.setattr(pipeline, "faster_or_equal", timed)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU()).eval()
    graphopt.optimize(model, torch.randn(2, 3, 16, 16), target="cpu", measure=True)
    assert calls == [True]


def test_no_pass_writes_a_parameter_it_found(monkeypatch) -> None:
    """The snapshot a pass is reverted to shares the module's parameters: no pass may write
    one in place (every default pass runs, padding, layout and quantize among them)."""
    shared: dict[int, tuple[torch.Tensor, int]] = {}  # id -> (parameter, its version then)
    real = pipeline._TorchBackend.snapshot

    def snapshot(self: object, gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
        copy = real(self, gm)
        for p in copy.parameters():
            if any(p is q for q in gm.parameters()):
                shared.setdefault(id(p), (p, p._version))
        return copy

    monkeypatch.setattr(pipeline._TorchBackend, "snapshot", snapshot)
    model = nn.Sequential(nn.Conv2d(3, 30, 3), nn.BatchNorm2d(30), nn.ReLU(),
                          nn.Conv2d(30, 30, 3), nn.Flatten(), nn.Linear(30 * 12 * 12, 70)).eval()
    x = torch.randn(2, 3, 16, 16)
    opt = graphopt.optimize(model, x, target="cpu", measure=False, pad="always",
                            layout="channels_last", quantize="int8")
    assert len(shared) > 8 and opt.info.passes_applied == ("cleanup", "padding", "layout",
                                                           "quantize")
    opt.module(x)
    assert [p._version for p, _ in shared.values()] == [v for _, v in shared.values()]


def test_the_final_model_is_checked_once(monkeypatch) -> None:
    """An MLP quantized on request: the quantize pass's model is checked, and is the final
    model."""
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)).eval()
    x = torch.randn(8, 64)
    proto = export_torch(model, x).model
    seen: list[int] = []
    real = model_check._checked

    def counted(m: onnx.ModelProto) -> onnx.ModelProto:
        seen.append(id(m))
        return real(m)

    monkeypatch.setattr(model_check, "_checked", counted)
    opt = graphopt.optimize(proto, target="cpu", quantize="int8_dynamic", measure=False)
    assert opt.info.passes_applied == ("quantize",)
    assert len(seen) == 1  # the quantized model, once
    onnx.checker.check_model(opt.onnx_model, full_check=True)
    assert len(opt.onnx_model.graph.value_info) > 0  # shapes inferred into it
    sess = ort.InferenceSession(opt.onnx_model.SerializeToString(),
                                providers=["CPUExecutionProvider"])
    got = sess.run(None, {proto.graph.input[0].name: x.numpy()})[0]
    with torch.no_grad():
        want = model(x).numpy()
    assert np.abs(got - want).max() <= opt.info.tolerance.rel_to_scale * np.abs(want).max()


def test_the_pass_timing_and_the_final_numbers_reuse_sessions(monkeypatch) -> None:
    """The ONNX pass timing runs the original's session (the setup's, which made the
    reference) and keeps its session of the pass's model for the final numbers."""
    from types import SimpleNamespace

    from graphopt.backends.onnx import backend as onnx_backend
    from graphopt.backends.onnx.backend import OnnxBackend
    from graphopt.backends.onnx.int8_matmul import dynamic_int8_matmuls
    from graphopt.backends.onnx.ort_runner import OrtModel
    from graphopt.backends.onnx.quantize import _gemms_as_matmuls
    from graphopt.backends.timing import Measured

    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)).eval()
    x = torch.randn(8, 64)
    proto = export_torch(model, x).model
    matmuls = [n.name for n in proto.graph.node if n.op_type in ("MatMul", "Gemm")]
    quantized = dynamic_int8_matmuls(_gemms_as_matmuls(
        proto, set(matmuls)), matmuls, reduce_range=True)
    feed = {proto.graph.input[0].name: x.numpy()}
    timed: list[tuple[object, object]] = []

    def fake_timing(before, after, feeds, threads=None):
        timed.append((before, after))
        return Measured(True, 2e-3, 1e-3, 1.9, 2.1, 5, "faster")

    monkeypatch.setattr(onnx_backend.onnx_measure, "faster_or_equal", fake_timing)
    base = OrtModel(proto)
    backend = OnnxBackend(SimpleNamespace(samples=[feed]), proto, [],
                                         base_session=base)
    assert backend.time(proto, quantized).keep
    (before, after), = timed
    assert before is base and isinstance(after, OrtModel)
    assert backend.session_of(quantized) is after and backend.session_of(proto) is proto
    np.testing.assert_array_equal(after.run(feed)[0], OrtModel(quantized).run(feed)[0])
