"""graphopt never writes the user's state: every tensor the model or its inputs can reach
(registered or not: a ``StaticCache`` on the module, a buffer also held by another
attribute, a holder object passed as an input) is bit-identical after plan, optimize, save
and the deploy measurement, and the model object works as before (issue 30, item 6)."""

from __future__ import annotations

import copy
import threading
import warnings
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import graphopt
from graphopt.errors import GraphoptError
from graphopt.frontends.user_state import private_copy, reachable_tensors, user_state_guard

transformers = pytest.importorskip("transformers")
executorch = pytest.importorskip("transformers.integrations.executorch")


def _tensors(model: nn.Module, extra: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The model's registered tensors and ``extra`` (the ones held elsewhere), by name."""
    return {**dict(model.named_parameters()), **dict(model.named_buffers()), **extra}


def _snapshot(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: t.detach().clone() for name, t in tensors.items()}


def _assert_same(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> None:
    assert after.keys() == before.keys()
    changed = [n for n, t in after.items()
               if t.dtype != before[n].dtype or not torch.equal(t, before[n])]
    assert changed == []
    leaves = [n for n, t in after.items() if not t.is_leaf]  # no autograd history left behind
    assert leaves == []


def _layout(model: nn.Module) -> dict[str, list[str]]:
    """Each module's attribute names and hook counts: tracing leaves nothing on the model."""
    return {name: sorted(vars(m)) + [str(len(m._forward_hooks)),
                                     str(len(m._forward_pre_hooks))]
            for name, m in model.named_modules()}


# --- transformers' StaticCache decode step --------------------------------------------------
def _static_cache_step() -> nn.Module:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                      max_position_embeddings=64)
    lm = transformers.LlamaForCausalLM(cfg).eval()
    lm.generation_config.cache_implementation = "static"
    step = executorch.TorchExportableModuleWithStaticCache(lm, batch_size=1,
                                                           max_cache_len=16).eval()
    with torch.no_grad():  # a prompt of three tokens already in the cache: state worth keeping
        for i, tok in enumerate((7, 11, 13)):
            step(input_ids=torch.tensor([[tok]]), cache_position=torch.tensor([i]))
    return step


def _cache_tensors(step: nn.Module, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    held = {f"static_cache.layers[{i}].{a}": getattr(layer, a)
            for i, layer in enumerate(step.static_cache.layers)
            for a in ("keys", "values", "cumulative_length")}
    return _tensors(step, {**held, **inputs})


def test_static_cache_decode_step_plan_optimize_save(tmp_path):
    step = _static_cache_step()
    inputs = {"input_ids": torch.tensor([[5]]), "cache_position": torch.tensor([3])}
    before, layout = _snapshot(_cache_tensors(step, inputs)), _layout(step)
    twin = copy.deepcopy(step)
    assert before["key_cache_0"].abs().sum() > 0

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graphopt.plan(step, inputs, target="cpu")
        _assert_same(before, _cache_tensors(step, inputs))
        opt = graphopt.optimize(step, (), kwargs=inputs, target="cpu")
        _assert_same(before, _cache_tensors(step, inputs))
        path = opt.save(tmp_path / "m.pt2")
        _assert_same(before, _cache_tensors(step, inputs))
        loaded = torch.export.load(path).module()  # graphopt.load: see the test below
    assert _layout(step) == layout
    assert step.static_cache.layers[0].keys is step.key_cache_0
    copy.deepcopy(step)  # still copyable: no autograd history on its cache

    fresh = {"input_ids": torch.tensor([[9]]), "cache_position": torch.tensor([3])}
    with torch.no_grad():
        want = copy.deepcopy(twin)(**fresh)
        saved = loaded(fresh["input_ids"], None, fresh["cache_position"])
        ours = opt.module(fresh["input_ids"], None, fresh["cache_position"])
        got = step(**fresh)  # the user's model as it was before graphopt: the same number
    assert torch.equal(got, want)
    for out in (saved, ours):
        assert (out - want).abs().max() <= 1e-4 * want.abs().max()


def test_static_cache_decode_step_loads_with_graphopt_load(tmp_path):
    """forward's inputs_embeds=None between the given inputs (a constant input), the cache's
    step counter lifted under two names, and the rotary no_grad block: graphopt.load reads
    them all."""
    step = _static_cache_step()
    inputs = {"input_ids": torch.tensor([[5]]), "cache_position": torch.tensor([3])}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = graphopt.optimize(step, (), kwargs=inputs, target="cpu", measure=False)
        loaded = graphopt.load(opt.save(tmp_path / "m.pt2"))
    with torch.no_grad():
        want = opt.module(inputs["input_ids"], None, inputs["cache_position"])
        got = loaded(inputs["input_ids"], None, inputs["cache_position"])
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()


# --- a buffer also reachable through other attributes ---------------------------------------
class _Aliased(nn.Module):
    """A cache registered as a buffer, also held by a namespace and a list, written in place
    through the namespace (torch.export sees only the registered name)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("cache", torch.linspace(-1, 1, 16).reshape(2, 8))
        self.holder = SimpleNamespace(k=self.cache)
        self.history = [self.cache]
        self.steps = torch.zeros(())  # an attribute tensor, registered nowhere

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.holder.k.add_(x.sum())
        self.steps.add_(1)
        return self.lin(x) * self.history[0].mean() + self.steps


def _aliased_tensors(model: _Aliased, x: torch.Tensor) -> dict[str, torch.Tensor]:
    return _tensors(model, {"holder.k": model.holder.k, "history[0]": model.history[0],
                            "steps": model.steps, "x": x})


def test_aliased_buffer_is_untouched_by_plan_and_optimize():
    torch.manual_seed(0)
    model, x = _Aliased().eval(), torch.randn(2, 8)
    before, twin = _snapshot(_aliased_tensors(model, x)), copy.deepcopy(model)
    graphopt.plan(model, x, target="cpu")
    _assert_same(before, _aliased_tensors(model, x))
    opt = graphopt.optimize(model, x, target="cpu", precision="fp32")
    _assert_same(before, _aliased_tensors(model, x))
    assert model.holder.k is model.cache and model.history[0] is model.cache
    assert opt.numerics[0]["within"]

    fresh = torch.randn(2, 8)
    with torch.no_grad():
        want = copy.deepcopy(twin)(x)
        assert torch.allclose(opt.module(x), want, rtol=1e-5, atol=1e-6)
        assert torch.equal(model(fresh), twin(fresh))  # the user's model: as before


def test_deploy_measurement_runs_on_copies(monkeypatch):
    """The measured deploy choice times the original model: on a copy, never the user's."""
    from graphopt.api import deploy

    monkeypatch.setenv(deploy.NO_DEPLOY_MEASURE_ENV, "0")

    def skipped(*_: object) -> None:
        raise GraphoptError("skipped in this test")

    monkeypatch.setattr(deploy, "_compiled", skipped)
    monkeypatch.setattr(deploy, "_session", skipped)
    torch.manual_seed(0)
    model, x = _Aliased().eval(), torch.randn(2, 8)
    before = _snapshot(_aliased_tensors(model, x))
    opt = graphopt.optimize(model, x, target="cpu", precision="fp32")
    assert opt.deploy.measured
    _assert_same(before, _aliased_tensors(model, x))


# --- a holder object among the inputs --------------------------------------------------------
class _TakesHolder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, state: SimpleNamespace) -> torch.Tensor:
        state.k.mul_(2)
        return self.lin(x) + state.k


def test_holder_in_the_inputs_is_untouched_by_plan():
    torch.manual_seed(0)
    model, state = _TakesHolder().eval(), SimpleNamespace(k=torch.ones(4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graphopt.plan(model, (torch.randn(2, 4), state), target="cpu")
    assert torch.equal(state.k, torch.ones(4)) and state.k.is_leaf


# --- a buffer with autograd history ----------------------------------------------------------
class _NonLeafBuffer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("b", self.lin.weight.sum(0) * 2)  # grad on: not a leaf

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + self.b


def test_non_leaf_buffer_plans_and_optimizes():
    torch.manual_seed(0)
    model, x = _NonLeafBuffer().eval(), torch.randn(3, 8)
    assert not model.b.is_leaf
    with torch.no_grad():
        want = model(x)
    b = model.b.detach().clone()
    graphopt.plan(model, x, target="cpu")
    opt = graphopt.optimize(model, x, target="cpu", precision="fp32")
    assert torch.equal(model.b, b) and model.b.grad_fn is not None  # the user's, as it was
    with torch.no_grad():
        assert torch.equal(model(x), want)
        assert torch.allclose(opt.module(x), want, rtol=1e-5, atol=1e-6)


def test_non_leaf_buffer_exports_to_onnx(tmp_path):
    """export_onnx copies the model before tracing it: privately, so a buffer with autograd
    history neither stops the copy nor comes back changed."""
    import numpy as np
    import onnxruntime as ort

    torch.manual_seed(0)
    model, x = _NonLeafBuffer().eval(), torch.randn(3, 8)
    b = model.b.detach().clone()
    opt = graphopt.optimize(model, x, target="cpu", precision="fp32")
    path = opt.export_onnx(tmp_path / "m.onnx")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
    with torch.no_grad():
        np.testing.assert_allclose(got, model(x).numpy(), rtol=1e-5, atol=1e-6)
    assert torch.equal(model.b, b) and model.b.grad_fn is not None


# --- a model copy.deepcopy refuses ----------------------------------------------------------
class _Locked(nn.Module):
    """Holds a lock (no deepcopy): traced as it is, under the guard."""

    def __init__(self, writes: bool) -> None:
        super().__init__()
        self.lin, self.lock, self.writes = nn.Linear(4, 4), threading.Lock(), writes
        self.steps = torch.zeros(())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.writes:
            self.steps.add_(1)
        return self.lin(x) + self.steps


def test_a_model_that_cannot_be_copied_is_traced_in_place_with_a_warning():
    model, x = _Locked(writes=False).eval(), torch.randn(2, 4)
    plan = graphopt.plan(model, x, target="cpu")
    assert any("could not copy _Locked" in w for w in plan.warnings)
    assert torch.equal(model.steps, torch.zeros(()))


def test_a_write_the_guard_catches_is_put_back_and_named():
    model, x = _Locked(writes=True).eval(), torch.randn(2, 4)
    with pytest.raises(GraphoptError, match=r"tracing _Locked changed .*steps \(value\)"):
        graphopt.plan(model, x, target="cpu")
    assert torch.equal(model.steps, torch.zeros(())) and model.steps.is_leaf


# --- the helpers themselves -----------------------------------------------------------------
def test_reachable_tensors_names_every_path_once():
    model, x = _Aliased(), torch.randn(2, 8)
    found = dict(reachable_tensors(model, (x,)))
    assert found["cache"] is model.cache and found["steps"] is model.steps
    assert found["lin.weight"] is model.lin.weight and found["inputs[0]"] is x
    assert "holder.k" not in found and "history[0]" not in found  # the cache, by one name


def test_private_copy_keeps_aliases_and_clones_non_leaves():
    model = _NonLeafBuffer()
    model.holder = SimpleNamespace(b=model.b)
    copied = private_copy(model)
    assert copied.b.is_leaf and copied.b is not model.b and torch.equal(copied.b, model.b)
    assert copied.holder.b is copied.b  # still one tensor, as in the user's model
    assert copied.lin.weight is not model.lin.weight
    shared = private_copy(model, share_parameters=True)
    assert shared.lin.weight is model.lin.weight and shared.b is not model.b


def test_guard_restores_what_changed_and_names_it():
    model, x = _Aliased().eval(), torch.randn(2, 8)
    before = _snapshot(_aliased_tensors(model, x))
    with pytest.raises(GraphoptError, match="cache") as err, \
            user_state_guard(model, x, what="a test"):
        with torch.no_grad():
            model.holder.k.add_(1)  # a write that escaped every private copy
    assert "restored" in err.value.problem and err.value.fix
    _assert_same(before, _aliased_tensors(model, x))


def test_guard_puts_back_a_rebound_tensor_and_drops_autograd_history():
    model, x = _Aliased().eval(), torch.randn(2, 8)
    before = _snapshot(_aliased_tensors(model, x))
    original = model.steps
    with pytest.raises(GraphoptError, match="steps"), user_state_guard(model, x):
        model.steps = torch.ones(())
        model.cache.add_(model.lin.weight[0])  # grad on: the buffer gains a grad_fn
    assert model.steps is original
    _assert_same(before, _aliased_tensors(model, x))


def test_guard_is_quiet_when_nothing_changed():
    model, x = _Aliased().eval(), torch.randn(2, 8)
    before = _snapshot(_aliased_tensors(model, x))
    with user_state_guard(model, x), torch.no_grad():
        private_copy(model)(x)
    _assert_same(before, _aliased_tensors(model, x))
