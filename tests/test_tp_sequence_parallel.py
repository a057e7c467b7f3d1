"""Sequence parallelism run for real: 2 gloo processes on CPU against the single-process model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from graphopt.errors import GraphoptError
from graphopt.partition.tp_emit import (
    apply_tensor_parallel,
    describe_plan,
    parallelize_plan,
    sequence_parallel_support,
)
from tests.gloo_run import (
    every_rank_equals,
    gloo_mesh,
    needs_gloo,
    save_rank,
    spawn,
    state_unchanged,
)
from tests.test_tp_run import (
    LAYERS,
    Block,
    llama_blocks,
    tiny_llama,
)

transformers = pytest.importorskip("transformers")


def _input_ids() -> torch.Tensor:
    return torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(4))


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:

    with gloo_mesh(rank, world, port) as mesh:
        model = tiny_llama()
        before = {k: v.clone() for k, v in model.state_dict().items()}
        sp = apply_tensor_parallel(model, mesh, llama_blocks(), sequence_parallel=True)
        seen: dict[str, list[int]] = {}

        def local_shape(_m: nn.Module, _i: tuple[object, ...], out: torch.Tensor) -> None:
            seen["norm_out_local"] = list(out.to_local().shape)  # type: ignore[attr-defined]

        sp.model.layers[1].post_attention_layernorm.register_forward_hook(local_shape)
        with torch.no_grad():
            logits = sp(_input_ids()).logits
            try:  # 7 tokens over 2 ranks: refused on each rank before any collective
                sp(_input_ids()[:, :7])
            except GraphoptError as e:
                seen["odd_tokens"] = [int("7 tokens" in e.problem)]
        seen["user_model_unchanged"] = state_unchanged(model, before)  # type: ignore[assignment]
        save_rank(out_dir, rank, logits, seen)


@needs_gloo
def test_two_gloo_processes_with_sequence_parallelism_equal_the_model(tmp_path: Path) -> None:
    spawn(_worker, 2, tmp_path, "sequence-parallel run")
    with torch.no_grad():
        want = tiny_llama()(_input_ids()).logits
    # the norm ran on 4 of the 8 tokens; the user's model kept its plain tensors
    every_rank_equals(tmp_path, 2, want, {"norm_out_local": [2, 4, 64],
                                          "user_model_unchanged": True, "odd_tokens": [1]})


def test_sequence_parallel_plan_is_torchtitans_layout() -> None:
    model = tiny_llama()
    plan = parallelize_plan(llama_blocks(), degree=2, sequence_parallel=True, module=model)
    got = {name: repr(style) for name, style in plan.items()}
    assert len(got) == 7 * LAYERS + 4 * LAYERS + 3  # + 2 norms, attn, mlp; layer 0, norm, head
    assert "Shard(dim=1)" in got["model.layers.0"] and "use_local_output=True" in got[
        "model.layers.0"]
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        assert type(plan[f"{p}.input_layernorm"]).__name__ == "SequenceParallel"
        assert type(plan[f"{p}.post_attention_layernorm"]).__name__ == "SequenceParallel"
        assert "hidden_states" in got[f"{p}.self_attn"]  # attention takes it by keyword
        assert type(plan[f"{p}.mlp"]).__name__ == "PrepareModuleInput"
        assert "Shard(dim=1)" in got[f"{p}.mlp.down_proj"]  # reduce-scatter, not all-reduce
        assert type(plan[f"{p}.mlp.gate_proj"]).__name__ == "ColwiseParallel"
    assert type(plan["model.norm"]).__name__ == "SequenceParallel"
    assert "Replicate()" in got["lm_head"]
    assert "model.embed_tokens" not in plan  # replicated: rotary and mask see every token
    d = describe_plan(llama_blocks(), 2, module=model, sequence_parallel=True)
    json.dumps(d)
    assert d["sequence_parallel"] is True and d["plan"]["model.norm"] == "SequenceParallel"
    assert "from torch.distributed.tensor import Replicate, Shard" in d["code"]
    assert ("'model.layers.0.mlp.down_proj': RowwiseParallel(output_layouts=Shard(dim=1)),"
            in d["code"])


def test_support_says_why_not() -> None:
    model = tiny_llama()
    assert sequence_parallel_support(llama_blocks(), model)[0] is True
    assert sequence_parallel_support(llama_blocks(), None) == (
        False, "no torch module given (the plan alone does not name the norms)")
    ok, why = sequence_parallel_support(llama_blocks()[:3], model)
    assert not ok and "2 attention and 1 MLP blocks" in why
    fused = Block("attention", ("x.c_attn",), ("x.c_proj",), 4, 4, "Q, K and V are one GEMM")
    ok, why = sequence_parallel_support([*llama_blocks(), fused], model)
    assert not ok and "one GEMM" in why

    class Bare(nn.Module):  # same layers, no LM head
        def __init__(self) -> None:
            super().__init__()
            self.model = tiny_llama().model

    ok, why = sequence_parallel_support(
        [Block(b.kind, tuple(n.removeprefix("model.") for n in b.column_modules),
               tuple(n.removeprefix("model.") for n in b.row_modules), b.heads, b.kv_heads)
         for b in llama_blocks()], Bare().model)
    assert not ok and "LM head" in why
    with pytest.raises(GraphoptError, match="needs the model"):
        parallelize_plan(llama_blocks(), sequence_parallel=True)


def _wide_llama() -> nn.Module:
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=256, num_attention_heads=4, num_key_value_heads=2, intermediate_size=512,
        num_hidden_layers=2, vocab_size=256, max_position_embeddings=2048,
        use_cache=False)).eval()


TWO = "cuda:0=h100-sxm,cuda:1=h100-sxm"


def test_tensor_strategy_takes_sequence_parallelism_when_it_is_faster() -> None:
    import graphopt

    ids = torch.randint(0, 256, (1, 1024), generator=torch.Generator().manual_seed(5))
    plan = graphopt.plan(_wide_llama(), (ids,), target="h100-sxm", devices=TWO,
                         strategy="tensor")
    st, tp = plan.strategy, plan.tensor_parallel
    assert st.sequence_parallel is True
    assert "with sequence parallelism:" in st.candidates[0].detail
    assert tp.notes.sequence_parallel.enabled is True
    emitted = tp.parallelize_module
    assert emitted.sequence_parallel is True
    assert emitted.plan["model.layers.0.input_layernorm"] == "SequenceParallel"
    assert "RowwiseParallel(output_layouts=Shard(dim=1))" in emitted.code


def test_tensor_strategy_stays_plain_when_not_faster_or_not_emittable() -> None:
    import graphopt
    from graphopt.api.planning import with_partition
    from graphopt.decisions.planner import build_plan
    from graphopt.frontends import load_graph
    from graphopt.hardware.registry import get_target

    model = tiny_llama()
    plan = graphopt.plan(model, (_input_ids(),), target="h100-sxm", devices=TWO,
                         strategy="tensor")
    st = plan.strategy
    assert st.sequence_parallel is False and "plain:" in st.candidates[0].detail
    assert plan.tensor_parallel.parallelize_module.sequence_parallel is False
    graph = load_graph(model, (_input_ids(),))
    alone = with_partition(build_plan(graph, get_target("h100-sxm")), TWO, "tensor",
                           source=graph)  # the traced graph alone names no norms
    assert "no sequence parallelism: no torch module given" in \
        alone.strategy.candidates[0].detail
