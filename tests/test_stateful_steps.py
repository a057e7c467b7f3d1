"""Issue 31, item 7: a model that writes state of its own (a static KV cache written with
``index_copy_``, a call counter) is planned, optimized and saved as torch, and never exported
to ONNX, which has no state: the export would drop the write, and every later call would read
the first state. The error says so and points at the torch artifact."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import graphopt


class _Cache(nn.Module):
    """A decode step over a static cache: the new row goes in at ``pos``, attention reads all."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(16, 16)
        self.register_buffer("cache", torch.zeros(8, 16))

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        self.cache.index_copy_(0, pos, self.proj(x))
        return torch.softmax(x @ self.cache.T, dim=-1) @ self.cache


def test_a_stateful_step_optimizes_saves_and_refuses_onnx(tmp_path: Path) -> None:
    model = _Cache().eval()
    x, pos = torch.randn(1, 16), torch.tensor([2])
    opt = graphopt.optimize(model, (x, pos), target="cpu")
    assert torch.equal(model.cache, torch.zeros(8, 16))  # the user's cache: never written
    assert opt.deploy.artifact != "onnxruntime"
    with pytest.raises(graphopt.GraphoptError, match="writes its own tensors .*cache") as e:
        opt.export_onnx(tmp_path / "m.onnx")
    assert "opt.save" in e.value.fix and not (tmp_path / "m.onnx").exists()
    opt.save(tmp_path / "m.pt2")
    loaded, twin = graphopt.load(tmp_path / "m.pt2"), _Cache().eval()
    with torch.no_grad():  # two steps: the second reads what the first wrote
        for step, p in ((torch.randn(1, 16), 0), (torch.randn(1, 16), 1)):
            want = twin(step, torch.tensor([p]))
            torch.testing.assert_close(loaded(step, torch.tensor([p])), want)


def test_transformers_static_cache_step_refuses_onnx(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    from transformers.integrations import executorch

    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=1, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=128,
                                      max_position_embeddings=64)
    lm = transformers.LlamaForCausalLM(config).eval()
    lm.generation_config.cache_implementation = "static"
    step = executorch.TorchExportableModuleWithStaticCache(lm, batch_size=1,
                                                           max_cache_len=16).eval()
    inputs = {"input_ids": torch.tensor([[5]]), "cache_position": torch.tensor([0])}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = graphopt.optimize(step, (), kwargs=inputs, target="cpu")
        with pytest.raises(graphopt.GraphoptError, match="key_cache_0"):
            opt.export_onnx(tmp_path / "step.onnx")
