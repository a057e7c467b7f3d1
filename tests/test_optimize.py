"""graphopt.optimize end to end: invariants on the zoo (equal outputs, user model untouched,
idempotence), bf16 with measured error, lint, ONNX export, bad input."""

from __future__ import annotations

import copy

import numpy as np
import onnxruntime as ort
import pytest
import torch

import graphopt
from graphopt.backends.torch.optimized_module import OptimizedModule
from graphopt.decisions.lint import lint
from graphopt.errors import GraphoptError
from tests.zoo import TensorCoreGuideCNN, zoo

ZOO = zoo()


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_close(ref, out, rel: float) -> None:
    for r, o in zip(torch.utils._pytree.tree_leaves(ref), torch.utils._pytree.tree_leaves(out),
                    strict=True):
        assert r.shape == o.shape and r.dtype == o.dtype
        scale = float(r.abs().max())
        assert float((r - o).abs().max()) <= rel * scale + 1e-12


@pytest.mark.parametrize("name", sorted(ZOO))
@pytest.mark.parametrize("target", ["cpu", "h100"])
def test_fp32_rewrites_keep_outputs_and_model(name, target):
    model, inputs = ZOO[name]
    before = _state(model)
    opt = graphopt.optimize(model, inputs, target=target, precision="fp32", pad="always",
                            layout="channels_last")
    with torch.no_grad():
        _assert_close(model(*inputs), opt.module(*inputs), 1e-5)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not model.training
    assert all(n["within"] for n in opt.numerics)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_bf16_within_stated_tolerance(name):
    model, inputs = ZOO[name]
    opt = graphopt.optimize(model, inputs, target="h100", precision="bf16")
    report = opt.plan.to_dict()["optimization"]
    assert report["tolerance"]["rel_to_scale"] > 0
    for n in report["numerics"]:
        assert {"max_abs", "max_rel", "cosine"} <= set(n)
        assert n["within"]
    with torch.no_grad():
        ref, out = model(*inputs), opt.module(*inputs)
    assert ref.dtype == out.dtype and ref.shape == out.shape


def test_optimize_is_idempotent():
    model, inputs = ZOO["tc_guide_cnn"]
    once = graphopt.optimize(model, inputs, target="h100", precision="fp32", pad="always")
    twice = graphopt.optimize(once.module, inputs, target="h100", precision="fp32", pad="always")
    assert once.info.passes_applied  # the first run did rewrite
    assert twice.info.passes_applied == ()  # no pass changed the graph the second time
    rewrites = {"padding", "padding_carry", "padding_slice", "layout", "fold", "drop"}
    assert not [(n.name, k) for n in twice.plan.nodes for k, d in n.decisions.items()
                if d.applied and k in rewrites]
    with torch.no_grad():
        _assert_close(once.module(*inputs), twice.module(*inputs), 1e-6)


def test_padding_decisions_of_the_guide_example_are_reported():
    model, inputs = ZOO["tc_guide_cnn"]
    opt = graphopt.optimize(model, inputs, target="a100", precision="fp16", pad="always")
    padded = {n.name: n.decisions["padding"] for n in opt.plan.nodes
              if "padding" in n.decisions and n.decisions["padding"].applied}
    assert len(padded) == 3
    assert all(d.reason for d in padded.values())


def test_bad_input():
    model, inputs = ZOO["odd_mlp"]
    train = copy.deepcopy(model).train()
    with pytest.raises(GraphoptError, match="training mode"):
        graphopt.optimize(train, inputs, target="cpu")
    with pytest.raises(GraphoptError):
        graphopt.optimize(model, inputs, target="cpu", precision="fp8")
    opt = graphopt.optimize(model, inputs, target="cpu", measure=False)  # keep the graph
    with pytest.raises(GraphoptError, match="shapes"):
        opt.module(torch.randn(3, 61))


def test_export_onnx_runs_in_ort(tmp_path):
    model, inputs = ZOO["odd_residual_cnn"]
    opt = graphopt.optimize(model, inputs, target="cpu")
    path = opt.export_onnx(tmp_path / "m.onnx")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (out,) = sess.run(None, {sess.get_inputs()[0].name: inputs[0].numpy()})
    with torch.no_grad():
        ref = model(*inputs).numpy()
    assert np.abs(out - ref).max() <= 1e-5 * np.abs(ref).max()


def test_lint_lists_tensor_core_issues():
    torch.manual_seed(0)
    plan = graphopt.plan(TensorCoreGuideCNN().eval(), (torch.randn(8, 3, 16, 16),),
                         target="a100")
    issues = lint(plan)
    rules = {i.rule for i in issues}
    assert {"TC001", "TC004", "TC005"} <= rules
    tc001 = [i for i in issues if i.rule == "TC001"]
    # each fix is the padding decider's own answer (issue 33): applied, or declined and why
    assert len(tc001) == 3
    assert all(i.fix.startswith(("graphopt optimize applies it", "graphopt optimize declines"))
               for i in tc001)


def test_host_fallback_returns_a_plain_copy_when_nothing_pays(monkeypatch):
    """On the host CPU, a rewritten graph that measures slower is not returned."""
    from graphopt.backends.torch import pipeline

    model, inputs = ZOO["odd_mlp"]
    monkeypatch.setattr(pipeline, "faster_or_equal", lambda before, after, args: (False, 1e-3,
                                                                                   2e-3))
    opt = graphopt.optimize(model, inputs, target="cpu", measure=True)
    assert not isinstance(opt.module, OptimizedModule)
    assert opt.module is not model
    assert any(r.name == "all" for r in opt.info.passes_reverted)
    with torch.no_grad():
        _assert_close(model(*inputs), opt.module(*inputs), 0.0)

