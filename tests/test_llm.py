"""LLM prefill and decode (``graphopt.api.llm``) and the batch advice at the throughput knee.

A tiny Llama (2 layers, hidden 64, 4 heads, 2 KV heads, head_dim 16, fp32) is planned once per
module; every number is checked against a hand computation or a bound it must respect.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import graphopt
from graphopt.analysis import KernelClass
from graphopt.api.llm import batch_points, plan_llm
from graphopt.decisions.memory_runtime.batch_advice import KNEE_FRACTION, advise_batch, step_time_at
from graphopt.decisions.memory_runtime.memory import ReservePolicy, memory_plan
from graphopt.errors import GraphoptError
from graphopt.frontends.llm_steps import DecodeStep, PrefillStep
from graphopt.hardware import get_target

transformers = pytest.importorskip("transformers")

LAYERS, HEADS, KV_HEADS, HEAD_DIM = 2, 4, 2, 16
PROMPT, CACHE = 32, 256
ROOT = Path(__file__).resolve().parents[1]


def _config(**extra: object) -> object:
    return transformers.LlamaConfig(
        num_hidden_layers=LAYERS, hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS, intermediate_size=128, vocab_size=256,
        max_position_embeddings=1024, **extra)


def _tiny(device: str = "cpu") -> nn.Module:
    torch.manual_seed(0)
    with torch.device(device):
        return transformers.LlamaForCausalLM(_config()).eval()


@pytest.fixture(scope="module")
def tiny_plan() -> graphopt.Plan:
    return plan_llm(_tiny(), "h100", batch=(1, 16), prompt_len=PROMPT, cache_len=CACHE)


def _kv_by_hand(batch: int, length: int = CACHE, dtype_bytes: int = 4) -> int:
    return 2 * LAYERS * KV_HEADS * HEAD_DIM * length * batch * dtype_bytes


def test_steps_match_the_model_token_by_token() -> None:
    model = _tiny()
    ids = torch.randint(0, 256, (3, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(ids).logits
        logits, keys, values = PrefillStep(model)(ids[:, :9])
        torch.testing.assert_close(logits[:, 0], ref[:, 8], rtol=1e-5, atol=1e-5)
        assert keys.shape == (LAYERS, 3, KV_HEADS, 9, HEAD_DIM) == values.shape
        logits, new_k, _ = DecodeStep(model)(ids[:, 9:], keys, values)
        torch.testing.assert_close(logits[:, 0], ref[:, 9], rtol=1e-5, atol=1e-5)
        assert new_k.shape == (LAYERS, 3, KV_HEADS, 1, HEAD_DIM)


def test_decode_gemms_are_gemvs_and_attention_reads_the_cache(tiny_plan) -> None:
    rows = {r.batch: r for r in tiny_plan.section.decode}
    weight_gemms = 7 * LAYERS + 1  # q, k, v, o, gate, up, down per layer, and lm_head
    assert rows[1].weight_gemm_classes == {"gemv": weight_gemms}
    assert rows[16].weight_gemm_classes == {"gemm": weight_gemms}  # M = batch = 16
    opt = tiny_plan.section.batch.opt
    linears = [n for n in tiny_plan.decode.nodes if n.op_type == "Linear"]
    assert len(linears) == weight_gemms and all(n.analysis.dims["M"] == opt for n in linears)
    attention = [n for n in tiny_plan.decode.nodes
                 if n.analysis.kernel_class is KernelClass.ATTENTION]
    assert len(attention) == LAYERS
    per_layer = _kv_by_hand(opt) // LAYERS
    for n in attention:
        d = n.analysis.dims
        assert (d["batch"], d["heads"], d["seq_q"], d["seq_kv"]) == (opt, HEADS, 1, CACHE + 1)
        assert n.analysis.bytes_read >= per_layer  # K and V of the whole cache, GQA heads once
        assert n.cost.bottleneck in ("memory", "latency")


def test_kv_bytes_match_the_hand_computation(tiny_plan) -> None:
    section = tiny_plan.section
    for r in section.decode:
        assert r.kv_read_bytes == _kv_by_hand(r.batch)
    for r in section.prefill:
        assert r.kv_write_bytes == _kv_by_hand(r.batch, PROMPT)
    mem = section.memory
    assert mem.kv_bytes_per_sequence == _kv_by_hand(1)
    assert mem.kv_bytes_per_token == _kv_by_hand(1, 1)
    assert mem.kv_bytes_at_max == _kv_by_hand(16)


def test_tokens_per_s_within_the_bandwidth_bound(tiny_plan) -> None:
    section, h100 = tiny_plan.section, get_target("h100")
    model = _tiny()  # the rotary inv_freq buffers are counted with the weights
    assert section.model.param_bytes == \
        4 * sum(t.numel() for t in [*model.parameters(), *model.buffers()])
    # the bound counts the weights the nodes read: not the rotary copy no node reads
    weights = section.memory.weight_bytes
    assert weights == section.model.param_bytes \
        - 4 * model.model.rotary_emb.original_inv_freq.numel()
    for r in section.decode:
        bound = r.batch * h100.bandwidth_bytes_per_s / (weights + _kv_by_hand(r.batch))
        assert r.bound_tokens_per_s == pytest.approx(bound)
        assert 0 < r.tokens_per_s <= r.tokens_per_s_static_cache <= bound
        assert r.tokens_per_s == pytest.approx(r.batch / r.step_s)
    for r in section.prefill:
        assert 0 < r.tokens_per_s <= r.bound_tokens_per_s
        assert r.tokens_per_s == pytest.approx(r.batch * PROMPT / r.step_s)


def test_memory_max_batch_follows_the_kv_cache_growth() -> None:
    """The cache dominates a sequence's bytes: four times the cache, about a quarter of the
    sequences; each max batch is the largest multiple of 8 that fits."""
    model = _tiny()
    maxes = {}
    for length in (1024, 4096):
        s = plan_llm(model, "h100", batch=(1, 8), prompt_len=8, cache_len=length).section
        mem = s.memory
        per_seq = mem.bytes_per_sequence
        assert mem.kv_bytes_per_sequence == _kv_by_hand(1, length) <= per_seq
        fixed = mem.required_bytes_at_max - round(per_seq * 8)
        room = mem.usable_bytes - fixed
        assert mem.max_batch_size * per_seq <= room < (mem.max_batch_size + 8) * per_seq
        assert mem.fits_at_max
        maxes[length] = mem.max_batch_size
    assert 3.5 <= maxes[1024] / maxes[4096] <= 4.1


def test_meta_device_plans_without_allocating() -> None:
    lp = plan_llm(_tiny("meta"), "a100", batch=4, prompt_len=8, cache_len=64)
    assert [r.batch for r in lp.section.decode] == [1, 2, 4]
    assert lp.section.decode[0].kv_read_bytes == _kv_by_hand(1, 64)


def test_report_sections_render(tiny_plan) -> None:
    md, html = tiny_plan.to_markdown(), tiny_plan.to_html()
    assert "## LLM prefill and decode" in md and "### Decode (one token per sequence)" in md
    assert "| 1 |" in md and "gemv x15" in md and "**recommended batch:**" in md
    assert "LLM prefill and decode" in html and "gemv x15" in html
    assert tiny_plan.to_dict()["llm"]["cache_len"] == CACHE


def test_bad_arguments_are_graphopt_errors() -> None:
    with pytest.raises(GraphoptError, match="batch"):
        plan_llm(_tiny(), "h100", batch=(1, 1))
    with pytest.raises(GraphoptError, match="cache_len"):
        plan_llm(_tiny(), "h100", cache_len=0)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2))
    with pytest.raises(GraphoptError, match="not a Llama-layout"):
        plan_llm(gpt2, "h100")


def test_batch_points() -> None:
    assert batch_points(1, 64) == [1, 2, 4, 8, 16, 32, 64]
    assert batch_points(3, 20) == [3, 4, 8, 16, 20]
    assert batch_points(5, 5) == [5]


# --- batch advice: the throughput knee ---------------------------------------------------------
class _CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(),
                                  nn.Conv2d(64, 64, 3, padding=1), nn.ReLU())
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).mean((2, 3)))


@pytest.fixture(scope="module")
def cnn_plan() -> graphopt.Plan:
    return graphopt.plan(_CNN().eval(), torch.randn(8, 3, 64, 64), "h100")


def test_cnn_batch_knee_below_the_memory_max(cnn_plan) -> None:
    mem = cnn_plan.memory
    rec, top = mem.recommended_batch_size, mem.max_batch_size
    assert 8 <= rec < top // 8 and mem.batch_decided_by == "throughput"
    assert f"memory allows up to {top}" in mem.batch_advice
    rates = {int(b): s for b, s in mem.samples_per_s_at.items()}
    best = max(rates.values())
    assert rates[rec] >= KNEE_FRACTION * best > max(s for b, s in rates.items() if b < rec)
    assert rates[1] < rates[rec] and rec % 8 == 0


def test_batch_curve_at_the_traced_batch_is_the_plan_estimate(cnn_plan) -> None:
    assert step_time_at(cnn_plan, 8, 8) == pytest.approx(cnn_plan.est_latency_s, rel=1e-9)
    # per-node scaling agrees with re-sizing the traced graph at another batch
    again = graphopt.plan(_CNN().eval(), torch.randn(32, 3, 64, 64), "h100")
    assert step_time_at(cnn_plan, 32, 8) == pytest.approx(again.est_latency_s, rel=0.02)


def test_memory_decides_when_it_caps_the_batch(cnn_plan) -> None:
    total = cnn_plan.target.memory_bytes
    mem = cnn_plan.memory
    room = mem.param_bytes + mem.constant_bytes + mem.workspace_bytes \
        + int(20.5 * mem.activation_peak_per_sample_bytes)
    tight = ReservePolicy(total - room, 0.0, "test: about 20 samples of room")
    mp = memory_plan(cnn_plan, reserve_policy=tight)
    assert mp.batch_advice is not None and mp.max_batch_size == 16
    assert mp.recommended_batch_size == 16 and mp.batch_decided_by == "memory"
    assert "still on the rising part" in mp.batch_advice
    assert advise_batch(cnn_plan, 0, 8).recommended == 0


@pytest.mark.slow
@pytest.mark.zoo
def test_llm_example_runs() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "llm_decode.py")],
                         capture_output=True, text=True, timeout=600, cwd=ROOT, check=True).stdout
    assert "7B Llama on h100 (bf16): KV cache 1.00 GiB per sequence of 2048 tokens" in out
    assert "(does not fit); largest batch that fits: 56;" in out  # (73.6 - 12.6) GiB / 1 GiB
    assert "matches the original at batch 1, 4, 16" in out
    # one row per format: GEMMs at it, weights GiB, KV GiB per sequence, max batch, tok/s
    rows = {w[0]: w for line in out.splitlines()
            if (w := line.split())[:1] in (["bf16"], ["FP8"], ["INT4"])}
    assert [rows[f][1] for f in ("bf16", "FP8", "INT4")] == ["225/225", "223/225", "223/225"]
    assert [float(rows[f][2]) for f in ("bf16", "FP8", "INT4")] == [12.6, 6.5, 3.7]
    assert {rows[f][4] for f in rows} == {"1.00"}
    assert int(rows["bf16"][6]) < int(rows["FP8"][6]) <= int(rows["INT4"][6])
    assert float(rows["bf16"][7]) < float(rows["FP8"][7]) < float(rows["INT4"][7])  # batch 1


def test_llm_section_recommends_within_the_range_and_memory(tiny_plan) -> None:
    mem = tiny_plan.section.memory
    assert mem.max_batch_size > 16  # the tiny model fits far more than the range's max
    assert 1 <= mem.recommended_batch_size <= 16
    assert mem.batch_decided_by in ("throughput", "range")
    assert mem.weight_bytes == memory_plan(tiny_plan.decode).param_bytes  # as traced
    assert tiny_plan.decode.memory.param_bytes == mem.weight_bytes
    assert tiny_plan.section.quantize == "none" and mem.param_format == "as traced"


def test_cli_llm_plans_both_phases(tmp_path):
    import subprocess
    import sys
    import textwrap

    (tmp_path / "llm.py").write_text(textwrap.dedent("""
        from transformers import LlamaConfig, LlamaForCausalLM

        def build():
            config = LlamaConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                                 num_key_value_heads=2, intermediate_size=128, vocab_size=256)
            return LlamaForCausalLM(config).eval(), ()
    """))
    out = subprocess.run([sys.executable, "-m", "graphopt.cli", "llm",
                          f"{tmp_path / 'llm.py'}:build", "--target", "h100", "--batch", "1:8",
                          "--prompt", "32", "--cache", "64", "--md", str(tmp_path / "r.md")],
                         capture_output=True, text=True, check=True).stdout
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["1"], ["8"])]
    assert [r[0] for r in rows] == ["1", "8"]
    assert all(float(r[1]) <= float(r[2]) for r in rows)  # tokens/s within the bound
    assert "KV cache" in out and (tmp_path / "r.md").exists()
    bad = subprocess.run([sys.executable, "-m", "graphopt.cli", "llm", "model.onnx"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "file.py:function" in bad.stderr


def test_decode_reads_the_keys_and_the_values_cache(tiny_plan) -> None:
    read = {t.name for n in tiny_plan.decode.nodes for t in n.inputs if t is not None}
    assert {"keys", "values"} <= read  # two inputs: export merges one tensor passed twice
