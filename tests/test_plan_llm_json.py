"""The ``llm`` section is a typed record (issue 32, part E): read by attribute, written as the
report has always written it, and both phase plans of ``plan_llm`` read back equal.

A tiny Llama (2 layers, 2 KV heads, head_dim 16, fp32) is planned once per module.
"""

from __future__ import annotations

import json

import pytest
import torch

from graphopt.api.llm import LLMPlan, plan_llm
from graphopt.errors import GraphoptError
from graphopt.ir.plan import Plan
from graphopt.ir.plan_llm import DecodeRow, GemmFormats, LLMSection, PrefillRow

transformers = pytest.importorskip("transformers")

LAYERS, KV_HEADS, HEAD_DIM, CACHE = 2, 2, 16, 64


@pytest.fixture(scope="module")
def lp() -> LLMPlan:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        num_hidden_layers=LAYERS, hidden_size=64, num_attention_heads=4,
        num_key_value_heads=KV_HEADS, intermediate_size=128, vocab_size=256,
        max_position_embeddings=256)
    model = transformers.LlamaForCausalLM(config).eval()
    return plan_llm(model, "h100", batch=(1, 8), prompt_len=16, cache_len=CACHE)


def test_the_llm_section_is_a_record_read_by_attribute(lp: LLMPlan) -> None:
    s = lp.section
    assert isinstance(s, LLMSection) and lp.prefill.llm is s
    assert all(isinstance(r, DecodeRow) for r in s.decode)
    assert all(isinstance(r, PrefillRow) for r in s.prefill)
    assert [r.batch for r in s.decode] == [r.batch for r in s.prefill] == [1, 2, 4, 8]
    assert (s.batch.min, s.batch.max, s.model.layers, s.model.dtype) == (1, 8, LAYERS, "float32")
    assert s.memory.kv_bytes_per_sequence == 2 * LAYERS * KV_HEADS * HEAD_DIM * CACHE * 4
    assert s.row("decode", 4) is s.decode[2] and s.row("prefill", 8) is s.prefill[3]
    with pytest.raises(KeyError, match="at batch 3"):
        s.row("decode", 3)
    assert s.weight_formats.decode == GemmFormats({"fp32": 7 * LAYERS + 1}, {})
    d = lp.to_dict()["llm"]
    assert d == s.to_json()
    assert list(d["decode"][0]) == ["batch", "step_s", "weight_gemm_classes",
                                    "gemm_bottlenecks", "launch_s", "tokens_per_s",
                                    "kv_read_bytes", "bound_tokens_per_s", "cache_append_s",
                                    "tokens_per_s_static_cache", "share_of_bound", "fits"]
    assert d["memory"]["max_batch_size"] == s.memory.max_batch_size


@pytest.mark.parametrize("quantize", ["none", "int8"])
def test_both_phase_plans_read_back_equal(lp: LLMPlan, quantize: str) -> None:
    lp = lp.requantize(quantize)
    assert bool(lp.section.weight_formats.decode.kept) == (quantize != "none")
    for plan in (lp.prefill, lp.decode):
        text = plan.to_json()
        back = Plan.from_json(text)
        assert back == plan and back.llm == lp.section
        assert back.to_json() == text


def test_a_mistyped_or_unknown_llm_key_is_refused_by_path(lp: LLMPlan) -> None:
    data = json.loads(lp.decode.to_json())
    data["llm"]["decode"][0]["fits"] = "yes"
    with pytest.raises(GraphoptError, match=r"llm\.decode\[0\]\.fits is 'yes', expected bool"):
        Plan.from_json(data)
    data = json.loads(lp.decode.to_json())
    data["llm"]["memory"]["kv_bytes"] = 1
    with pytest.raises(GraphoptError, match=r"llm\.memory has key\(s\) \['kv_bytes'\]"):
        Plan.from_json(data)
