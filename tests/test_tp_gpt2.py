"""GPT-2's fused QKV and Conv1D projections split tensor-parallel (:mod:`graphopt.partition.
tp_fused_qkv`): the plan found on GPT-2's graph, 2 gloo processes against the single-process
model (and the pasted snippet too), case 3's permutation, and where it must not fire."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.distributed.tensor import Replicate

import graphopt
from graphopt.errors import GraphoptError
from graphopt.ir.plan_parallel import ParallelizePlan
from graphopt.partition.tp_blocks import find_tp_blocks
from graphopt.partition.tp_emit import (
    apply_tensor_parallel,
    check_degree,
    describe_plan,
    emittable,
    parallelize_plan,
)
from graphopt.partition.tp_fused_qkv import (
    Conv1DColwiseParallel,
    conv1d_specs,
    local_head_attributes,
    qkv_permutation,
)
from graphopt.partition.tp_roles import BlockKind
from graphopt.partition.tp_styles import build_styles
from tests.arch_zoo import Logits
from tests.gloo_run import every_rank_equals, gloo_mesh, needs_gloo, save_rank, spawn

transformers = pytest.importorskip("transformers")

LAYERS, HEADS, HIDDEN = 2, 4, 64
TWO = "cuda:0=h100,cuda:1=h100"


def tiny_gpt2(heads: int = HEADS, hidden: int = HIDDEN) -> Logits:
    """Random GPT-2, the same weights in every process (seeded)."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=LAYERS, n_embd=hidden, n_head=heads,
                                     vocab_size=256, n_positions=64, use_cache=False,
                                     bos_token_id=0, eos_token_id=0)
    return Logits(transformers.GPT2LMHeadModel(config)).eval()


def _ids() -> torch.Tensor:
    return torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(1))


def found_blocks(model: nn.Module, degree: int = 2):
    plan = graphopt.plan(model, (_ids(),), target="h100-sxm")
    return find_tp_blocks(plan, degree, source=model)


@pytest.fixture(scope="module")
def gpt2():
    model = tiny_gpt2()
    blocks, unsplit = found_blocks(model)
    assert unsplit == []
    return model, blocks


def _attn(i: int) -> str:
    return f"lm.transformer.h.{i}.attn"


# --- the plan ------------------------------------------------------------------------------

def test_the_plan_splits_c_attn_c_proj_and_c_fc_with_conv1d_styles(gpt2) -> None:
    model, blocks = gpt2
    assert [str(b.kind) for b in blocks] == ["attention", "mlp"] * LAYERS + ["lm_head"]
    kept, why = emittable(blocks, model)
    assert (len(kept), why) == (len(blocks), [])
    got = {name: type(s).__name__ for name, s in parallelize_plan(blocks, degree=2).items()}
    for i in range(LAYERS):
        p = f"lm.transformer.h.{i}"
        assert got[f"{p}.attn"] == "LocalHeads"  # case 4: split_size, embed_dim, num_heads
        assert got[f"{p}.attn.c_attn"] == "FusedQKVColwiseParallel"
        assert got[f"{p}.attn.c_proj"] == got[f"{p}.mlp.c_proj"] == "Conv1DRowwiseParallel"
        assert got[f"{p}.mlp.c_fc"] == "Conv1DColwiseParallel"
    assert got["lm.lm_head"] == "ColwiseParallel"  # an nn.Linear (tied to wte): plain
    assert len(got) == 5 * LAYERS + 1
    d = describe_plan(blocks, 2, module=model, device_type="cpu")
    assert d["plan"] == got and d["unsplit"] == []
    assert d["head_attributes"] == {_attn(i): {"num_heads": [4, 2]} for i in range(LAYERS)}
    assert "from graphopt.partition.tp_fused_qkv import Conv1DColwiseParallel, " \
        "Conv1DRowwiseParallel, FusedQKVColwiseParallel, LocalHeads" in d["code"]
    assert f"'{_attn(0)}.c_attn': FusedQKVColwiseParallel(heads=4, kv_heads=4)," in d["code"]
    assert f"'{_attn(0)}': LocalHeads(heads=4, kv_heads=4, qkv='c_attn')," in d["code"]


def test_tensor_strategy_plans_gpt2_with_its_conv1d_blocks() -> None:
    """``--strategy tensor``: the cost model splits the blocks (costed as Linear pairs) and the
    report's parallelize_module plan is available, not "runs unsplit"."""
    plan = graphopt.plan(tiny_gpt2(), (_ids(),), target="h100-sxm", devices=TWO,
                         strategy="tensor")
    section = plan.tensor_parallel
    assert [s.kind for s in section.splits] == ["attention", "mlp"] * LAYERS
    emitted = section.parallelize_module
    assert isinstance(emitted, ParallelizePlan) and emitted.unsplit == ()
    assert emitted.plan[f"{_attn(1)}.c_attn"] == "FusedQKVColwiseParallel"


def test_case_3_permutation_gives_each_rank_whole_heads() -> None:
    # 2 heads of width 1: [q0 q1 | k0 k1 | v0 v1] -> rank 0 [q0 k0 v0], rank 1 [q1 k1 v1]
    assert qkv_permutation(2, 2, 6, 2) == [0, 2, 4, 1, 3, 5]
    # GQA, 4 query heads and 2 KV heads of width 1: each rank 2 query heads with their KV head
    assert qkv_permutation(4, 2, 8, 2) == [0, 1, 4, 6, 2, 3, 5, 7]
    assert qkv_permutation(4, 4, 3 * 64, 1) == list(range(192))  # one device: unchanged
    head = build_styles(conv1d_specs(BlockKind.LM_HEAD, ("head",), ()))["head"]
    assert type(head).__name__ == "Conv1DColwiseParallel"  # a Conv1D LM head: logits gathered
    assert head.output_layouts == (Replicate(),)
    # the identity x (W P) + b P = (x W + b) P, on a real c_attn
    c_attn = tiny_gpt2().lm.transformer.h[0].attn.c_attn
    x = torch.randn(3, HIDDEN, generator=torch.Generator().manual_seed(4))
    order = qkv_permutation(HEADS, HEADS, c_attn.nf, 2)
    with torch.no_grad():
        torch.testing.assert_close(torch.addmm(c_attn.bias[order], x, c_attn.weight[:, order]),
                                   c_attn(x)[:, order], rtol=1e-5, atol=1e-6)


# --- where it must not fire ----------------------------------------------------------------

def test_heads_that_do_not_divide_are_refused_with_the_fix(gpt2) -> None:
    model, blocks = gpt2
    with pytest.raises(GraphoptError, match=r"4 heads do not divide over 3 devices") as err:
        describe_plan(blocks, 3, module=model)
    assert "[2, 4]" in str(err.value.fix)
    with pytest.raises(GraphoptError, match="do not both divide over 3 devices") as err:
        qkv_permutation(4, 4, 192, 3)
    assert "unsplit" in str(err.value.fix)
    with pytest.raises(GraphoptError, match="not \\(heads \\+ 2 kv_heads\\) x head_dim"):
        qkv_permutation(4, 4, 190, 2)

    class Mesh:  # refused before any process group or module work
        ndim = 1

        def size(self) -> int:
            return 3

    with pytest.raises(GraphoptError, match="do not divide"):
        apply_tensor_parallel(model, Mesh(), blocks)  # type: ignore[arg-type]
    check_degree(blocks, 2)  # must not fire
    # 3 heads over 2 devices: the attention falls back whole, its MLP still splits
    three = tiny_gpt2(heads=3, hidden=48)
    kept, reasons = found_blocks(three)
    assert [str(b.kind) for b in kept] == ["mlp"] * LAYERS + ["lm_head"]
    assert sum("3 heads do not divide by degree 2" in r for r in reasons) == LAYERS
    assert set(describe_plan(kept, 2, module=three)["plan"].values()) == {
        "Conv1DColwiseParallel", "Conv1DRowwiseParallel", "ColwiseParallel"}


def test_a_k_by_n_block_on_a_module_that_is_not_a_conv1d_is_refused(gpt2) -> None:
    from dataclasses import replace

    model, blocks = gpt2
    wrong = replace(blocks[1], column_modules=("lm.lm_head",))  # an nn.Linear
    kept, why = emittable([blocks[0], wrong], model)
    assert kept == [blocks[0]]
    assert why == ["mlp block mlp@addmm_3 runs unsplit: lm.lm_head is a Linear, not a "
                   "transformers Conv1D (the plan reads its weight as K x N)"]
    with pytest.raises(GraphoptError, match="splits a transformers Conv1D"):
        Conv1DColwiseParallel()._apply(nn.Linear(4, 4), None)  # type: ignore[arg-type]
    attn = model.lm.transformer.h[0].attn
    with pytest.raises(GraphoptError, match="num_heads is 4, not 6"):
        local_head_attributes(attn, 6, 64, 2)  # blocks of another model
    assert local_head_attributes(attn, 4, 64, 2) == {"num_heads": (4, 2),
                                                    "split_size": (64, 32),
                                                    "embed_dim": (64, 32)}


# --- run for real --------------------------------------------------------------------------

def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    from torch.distributed.tensor import DTensor

    blocks = pickle.loads((Path(out_dir) / "blocks.pkl").read_bytes())
    with gloo_mesh(rank, world, port) as mesh:
        model = tiny_gpt2()
        before = {k: v.clone() for k, v in model.state_dict().items()}
        tp = apply_tensor_parallel(model, mesh, blocks)
        with torch.no_grad():
            logits = tp(_ids())
        code = describe_plan(blocks, world, module=model, device_type="cpu")["code"]
        pasted = copy.deepcopy(model)
        exec(code, {"model": pasted})  # the report's snippet, as a user runs it
        with torch.no_grad():
            torch.save(pasted(_ids()), Path(out_dir) / f"pasted_{rank}.pt")

        def local(w: torch.Tensor) -> list[int] | None:
            return list(w.to_local().shape) if isinstance(w, DTensor) else None

        h, mine = tp.lm.transformer.h[1], model.lm.transformer.h[1]
        save_rank(out_dir, rank, logits, {
            "c_attn": local(h.attn.c_attn.weight), "c_proj": local(h.attn.c_proj.weight),
            "c_fc": local(h.mlp.c_fc.weight), "mlp_proj": local(h.mlp.c_proj.weight),
            "copy_heads": [h.attn.num_heads, h.attn.split_size, h.attn.embed_dim],
            "user_heads": [mine.attn.num_heads, mine.attn.split_size, mine.attn.embed_dim],
            "user_model_unchanged": all(type(m).__name__ == "Conv1D" for m in (
                mine.attn.c_attn, mine.mlp.c_fc)) and all(
                type(v) is torch.Tensor and torch.equal(v, before[k])
                for k, v in model.state_dict().items()),
        })


@needs_gloo
def test_two_gloo_processes_equal_the_single_process_model(gpt2, tmp_path: Path) -> None:
    _, blocks = gpt2
    (tmp_path / "blocks.pkl").write_bytes(pickle.dumps(blocks))
    spawn(_worker, 2, tmp_path, "GPT-2 tensor-parallel run")
    with torch.no_grad():
        want = tiny_gpt2()(_ids())
    every_rank_equals(tmp_path, 2, want, {
        "c_attn": [64, 96],  # all 64 inputs, 2 of 4 heads of q, k and v
        "c_proj": [32, 64],  # the rows of those 2 heads, all outputs
        "c_fc": [64, 128], "mlp_proj": [128, 64],  # half of the 256 intermediate
        "copy_heads": [2, 32, 32], "user_heads": [4, 64, 64],
        "user_model_unchanged": True})
    for rank in range(2):
        torch.testing.assert_close(torch.load(tmp_path / f"pasted_{rank}.pt", weights_only=True),
                                   want, rtol=1e-5, atol=1e-5)
