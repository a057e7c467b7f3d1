"""Causal LMs as configured (issue 24, item 3): ``use_cache=True`` is transformers' default, and
torch.export cannot return the ``DynamicCache`` it makes. graphopt traces ``forward`` with
``use_cache=False`` passed by keyword, leaves the user's config as it is, and says so."""

from __future__ import annotations

import pytest
import torch

import graphopt

transformers = pytest.importorskip("transformers")


def _qwen2() -> torch.nn.Module:
    cfg = transformers.Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64)
    return transformers.Qwen2ForCausalLM(cfg)


def _llama() -> torch.nn.Module:
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(cfg)


def _model(build):
    torch.manual_seed(0)
    model = build().eval()
    assert model.config.use_cache is True  # transformers' default, as a user has it
    return model, torch.randint(0, 64, (1, 8))


def _cache_warning(warnings: list[str]) -> list[str]:
    return [w for w in warnings if "use_cache=False" in w and "past_key_values" in w]


@pytest.mark.parametrize("build", [_qwen2, _llama], ids=["qwen2", "llama"])
def test_plan_traces_without_cache_and_says_so(build) -> None:
    model, ids = _model(build)
    plan = graphopt.plan(model, (ids,))
    assert model.config.use_cache is True
    assert _cache_warning(plan.warnings), plan.warnings
    assert plan.summary.node_count > 10
    assert not any("make_fx" in w for w in plan.warnings)  # torch.export captured it


@pytest.mark.parametrize("build", [_qwen2, _llama], ids=["qwen2", "llama"])
def test_optimize_matches_logits_with_config_untouched(build, tmp_path) -> None:
    model, ids = _model(build)
    with torch.no_grad():
        expected = model(ids).logits
    # fp32: the lossless passes only, so the logits must match at fp32's tolerance
    opt = graphopt.optimize(model, (ids,), target="cpu", measure=False, precision="fp32")
    assert model.config.use_cache is True
    assert _cache_warning(opt.plan.warnings), opt.plan.warnings
    # the checks compared like with like (a reference with the cache cannot match at all)
    assert all(n.within for n in opt.info.numerics), opt.info.numerics
    with torch.no_grad():
        out = opt.module(ids)  # called as the user calls the model
    assert getattr(out, "past_key_values", None) is None  # the cache output is left out
    torch.testing.assert_close(out.logits, expected, rtol=1e-5, atol=1e-5)
    loaded = graphopt.load(opt.save(tmp_path / "lm.pt2"))
    with torch.no_grad():
        again = loaded(ids)
    logits = again["logits"] if isinstance(again, dict) else again.logits
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)


def test_cache_off_or_given_is_traced_as_is() -> None:
    """No copy and no warning where the cache is already off or the caller chose."""
    from graphopt.frontends.torch_inputs import without_cache

    model, _ = _model(_qwen2)
    assert without_cache(model, {"use_cache": True}) == (model, None)
    model.config.use_cache = False
    assert without_cache(model, {}) == (model, None)
    linear = torch.nn.Linear(2, 2)
    assert without_cache(linear, {}) == (linear, None)


def test_export_onnx_of_a_causal_lm_as_configured(tmp_path) -> None:
    """The ONNX artifact too: exported without the cache output, the config untouched."""
    import onnxruntime as ort

    model, ids = _model(_qwen2)
    opt = graphopt.optimize(model, (ids,), target="cpu", measure=False, precision="fp32",
                            quantize="none")
    path = opt.export_onnx(str(tmp_path / "lm.onnx"))
    assert model.config.use_cache is True
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert len(session.get_outputs()) == 1  # the logits; no past_key_values
    with torch.no_grad():
        expected = model(ids).logits.numpy()
    (logits,) = session.run(None, {session.get_inputs()[0].name: ids.numpy()})
    assert abs(logits - expected).max() <= 1e-4 * abs(expected).max()
