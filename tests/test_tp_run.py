"""Tensor parallelism run for real: 2 gloo processes on CPU against the single-process model."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import nn

from graphopt.errors import GraphoptError
from graphopt.partition.tp_emit import (
    apply_tensor_parallel,
    check_degree,
    describe_plan,
    emittable,
    head_attributes,
    parallelize_plan,
    two_d_support,
)
from tests.gloo_run import (
    every_rank_equals,
    gloo_mesh,
    needs_gloo,
    save_rank,
    spawn,
    state_unchanged,
)

transformers = pytest.importorskip("transformers")


@dataclass(frozen=True)
class Block:
    """Stands in for graphopt.partition.tp_blocks.TPBlock (same fields the emitter reads)."""

    kind: str
    column_modules: tuple[str, ...]
    row_modules: tuple[str, ...]
    heads: int | None = None
    kv_heads: int | None = None
    note: str = ""


HEADS, KV_HEADS, LAYERS = 4, 2, 2


def tiny_llama() -> nn.Module:
    """Random Llama-style model, the same weights in every process (seeded)."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=64, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
        intermediate_size=128, num_hidden_layers=LAYERS, vocab_size=256,
        max_position_embeddings=64, use_cache=False)
    return transformers.LlamaForCausalLM(config).eval()


#: the vocabulary-parallel LM head (256 logits, 128 per rank)
HEAD = Block("lm_head", ("lm_head",), ())


def llama_blocks(heads: int = HEADS, kv_heads: int = KV_HEADS, head: bool = False
                 ) -> list[Block]:
    blocks = []
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        blocks.append(Block("attention", (f"{p}.self_attn.q_proj", f"{p}.self_attn.k_proj",
                                          f"{p}.self_attn.v_proj"),
                            (f"{p}.self_attn.o_proj",), heads, kv_heads))
        blocks.append(Block("mlp", (f"{p}.mlp.gate_proj", f"{p}.mlp.up_proj"),
                            (f"{p}.mlp.down_proj",)))
    return [*blocks, HEAD] if head else blocks


def _input_ids() -> torch.Tensor:
    return torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(1))


class OldStyleAttention(nn.Module):
    """Head counts as attributes used in forward, as transformers < 4.48 Llama kept them."""

    def __init__(self) -> None:
        super().__init__()
        self.num_heads, self.num_key_value_heads, self.head_dim = 4, 2, 16
        self.num_key_value_groups, self.hidden_size = 2, 64
        self.q_proj, self.o_proj = nn.Linear(64, 64), nn.Linear(64, 64)
        self.k_proj, self.v_proj = nn.Linear(64, 32), nn.Linear(64, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.num_heads, self.head_dim).transpose(1, 2)
        k, v = (p(x).view(b, s, self.num_key_value_heads, self.head_dim).transpose(1, 2)
                .repeat_interleave(self.num_key_value_groups, dim=1)
                for p in (self.k_proj, self.v_proj))
        out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, self.hidden_size))


class OldStyleModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.attn = OldStyleAttention()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.attn(x)


OLD_BLOCK = Block("attention", ("attn.q_proj", "attn.k_proj", "attn.v_proj"), ("attn.o_proj",),
                  4, 2)


def _hidden() -> torch.Tensor:
    return torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(3))


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    from torch.distributed.tensor import DTensor

    with gloo_mesh(rank, world, port) as mesh:
        model = tiny_llama()
        before = {k: v.clone() for k, v in model.state_dict().items()}
        tp = apply_tensor_parallel(model, mesh, llama_blocks(head=True))
        with torch.no_grad():
            logits = tp(_input_ids()).logits
        q = tp.model.layers[0].self_attn.q_proj.weight
        down = tp.model.layers[1].mlp.down_proj.weight
        head = tp.lm_head.weight
        facts = {
            "q_local": list(q.to_local().shape) if isinstance(q, DTensor) else None,
            "down_local": list(down.to_local().shape) if isinstance(down, DTensor) else None,
            "head_local": list(head.to_local().shape) if isinstance(head, DTensor) else None,
            "user_model_unchanged": state_unchanged(model, before),
        }
        old = OldStyleModel()
        old_tp = apply_tensor_parallel(old, mesh, [OLD_BLOCK])  # divides num_heads & co.
        with torch.no_grad():
            torch.save(old_tp(_hidden()), Path(out_dir) / f"old_{rank}.pt")
        facts["old_heads"] = [old_tp.attn.num_heads, old.attn.num_heads]
        save_rank(out_dir, rank, logits, facts)


@needs_gloo
def test_two_gloo_processes_equal_the_single_process_model(tmp_path: Path) -> None:
    spawn(_worker, 2, tmp_path, "tensor-parallel run")
    with torch.no_grad():
        want = tiny_llama()(_input_ids()).logits
        old_want = OldStyleModel()(_hidden())
    every_rank_equals(tmp_path, 2, want, {
        "q_local": [32, 64],  # 2 of 4 heads x head_dim 16, all 64 inputs
        "down_local": [64, 64],  # all outputs, 64 of 128 intermediate
        "head_local": [128, 64],  # 128 of the 256 logits, gathered after
        "user_model_unchanged": True,
        "old_heads": [2, 4]})  # the copy holds 2 local heads, the user's 4
    for rank in range(2):
        torch.testing.assert_close(torch.load(tmp_path / f"old_{rank}.pt", weights_only=True),
                                   old_want, rtol=1e-5, atol=1e-5)


def test_plan_maps_every_projection_to_its_split() -> None:
    plan = parallelize_plan(llama_blocks(), degree=2)
    got = {name: type(style).__name__ for name, style in plan.items()}
    assert len(got) == 7 * LAYERS
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        assert {got[f"{p}.self_attn.{m}"] for m in ("q_proj", "k_proj", "v_proj")} \
            == {"ColwiseParallel"}
        assert got[f"{p}.self_attn.o_proj"] == got[f"{p}.mlp.down_proj"] == "RowwiseParallel"
        assert got[f"{p}.mlp.gate_proj"] == got[f"{p}.mlp.up_proj"] == "ColwiseParallel"
    d = describe_plan(llama_blocks(), 2, module=tiny_llama())
    json.dumps(d)
    assert d["plan"] == got and d["mesh_shape"] == [2] and d["degree"] == 2
    assert d["head_attributes"] == {}  # transformers 5 infers local heads: view(..., -1, hd)
    attn = d["blocks"][0]
    assert (attn["module"], attn["local_heads"], attn["local_kv_heads"]) \
        == ("model.layers.0.self_attn", 2, 1)
    assert "parallelize_module(model, mesh, {" in d["code"]
    assert "'model.layers.1.mlp.down_proj': RowwiseParallel()," in d["code"]
    assert two_d_support()["emitted"] is True  # by two_d_emit, for Llama-layout decoders


def test_heads_that_do_not_divide_are_refused_with_the_fix() -> None:
    with pytest.raises(GraphoptError, match=r"4 heads do not divide over 3 devices") as err:
        describe_plan(llama_blocks(), 3)
    assert "[2, 4]" in str(err.value.fix) and "unsplit" in str(err.value.fix)
    with pytest.raises(GraphoptError, match=r"2 KV heads .* do not divide over 4 devices"):
        parallelize_plan(llama_blocks(heads=8, kv_heads=2), degree=4)

    class Mesh:  # refused before any process group or module work
        ndim = 1

        def size(self) -> int:
            return 3

    model = tiny_llama()
    with pytest.raises(GraphoptError, match="do not divide"):
        apply_tensor_parallel(model, Mesh(), llama_blocks())  # type: ignore[arg-type]
    check_degree(llama_blocks(), 2)  # must not fire: 4 heads and 2 KV heads over 2
    check_degree(llama_blocks(heads=8, kv_heads=2), 2)


def test_head_attributes_divided_by_name_and_value_only() -> None:
    got = head_attributes(OldStyleModel(), [OLD_BLOCK], 2)
    # num_key_value_groups == kv_heads == 2 here, but the group ratio is the same locally
    assert got == {"attn": {"num_heads": (4, 2), "num_key_value_heads": (2, 1),
                            "hidden_size": (64, 32)}}
    assert head_attributes(tiny_llama(), llama_blocks(), 2) == {}


def test_non_linear_modules_are_refused() -> None:
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_embd=64, n_head=4, n_layer=1, vocab_size=256, n_positions=32))
    block = Block("attention", ("transformer.h.0.attn.c_attn",),
                  ("transformer.h.0.attn.c_proj",), 4, 4)
    with pytest.raises(GraphoptError, match="not nn.Linear"):
        describe_plan([block], 2, module=gpt2)
    with pytest.raises(GraphoptError, match="is not in"):
        describe_plan([Block("mlp", ("nope.up",), ("nope.down",))], 2, module=gpt2)


def test_blocks_found_on_the_plan_when_tp_blocks_exists() -> None:
    """find_tp_blocks on the tiny Llama's plan gives the modules this test splits by hand."""
    tp_blocks = pytest.importorskip("graphopt.partition.tp_blocks")
    import graphopt

    model = tiny_llama()
    plan = graphopt.plan(model, (_input_ids(),), target="h100-sxm")
    found, unsplit = tp_blocks.find_tp_blocks(plan, 2, source=model)
    kept, why = emittable(found, model)
    assert (unsplit, why) == ([], [])
    want = llama_blocks(head=True)
    assert parallelize_plan(kept, degree=2).keys() == parallelize_plan(want).keys()
    assert describe_plan(found, 2) == describe_plan(want, 2)  # heads, GQA, the LM head too


def test_blocks_an_emitter_cannot_split_are_reported_not_split() -> None:
    fused = Block("attention", ("h.0.attn.c_attn",), ("h.0.attn.c_proj",), 4, 4,
                  "Q, K and V are one fused GEMM")
    no_paths = Block("mlp", (), ())
    kept, why = emittable([*llama_blocks(), fused, no_paths])
    assert kept == llama_blocks()
    assert why == ["attention block h.0.attn.c_attn runs unsplit: Q, K and V are one fused GEMM",
                   "mlp block ? runs unsplit: no torch module paths (find_tp_blocks fills "
                   "them when given the model as source=)"]
    d = describe_plan([*llama_blocks(), fused, no_paths], 2)
    assert d["unsplit"] == why and len(d["plan"]) == 7 * LAYERS
    with pytest.raises(GraphoptError, match="no block can be split.*fused GEMM"):
        describe_plan([fused], 2)
    with pytest.raises(GraphoptError, match="fused GEMM") as err:
        parallelize_plan([fused])
    assert "emittable" in str(err.value.fix)


def test_two_d_statement_holds_for_graphopts_pipeline_stages() -> None:
    """two_d_support says graphopt's fx pipeline stages leave no nn.Linear for
    parallelize_module (why the 2-D plan is emitted from module-level stages instead)."""
    from graphopt.partition.emit import export_graph_module
    from graphopt.partition.pipeline_stages import build_pipeline_stages

    model, ids = tiny_llama(), _input_ids()
    names = [n.name for n in export_graph_module(model, (ids,)).graph.nodes
             if n.op == "call_function"]
    stages = build_pipeline_stages(model, (ids,), [names[:len(names) // 2],
                                                   names[len(names) // 2:]], 1)
    assert not [m for i in range(2) for m in stages.module(i).modules()
                if isinstance(m, nn.Linear)]
    assert any(isinstance(m, nn.Linear) for m in model.modules())
    assert two_d_support()["torch_allows"] is True
