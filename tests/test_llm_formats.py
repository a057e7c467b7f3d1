"""``plan_llm(quantize=...)``: the weight GEMMs costed at the format the artifact applies.

One Llama-layout model on the meta device (2 layers, hidden 2048, 16 heads, 4 KV heads,
intermediate 8192, vocab 4096, bf16: nothing is allocated) is traced once per module on h100 and
re-costed per format with ``LLMPlan.requantize``. Its MLP GEMMs are large enough that the plan's
own precision decisions quantize them while the attention projections stay bf16 (launch-bound at
the opt batch), so "auto" is a real per-node mix. Weight bytes are checked against a hand count
at each format's bits per weight (FP8 8, INT4 4 + 32/128 = 4.25).
"""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import pytest
import torch

from graphopt.analysis import KernelClass
from graphopt.analysis.kernel_class import GEMM_LIKE
from graphopt.api.llm import LLMPlan, plan_llm, weight_formats
from graphopt.decisions.memory_runtime.memory import max_batch_that_fits, memory_plan
from graphopt.decisions.quant_formats import get_format
from graphopt.errors import GraphoptError
from graphopt.hardware import get_target
from graphopt.ir.plan import Plan
from graphopt.ir.plan_llm import DecodeRow, GemmFormats, PrefillRow

transformers = pytest.importorskip("transformers")

LAYERS, HIDDEN, HEADS, KV_HEADS, FFN, VOCAB = 2, 2048, 16, 4, 8192, 4096
PROMPT, CACHE = 32, 256
GEMMS = 7 * LAYERS + 1  # q, k, v, o, gate, up, down per layer, and lm_head
FP8, INT4 = "fp8_e4m3", "int4"


def _model() -> torch.nn.Module:
    config = transformers.LlamaConfig(
        num_hidden_layers=LAYERS, hidden_size=HIDDEN, num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS, intermediate_size=FFN, vocab_size=VOCAB,
        max_position_embeddings=1024)
    with torch.device("meta"):
        return transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()


@pytest.fixture(scope="module")
def plans() -> dict[str, LLMPlan]:
    lp = plan_llm(_model(), "h100", batch=(1, 16), prompt_len=PROMPT, cache_len=CACHE)
    return {"none": lp, FP8: lp.requantize("fp8"), INT4: lp.requantize("int4"),
            "auto": lp.requantize("auto")}


def _weight_gemms(plan: Plan) -> list:
    return [n for n in plan.nodes if n.analysis.kernel_class in GEMM_LIKE
            and n.analysis.kernel_class is not KernelClass.ATTENTION
            and any(t is not None and t.kind == "param" for t in n.inputs)]


def _matrix_numel(node) -> int:
    return sum(t.numel for t in node.inputs
               if t is not None and t.kind == "param" and len(t.shape) >= 2)


def _row(lp: LLMPlan, phase: str, batch: int) -> DecodeRow | PrefillRow:
    return lp.section.row(phase, batch)


def test_quantized_decode_is_faster_and_reads_fewer_bytes(plans) -> None:
    base = _row(plans["none"], "decode", 1).tokens_per_s
    fp8 = _row(plans[FP8], "decode", 1).tokens_per_s
    int4 = _row(plans[INT4], "decode", 1).tokens_per_s
    assert base < fp8 < int4  # batch 1: the GEMVs stream their weights
    for fmt in (FP8, INT4):
        for b in (1, 16):
            assert _row(plans[fmt], "decode", b).bound_tokens_per_s > \
                _row(plans["none"], "decode", b).bound_tokens_per_s
    # prefill: FP8 computes at its own peak, INT4 (weight-only) at bf16's
    assert _row(plans[FP8], "prefill", 16).tokens_per_s > \
        _row(plans["none"], "prefill", 16).tokens_per_s
    assert _row(plans[INT4], "prefill", 16).tokens_per_s >= \
        _row(plans["none"], "prefill", 16).tokens_per_s


def test_weight_bytes_at_each_format_by_hand(plans) -> None:
    """Every weight GEMM but the first and last at the format; the rest at bf16."""
    decode = plans["none"].decode
    gemms = _weight_gemms(decode)
    assert len(gemms) == GEMMS
    bf16 = plans["none"].section.memory.weight_bytes
    middle = gemms[1:-1]
    for fmt, ratio in ((FP8, 8 / 16), (INT4, 4.25 / 16)):
        mem = plans[fmt].section.memory
        quantized = sum(math.ceil(_matrix_numel(n) * get_format(fmt).bits_per_weight / 8)
                        for n in middle)
        assert mem.weight_bytes == bf16 - sum(2 * _matrix_numel(n) for n in middle) + quantized
        saved = bf16 - mem.weight_bytes  # the quantized GEMMs' weights at ratio x bf16
        assert saved == pytest.approx(2 * sum(_matrix_numel(n) for n in middle) * (1 - ratio),
                                      rel=1e-6)
        assert mem.param_format == "per-node"
        assert plans[fmt].section.weight_formats.decode.gemm_formats == \
            {"bf16": 2, fmt: GEMMS - 2}


def test_bound_and_max_batch_follow_the_weight_bytes(plans) -> None:
    h100 = get_target("h100")
    maxes = {}
    for fmt, lp in plans.items():
        s = lp.section
        mem = s.memory
        for r in s.decode:
            assert r.bound_tokens_per_s == pytest.approx(
                r.batch * h100.bandwidth_bytes_per_s / (mem.weight_bytes
                                                           + r.kv_read_bytes))
            assert 0 < r.tokens_per_s <= r.bound_tokens_per_s
        plan_mem = lp.decode.memory  # the decode plan's memory section: the same plan
        assert plan_mem.param_bytes == mem.weight_bytes
        assert plan_mem.max_batch_size == mem.max_batch_size
        fixed = mem.weight_bytes + plan_mem.constant_bytes + plan_mem.workspace_bytes
        assert mem.max_batch_size == max_batch_that_fits(
            mem.usable_bytes - fixed, plan_mem.activation_peak_per_sample_bytes)[0]
        maxes[fmt] = mem.max_batch_size
    assert maxes["none"] < maxes[FP8] < maxes[INT4]


def test_auto_is_the_plans_per_node_choice(plans) -> None:
    lp = plans["auto"]
    section = lp.section
    assert section.quantize == "auto"
    for phase in ("prefill", "decode"):
        plan = getattr(lp, phase)
        wf = weight_formats(plan, "auto")
        chosen = {n.name: n.decisions["precision"].detail.format for n in _weight_gemms(plan)}
        assert dict(wf.applied) == {k: v for k, v in chosen.items() if v != "bf16"}
        assert set(wf.kept) == {k for k, v in chosen.items() if v == "bf16"}
        assert wf.kept == {n.name: n.decisions["precision"].reason for n in _weight_gemms(plan)
                           if n.name in wf.kept}
        assert getattr(section.weight_formats, phase).gemm_formats == dict(wf.counts)
        assert len(wf.applied) >= 2 * LAYERS and len(wf.kept) >= 2  # a real mix
        # the memory plan counts the plan's own decisions on those GEMMs
        decisions = {n.name: n.decisions["precision"] for n in _weight_gemms(plan)}
        assert plan.memory.param_bytes == memory_plan(plan, decisions).param_bytes
    assert _row(lp, "decode", 1).tokens_per_s > _row(plans["none"], "decode", 1).tokens_per_s


def test_an_explicit_format_keeps_the_first_and_last_gemm(plans) -> None:
    for fmt in (FP8, INT4):
        kept = plans[fmt].section.weight_formats.decode.kept
        gemms = _weight_gemms(plans[fmt].decode)
        assert list(kept) == [gemms[0].name, gemms[-1].name]
        assert kept[gemms[0].name].startswith("first weight GEMM")
        assert kept[gemms[-1].name].startswith("last weight GEMM")
        # the plan's own precision decision keeps them at bf16 too
        assert {n.decisions["precision"].detail.format for n in (gemms[0], gemms[-1])} == \
            {"bf16"}


def test_none_is_the_weights_own_dtype(plans) -> None:
    s = plans["none"].section
    assert s.quantize == "none" and s.memory.param_format == "as traced"
    assert s.weight_formats.decode == GemmFormats({"bf16": GEMMS}, {})
    assert s.notes[0].startswith("costed at the weights' dtype (bf16)")
    again = plans[FP8].requantize("none").section  # back and forth: the same numbers
    assert again.decode == s.decode and again.memory == s.memory


def test_requantize_equals_a_fresh_plan(plans) -> None:
    fresh = plan_llm(_model(), "h100", batch=(1, 16), prompt_len=PROMPT, cache_len=CACHE,
                     quantize="fp8").section
    again = plans[FP8].section
    for key in ("decode", "prefill", "memory", "weight_formats", "quantize"):
        assert getattr(fresh, key) == getattr(again, key), key


def test_memory_plan_at_applied_formats(plans) -> None:
    """What optimize's caller passes: node -> the format it applied."""
    decode = plans["none"].decode
    middle = _weight_gemms(decode)[1:-1]
    traced = memory_plan(decode).param_bytes
    for fmt, bits in ((FP8, 8.0), (INT4, 4.25)):
        applied = {n.name: fmt for n in middle}
        mp = memory_plan(decode, applied)
        assert mp.param_bytes == traced - sum(
            2 * _matrix_numel(n) - math.ceil(_matrix_numel(n) * bits / 8) for n in middle)
        assert mp.param_bytes == plans[fmt].section.memory.weight_bytes
        assert mp == plans[fmt].decode.memory


def test_a_format_the_target_cannot_run_names_the_fix() -> None:
    with pytest.raises(GraphoptError, match="FP8") as e:
        plan_llm(_model(), "a100", batch=4, prompt_len=8, cache_len=16, quantize="fp8")
    assert "quantize='int8'" in e.value.fix and "quantize='auto'" in e.value.fix
    with pytest.raises(GraphoptError, match="float format") as e:
        plan_llm(_model(), "h100", quantize="bf16")
    assert "quantize='none'" in e.value.fix
    with pytest.raises(GraphoptError, match="unknown quantize"):
        plan_llm(_model(), "h100", quantize="int3")


def test_report_shows_the_formats(plans) -> None:
    md = plans[FP8].to_markdown()
    assert f"bf16 x2, {FP8} x{GEMMS - 2} weight GEMMs" in md
    assert "quantize=fp8_e4m3 · " in md
    html = plans["auto"].to_html()
    assert "decode " in html and "prefill " in html and "quantize=auto (each GEMM" in html


def test_cli_quantize(tmp_path) -> None:
    (tmp_path / "llm.py").write_text(textwrap.dedent("""
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        def build():
            config = LlamaConfig(hidden_size=256, num_hidden_layers=1, num_attention_heads=4,
                                 num_key_value_heads=2, intermediate_size=512, vocab_size=256)
            with torch.device("meta"):
                return LlamaForCausalLM(config).to(torch.bfloat16), ()
    """))
    out = subprocess.run([sys.executable, "-m", "graphopt.cli", "llm",
                          f"{tmp_path / 'llm.py'}:build", "--target", "h100", "--batch", "1:4",
                          "--prompt", "8", "--cache", "16", "--quantize", "int4"],
                         capture_output=True, text=True, check=True).stdout
    assert "quantize int4: decode weight GEMMs bf16 x2, int4 x6" in out
