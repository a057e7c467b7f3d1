"""The vocabulary-parallel LM head: recognized from the plan (and where it must not be), costed
as a column split plus the all-gather of its logits against a hand computation, kept whole
when the gather costs more than the split saves, emitted as ColwiseParallel with the logits
gathered, and run for real beside sequence parallelism on 2 gloo processes."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from graphopt.cost import estimate
from graphopt.decisions.planner import build_plan
from graphopt.hardware import get_target
from graphopt.partition import parse_devices
from graphopt.partition.collectives import ring_half_s
from graphopt.partition.tensor_parallel import split_analysis, tensor_parallel
from graphopt.partition.tp_blocks import find_tp_blocks
from graphopt.partition.tp_emit import (
    apply_tensor_parallel,
    describe_plan,
    emittable,
    parallelize_plan,
    plan_snippet,
)
from tests.gloo_run import every_rank_equals, gloo_mesh, needs_gloo, save_rank, spawn
from tests.irbuild import G
from tests.test_tp_run import LAYERS, Block, llama_blocks, tiny_llama

H100 = get_target("h100")
TWO = "cuda:0=h100,cuda:1=h100"


def head_graph(m: int, h: int, vocab: int, *, cast: bool = False, dtype: str = "fp32"):
    """x (m, h) -> Mul (a norm's scale) -> MatMul W (h, vocab) [-> Cast] -> output."""
    g = G()
    x = g.input("x", (m, h), dtype)
    normed = g.op("Mul", [x, g.param("scale", (h,), dtype)], (m, h), dtype, name="normed")
    logits = g.op("MatMul", [normed, g.param("w", (h, vocab), dtype)], (m, vocab), dtype,
                  name="head")
    if cast:
        logits = g.op("Cast", [logits], (m, vocab), "fp32", name="cast", to=1)
    return g.build([logits])


# --- recognition ---------------------------------------------------------------------------

def test_the_widening_gemm_before_the_output_is_the_lm_head():
    plan = build_plan(head_graph(8, 64, 512, cast=True), H100)
    (b,), why = find_tp_blocks(plan, 2)
    assert why == [] and (b.kind, b.column, b.row, b.hidden, b.inner) == (
        "lm_head", ("head",), (), 64, 512)
    assert b.name == "lm_head@head" and "Conv1D" in b.note  # a K x N MatMul: not nn.Linear


def test_must_not_fire_on_a_classifier_or_a_gemm_off_the_output():
    classifier = build_plan(head_graph(8, 64, 10), H100)  # narrows: 64 -> 10 classes
    assert find_tp_blocks(classifier) == ([], [])
    g = G()  # the widening GEMM feeds a reduction, not the output
    x = g.input("x", (8, 64))
    wide = g.op("MatMul", [x, g.param("w", (64, 512))], (8, 512), name="wide")
    total = g.op("ReduceSum", [wide], (8, 1), name="total", axes=[1], keepdims=1)
    assert find_tp_blocks(build_plan(g.build([total]), H100)) == ([], [])


def test_a_vocabulary_that_does_not_divide_falls_back():
    plan = build_plan(head_graph(8, 64, 255), H100)
    blocks, why = find_tp_blocks(plan, 2)
    assert blocks == [] and why == ["lm_head block lm_head@head runs unsplit: vocabulary 255 "
                                    "does not divide by degree 2"]


def test_llama_lm_head_module_path():
    import graphopt

    model = tiny_llama()
    plan = graphopt.plan(model, (torch.randint(0, 256, (2, 8)),), target="h100-sxm")
    blocks, why = find_tp_blocks(plan, 2, source=model)
    assert why == [] and [b.kind for b in blocks] == ["attention", "mlp"] * LAYERS + ["lm_head"]
    assert blocks[-1].column_modules == ("lm_head",) and blocks[-1].inner == 256


# --- cost ----------------------------------------------------------------------------------

def test_split_and_gather_against_hand_computation():
    m, h, vocab, t, f = 8, 4096, 128000, 2, 4  # decode-sized: the weight read dominates
    plan = build_plan(head_graph(m, h, vocab), H100)
    ds = parse_devices(TWO)
    link = ds.link("cuda:0", "cuda:1")
    tp = tensor_parallel(plan, ds)
    head, normed = plan.node("head"), plan.node("normed")
    # by hand: N/t of the GEMM (its weight half), then the whole logits all-gathered
    want = replace(head.analysis, dims={**head.analysis.dims, "N": vocab // t},
                   flops=2 * m * h * vocab // t, bytes_read=m * h * f + h * vocab // t * f,
                   bytes_written=m * vocab // t * f, param_count=h * vocab // t)
    assert split_analysis(head, "column", t, h * vocab * f) == want
    gather = (t - 1) / t * (m * vocab * f) / link.bandwidth_bytes_per_s + (t - 1) * link.latency_s
    assert gather == pytest.approx(ring_half_s(m * vocab * f, t, link), rel=1e-12)
    split = estimate(want, H100).est_time_s
    assert tp.makespan_s == pytest.approx(normed.cost.est_time_s + split + gather, rel=1e-9)
    assert [(c.kind, c.after, c.nbytes) for c in tp.collectives] == [
        ("all-gather", "head", m * vocab * f)]
    (s,) = tp.splits
    assert (s.kind, s.collective, s.allreduce_bytes) == ("lm_head", "all-gather", m * vocab * f)
    assert s.allreduce_s == pytest.approx(gather, rel=1e-12)
    assert s.to_row().collective == "all-gather"
    assert tp.fallbacks == ()
    # memory: half the weight per device; the gathered logits are whole
    assert tp.params["cuda:0"] == h * f + h * vocab * f // t
    reasons = {x.node: x.reason for x in tp.schedule if x.device == "cuda:0"}
    assert reasons["head"].endswith("then all-gather") and "replicated" in reasons["normed"]


def test_kept_whole_when_the_gather_costs_more_than_the_split_saves():
    m, h, vocab = 4096, 64, 512  # a tiny GEMM with large logits: the gather dominates
    plan = build_plan(head_graph(m, h, vocab), H100)
    tp = tensor_parallel(plan, parse_devices(TWO))
    assert tp.splits == () and tp.collectives == ()
    (why,) = tp.fallbacks
    assert why.startswith("lm_head block lm_head@head runs unsplit: splitting its vocabulary "
                          "saves") and "less than the all-gather of its logits" in why
    assert tp.makespan_s == pytest.approx(sum(n.cost.est_time_s for n in plan.nodes),
                                          rel=1e-9)


def test_the_emitted_plan_follows_the_cost_models_choice():
    import graphopt

    ids = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(2))
    plan = graphopt.plan(tiny_llama(), (ids,), target="h100", devices=TWO, strategy="tensor")
    tp = plan.tensor_parallel
    # 16 tokens x 256 logits: the split saves nothing a launch does not cost anyway
    assert [s.kind for s in tp.splits] == ["attention", "mlp"] * LAYERS
    assert len(tp.fallbacks) == 1 and "less than the all-gather" in tp.fallbacks[0]
    assert "lm_head" not in tp.parallelize_module.plan
    assert "lm_head" not in tp.parallelize_module.code


# --- emitter -------------------------------------------------------------------------------

def test_plain_plan_gathers_the_logits():
    plan = parallelize_plan(llama_blocks(head=True), degree=2)
    assert repr(plan["lm_head"]).startswith("ColwiseParallel(") and "Replicate()" in repr(
        plan["lm_head"])
    code = plan_snippet(llama_blocks(head=True), 2)
    assert "from torch.distributed.tensor import Replicate\n" in code
    assert "'lm_head': ColwiseParallel(output_layouts=Replicate())," in code
    d = describe_plan(llama_blocks(head=True), 2)
    assert d["blocks"][-1] == {"kind": "lm_head", "column": ["lm_head"], "row": [],
                               "gather": "all-gather of the logits: 1/2 of the vocabulary "
                                         "per device"}
    # without the head block the plain plan leaves it whole and imports no layout
    assert "lm_head" not in parallelize_plan(llama_blocks())
    assert "torch.distributed.tensor import" not in plan_snippet(llama_blocks(), 2)


def test_a_head_that_is_not_a_linear_is_reported_not_split():
    model = tiny_llama()
    wrong = Block("lm_head", ("model.embed_tokens",), ())
    kept, why = emittable([*llama_blocks(), wrong], model)
    assert kept == llama_blocks()
    assert why == ["lm_head block model.embed_tokens runs unsplit: model.embed_tokens is a "
                   "Embedding, not nn.Linear"]
    assert describe_plan([*llama_blocks(), wrong], 2, module=model)["unsplit"] == why


def test_sequence_parallel_plan_splits_the_head_only_with_its_block():
    model = tiny_llama()
    with_head = parallelize_plan(llama_blocks(head=True), degree=2, sequence_parallel=True,
                                 module=model)
    without = parallelize_plan(llama_blocks(), degree=2, sequence_parallel=True, module=model)
    assert type(with_head["lm_head"]).__name__ == "ColwiseParallel"
    assert "Shard(dim=1)" in repr(with_head["lm_head"])  # tokens gathered first
    assert type(without["lm_head"]).__name__ == "PrepareModuleInput"


def _ids() -> torch.Tensor:
    return torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(7))


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    from torch.distributed.tensor import DTensor

    with gloo_mesh(rank, world, port) as mesh:
        sp = apply_tensor_parallel(tiny_llama(), mesh, llama_blocks(head=True),
                                   sequence_parallel=True)
        with torch.no_grad():
            logits = sp(_ids()).logits
        w = sp.lm_head.weight
        save_rank(out_dir, rank, logits, {
            "head_local": list(w.to_local().shape) if isinstance(w, DTensor) else None})


@needs_gloo
def test_sequence_parallel_with_the_vocabulary_split_equals_the_model(tmp_path: Path):
    spawn(_worker, 2, tmp_path, "sequence-parallel run with the LM head split")
    with torch.no_grad():
        want = tiny_llama()(_ids()).logits
    every_rank_equals(tmp_path, 2, want, {"head_local": [128, 64]})


def _tied_llama() -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
        num_hidden_layers=1, vocab_size=256, max_position_embeddings=64, use_cache=False,
        tie_word_embeddings=True)).eval()


def _tied_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    import graphopt

    model = _tied_llama()
    blocks, _ = find_tp_blocks(graphopt.plan(model, (_ids(),), target="h100"), world,
                               source=model)
    with gloo_mesh(rank, world, port) as mesh:
        tp = apply_tensor_parallel(model, mesh, blocks)
        with torch.no_grad():
            logits = tp(_ids()).logits
        save_rank(out_dir, rank, logits, {
            "kinds": [b.kind for b in blocks],
            "head": [list(b.column_modules) for b in blocks if b.kind == "lm_head"],
            "user_still_tied": model.lm_head.weight is model.model.embed_tokens.weight})


@needs_gloo
def test_a_head_tied_to_the_embedding_splits_from_the_plans_blocks(tmp_path: Path):
    """Blocks found on the plan, applied as found: the tied head is named by its Linear."""
    spawn(_tied_worker, 2, tmp_path, "tensor-parallel run with a tied LM head")
    with torch.no_grad():
        want = _tied_llama()(_ids()).logits
    every_rank_equals(tmp_path, 2, want, {"kinds": ["attention", "mlp", "lm_head"],
                                          "head": [["lm_head"]], "user_still_tied": True})
