"""Tensor parallelism: block recognition on Llama, Mistral (GQA) and GPT-2 graphs (where it fires,
where it must not, and the fallbacks when heads do not divide), the cost of a split against a
hand computation, the ring all-reduce, and the memory limits."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from graphopt.cost import estimate
from graphopt.decisions.memory_runtime.memory import gemm_workspace_bytes
from graphopt.decisions.planner import build_plan
from graphopt.frontends import load_graph
from graphopt.hardware import get_target
from graphopt.hardware.profile import Link
from graphopt.partition import parse_devices
from graphopt.partition.collectives import group_link, ring_allreduce_s
from graphopt.partition.tensor_parallel import split_analysis, tensor_parallel
from graphopt.partition.tp_blocks import can_split, find_tp_blocks, parameter_fqns
from tests.arch_zoo import build
from tests.irbuild import G

H100 = get_target("h100")
TWO = "cuda:0=h100,cuda:1=h100"


def plan_of(model, inputs):
    graph = load_graph(model, inputs)
    return build_plan(graph, H100), graph


@pytest.fixture(scope="module")
def llama():
    return plan_of(*build("llama"))  # 4 heads, 2 KV heads, intermediate 128


@pytest.fixture(scope="module")
def gpt2():
    return plan_of(*build("gpt2"))  # fused QKV Conv1D (addmm), 2 layers


def tiny_llama(heads: int, kv_heads: int, hidden: int, inter: int):
    import transformers

    from tests.arch_zoo import LastHidden, _ids

    cfg = transformers.LlamaConfig(num_hidden_layers=1, hidden_size=hidden,
                                   num_attention_heads=heads, num_key_value_heads=kv_heads,
                                   intermediate_size=inter, vocab_size=256,
                                   max_position_embeddings=64, use_cache=False)
    torch.manual_seed(0)
    return plan_of(LastHidden(transformers.LlamaModel(cfg)), (_ids(),))


# --- recognition ---------------------------------------------------------------------------

def test_llama_attention_and_mlp_blocks_with_module_paths(llama):
    plan, graph = llama
    blocks, reasons = find_tp_blocks(plan, 2, source=graph)
    assert reasons == []
    attn, mlp = blocks
    assert attn.kind == "attention" and mlp.kind == "mlp"
    assert (attn.heads, attn.kv_heads, attn.head_dim, attn.hidden) == (4, 2, 16, 64)
    assert not attn.fused_qkv and attn.weight_layout == "linear" and attn.note == ""
    assert attn.column_modules == tuple(f"model.layers.0.self_attn.{p}_proj" for p in "qkv")
    assert attn.row_modules == ("model.layers.0.self_attn.o_proj",)
    assert {plan.node(n).analysis.kernel_class.value for n in attn.nodes} >= {
        "gemm", "attention", "rope"}
    # the shared RoPE cos/sin chain and the norms stay outside the block
    assert not any(plan.node(n).analysis.kernel_class.value == "rmsnorm" for n in attn.nodes)
    assert not any(n.startswith("wrap_with_set_grad_enabled") for n in attn.nodes)
    assert mlp.column_modules == ("model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj")
    assert mlp.row_modules == ("model.layers.0.mlp.down_proj",)
    assert (mlp.hidden, mlp.inner) == (64, 128)
    # the user's module (not the traced graph) gives the same paths
    same, _ = find_tp_blocks(plan, 2, source=build("llama")[0])
    assert same[1].column_modules == mlp.column_modules


def test_gqa_kv_heads_must_divide_the_degree(llama):
    plan, _ = llama
    blocks, reasons = find_tp_blocks(plan, 4)
    assert [b.kind for b in blocks] == ["mlp"]
    assert len(reasons) == 1 and "2 KV heads do not divide by degree 4" in reasons[0]
    everything, none = find_tp_blocks(plan)  # no degree: every block, nothing checked
    assert len(everything) == 2 and none == []


def test_mistral_gqa():
    plan, _ = plan_of(*build("mistral"))
    blocks, reasons = find_tp_blocks(plan, 2)
    attn = next(b for b in blocks if b.kind == "attention")
    assert (attn.heads, attn.kv_heads) == (4, 2) and reasons == []
    k_proj = plan.node(attn.column[1])
    assert k_proj.analysis.dims["N"] == attn.kv_heads * attn.head_dim  # read from its width


def test_heads_that_do_not_divide_fall_back_with_a_reason():
    plan, _ = tiny_llama(heads=3, kv_heads=3, hidden=48, inter=96)
    blocks, reasons = find_tp_blocks(plan, 2)
    assert [b.kind for b in blocks] == ["mlp"]  # 96 divides by 2
    assert "3 heads do not divide by degree 2" in reasons[0]
    blocks3, reasons3 = find_tp_blocks(plan, 3)
    assert sorted(b.kind for b in blocks3) == ["attention", "mlp"] and reasons3 == []
    # the cost model runs the fallback whole on both devices and says so
    tp = tensor_parallel(plan, TWO)
    assert len(tp.splits) == 1 and tp.fallbacks == tuple(reasons)


def test_intermediate_that_does_not_divide():
    plan, _ = tiny_llama(heads=4, kv_heads=4, hidden=64, inter=90)
    blocks, reasons = find_tp_blocks(plan, 4)
    assert [b.kind for b in blocks] == ["attention"]
    assert "intermediate size 90 does not divide by degree 4" in reasons[0]


def test_gpt2_fused_qkv_conv1d(gpt2):
    plan, graph = gpt2
    blocks, reasons = find_tp_blocks(plan, 2, source=graph)
    assert [b.kind for b in blocks] == ["attention", "mlp"] * 2 + ["lm_head"] and reasons == []
    attn, mlp = blocks[:2]
    assert attn.fused_qkv and len(attn.column) == 1 and (attn.heads, attn.kv_heads) == (4, 4)
    assert plan.node(attn.column[0]).analysis.dims["N"] == 3 * 64
    assert attn.weight_layout == "k_by_n" and "fused" in attn.note and "Conv1D" in attn.note
    assert attn.column_modules == ("model.transformer.h.0.attn.c_attn",)
    assert mlp.column_modules == ("model.transformer.h.0.mlp.c_fc",)
    assert mlp.row_modules == ("model.transformer.h.0.mlp.c_proj",)
    # the GELU (tanh form) between c_fc and c_proj is inside the MLP block
    assert any(plan.node(n).op_type == "Tanh" for n in mlp.nodes)
    # the LM head (a GEMM after the final norm, widening to the vocabulary) is its own block,
    # named by the Linear though its weight is tied to the token embedding
    head = blocks[-1]
    assert head.column_modules == ("model.lm_head",) and head.row == () and head.note == ""
    assert (head.hidden, head.inner) == (64, plan.node(head.column[0]).analysis.dims["N"])
    assert head.dims_text() == {"column": "N (vocabulary)"}
    assert all("lm_head" not in m for b in blocks[:-1] for m in b.column_modules + b.row_modules)


def mlp_graph(m: int, h: int, i: int, out: int | None = None, leak: bool = False,
              dtype: str = "fp32"):
    """x (m, h) -> MatMul W1 (h, i) -> Relu -> MatMul W2 (i, out or h)."""
    g = G()
    x = g.input("x", (m, h), dtype)
    up = g.op("MatMul", [x, g.param("w1", (h, i), dtype)], (m, i), dtype, name="up")
    act = g.op("Relu", [up], (m, i), dtype, name="act")
    down = g.op("MatMul", [act, g.param("w2", (i, out or h), dtype)], (m, out or h), dtype,
                name="down")
    return g.build([down, act] if leak else [down])


def test_must_not_fire():
    # a classifier head (does not return to the hidden size)
    plan = build_plan(mlp_graph(8, 64, 128, out=10), H100)
    assert find_tp_blocks(plan) == ([], [])
    # the intermediate activation is also an output: a split would leave it sharded
    plan = build_plan(mlp_graph(8, 64, 128, leak=True), H100)
    assert find_tp_blocks(plan) == ([], [])
    # the plain MLP fires
    blocks, _ = find_tp_blocks(build_plan(mlp_graph(8, 64, 128), H100))
    assert [(b.column, b.row, b.nodes) for b in blocks] == [(("up",), ("down",),
                                                              ("up", "act", "down"))]


def test_parameter_fqns_from_module():
    lin = torch.nn.Sequential(torch.nn.Linear(2, 2))
    assert parameter_fqns(lin) == {"p_0_weight": "0.weight", "p_0_bias": "0.bias"}


# --- cost ----------------------------------------------------------------------------------

def test_ring_allreduce_formula():
    link = Link("test", 100e9, 5e-6)
    assert ring_allreduce_s(1e9, 1, link) == 0.0
    # 2 (t-1)/t * B / bw + 2 (t-1) * latency
    assert ring_allreduce_s(1e9, 4, link) == pytest.approx(1.5 * 1e9 / 100e9 + 6 * 5e-6,
                                                          rel=1e-12)
    ds = parse_devices("cuda:0=h100,cuda:1=h100,cuda:2=rtx-4090")
    slow = group_link(ds)
    assert slow.bandwidth_bytes_per_s == ds.link("cuda:0", "cuda:2").bandwidth_bytes_per_s
    assert slow.latency_s == max(lk.latency_s for lk in ds.links.values())


def test_split_cost_against_hand_computation():
    m, h, i, t = 256, 1024, 4096, 2
    plan = build_plan(mlp_graph(m, h, i), H100)
    ds = parse_devices(TWO)
    link = ds.link("cuda:0", "cuda:1")
    assert link.name == "nvlink4"
    tp = tensor_parallel(plan, ds)
    f = 4  # fp32 bytes
    up, act, down = (plan.node(n) for n in ("up", "act", "down"))
    # by hand: each device computes N/t of up, 1/t of the Relu, K/t of down
    want = {
        "up": replace(up.analysis, dims={**up.analysis.dims, "N": i // t},
                      flops=2 * m * (i // t) * h, bytes_read=m * h * f + h * (i // t) * f,
                      bytes_written=m * (i // t) * f, param_count=h * i // t),
        "act": replace(act.analysis, dims={"numel": m * i // t}, flops=act.analysis.flops // t,
                       bytes_read=m * i // t * f, bytes_written=m * i // t * f),
        "down": replace(down.analysis, dims={**down.analysis.dims, "K": i // t},
                        flops=2 * m * h * (i // t),
                        bytes_read=m * (i // t) * f + (i // t) * h * f,
                        bytes_written=m * h * f, param_count=i * h // t),
    }
    got = {"up": split_analysis(up, "column", t, h * i * f),
           "act": split_analysis(act, "inner", t, m * i * f),
           "down": split_analysis(down, "row", t, m * i * f + i * h * f)}
    assert got == want
    compute = sum(estimate(a, H100).est_time_s for a in want.values())
    allreduce = 2 * (t - 1) / t * (m * h * f) / link.bandwidth_bytes_per_s \
        + 2 * (t - 1) * link.latency_s
    assert tp.makespan_s == pytest.approx(compute + allreduce, rel=1e-12)
    assert tp.compute_s == pytest.approx(compute, rel=1e-12)
    assert [c.after for c in tp.collectives] == ["down"]
    assert tp.collectives[0].nbytes == m * h * f
    assert tp.collective_s == {"cuda:0": pytest.approx(allreduce, rel=1e-12),
                               "cuda:1": pytest.approx(allreduce, rel=1e-12)}
    (s,) = tp.splits
    assert s.dims == {"column": "N (intermediate)", "row": "K (intermediate)"}
    assert s.compute_s == pytest.approx(compute, rel=1e-12)


def test_degree_one_is_the_single_device_plan(llama):
    plan, _ = llama
    tp = tensor_parallel(plan, "cuda:0=h100")
    assert tp.makespan_s == pytest.approx(sum(n.cost.est_time_s for n in plan.nodes), rel=1e-9)
    assert not tp.collectives


def test_a_compute_bound_mlp_halves():
    plan = build_plan(mlp_graph(8192, 8192, 32768, dtype="bf16"), H100)
    one = tensor_parallel(plan, "cuda:0=h100")
    two = tensor_parallel(plan, TWO)
    assert 0.45 < two.compute_s / one.compute_s < 0.55
    assert two.makespan_s > two.compute_s  # the all-reduce of 128 MiB is paid


# --- memory --------------------------------------------------------------------------------

def test_memory_per_device_and_overflow():
    m, h, i, f = 64, 4096, 16384, 4
    plan = build_plan(mlp_graph(m, h, i), H100)
    tp = tensor_parallel(plan, "cuda:0=h100:320MB,cuda:1=h100:200MB")
    ws = gemm_workspace_bytes(H100)[0]
    params = 2 * h * i * f // 2  # both weights split in two

    def acts(t: int) -> int:
        # live activations in plan order: x + up, then up + act (the peak), then act + down
        return max(m * h * f + m * i // t * f, 2 * m * i // t * f, m * i // t * f + m * h * f)

    need = params + ws + acts(2)
    assert tp.memory_used == {"cuda:0": need, "cuda:1": need}
    assert tp.params["cuda:0"] == params and tp.activations["cuda:1"] == acts(2)
    assert tp.over == {"cuda:1": need - 200 * 10**6}  # cuda:0 (320 MB) fits
    assert not tp.feasible and "cuda:1" in tp.overflow_text() and "cuda:0" not in \
        tp.overflow_text()
    # unsplit, one device would need both weights whole
    assert tensor_parallel(plan, "cuda:0=h100:300MB").over["cuda:0"] == \
        2 * h * i * f + ws + acts(1) - 300 * 10**6


def test_decode_kv_cache_is_split_by_heads():
    import transformers

    from graphopt.frontends.llm_steps import DecodeStep

    cfg = transformers.LlamaConfig(num_hidden_layers=1, hidden_size=64, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=128,
                                   vocab_size=256)
    torch.manual_seed(0)
    step = DecodeStep(transformers.LlamaForCausalLM(cfg).eval()).eval()
    cache = (1, 2, 2, 2048, 16)
    keys, values = torch.zeros(cache), torch.ones(cache)  # two tensors: export would merge one
    plan, _ = plan_of(step, (torch.zeros(2, 1, dtype=torch.long), keys, values))
    blocks, _ = find_tp_blocks(plan, 2)
    attn = next(b for b in blocks if b.kind == "attention")
    assert attn.kv_inputs == ("keys", "values")
    one, two = tensor_parallel(plan, "cuda:0=h100"), tensor_parallel(plan, TWO)
    kv = 2 * math.prod(cache) * 4
    assert one.activations["cuda:0"] - two.activations["cuda:0"] >= kv / 2 * 0.99
    assert can_split(attn, 2) and not can_split(attn, 4)
    assert "KV heads" in can_split(attn, 4).reason


# --- sequence parallelism ------------------------------------------------------------------

def residual_mlps(m: int, h: int, i: int, layers: int = 2):
    """``layers`` times: x = x + MatMul(Relu(MatMul(x, W1)), W2)."""
    g = G()
    x = g.input("x", (m, h))
    for k in range(layers):
        up = g.op("MatMul", [x, g.param(f"w1_{k}", (h, i))], (m, i), name=f"up{k}")
        act = g.op("Relu", [up], (m, i), name=f"act{k}")
        down = g.op("MatMul", [act, g.param(f"w2_{k}", (i, h))], (m, h), name=f"down{k}")
        x = g.op("Add", [x, down], (m, h), name=f"res{k}")
    return g.build([x])


def test_sequence_parallel_against_hand_computation():
    m, h, i, t, f = 256, 1024, 4096, 2, 4
    plan = build_plan(residual_mlps(m, h, i), H100)
    ds = parse_devices(TWO)
    link = ds.link("cuda:0", "cuda:1")
    plain = tensor_parallel(plan, ds)
    sp = tensor_parallel(plan, ds, sequence_parallel=True)
    # the residual adds run on m/t tokens each; every all-reduce becomes a reduce-scatter, and
    # the next reader of the sum (the second up, then the returned output) all-gathers it
    assert [(c.kind, c.after) for c in sp.collectives] == [
        ("reduce-scatter", "down0"), ("all-gather", "res0"),
        ("reduce-scatter", "down1"), ("all-gather", "res1")]
    half = (t - 1) / t * m * h * f / link.bandwidth_bytes_per_s + (t - 1) * link.latency_s
    assert sp.makespan_s - sp.compute_s == pytest.approx(4 * half, rel=1e-12)
    assert [c.kind for c in plain.collectives] == ["all-reduce"] * 2
    assert plain.makespan_s - plain.compute_s == pytest.approx(4 * half, rel=1e-12)  # same
    res = plan.node("res0")
    by_tokens = replace(res.analysis, dims={"numel": m * h // t},
                        flops=res.analysis.flops // t, bytes_read=2 * m * h // t * f,
                        bytes_written=m * h // t * f)
    assert split_analysis(res, "tokens", t, 2 * m * h * f) == by_tokens
    saved = 2 * (res.cost.est_time_s - estimate(by_tokens, H100).est_time_s)
    assert plain.compute_s - sp.compute_s == pytest.approx(saved, rel=1e-9)
    assert sp.notes["sequence_parallel"] == {"enabled": True, "nodes": 2, "reduce_scatters": 2,
                                             "all_gathers": 2}


def test_sequence_parallel_needs_tokens_that_divide():
    plan = build_plan(residual_mlps(3, 64, 128), H100)  # 3 tokens over 2 devices
    sp = tensor_parallel(plan, TWO, sequence_parallel=True)
    assert sp.notes["sequence_parallel"]["nodes"] == 0
    assert [c.kind for c in sp.collectives] == ["all-reduce"] * 2
