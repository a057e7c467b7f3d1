"""The 2-D plan emitted and run (issue 23, items 1, 2 and 5): pipeline stages on a Llama-layout
decoder's module boundaries, tensor parallel inside each stage, on 4 gloo processes (pp=2, tp=2)
against the single-process model; the moved and uneven cuts; the models it refuses; ``auto``
picking only what it can emit; the report's 2-D panel."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch
from torch import nn

from graphopt.errors import GraphoptError
from graphopt.ir.plan_parallel import ParallelizeUnavailable
from graphopt.ir.plan_partition import Strategy, StrategyChoice
from graphopt.partition import parse_devices
from graphopt.partition.two_d import cost_split, two_d
from graphopt.partition.two_d_emit import (
    apply_two_d,
    decoder_of,
    decoder_stage,
    module_boundaries,
    on_module_boundaries,
)
from tests.arch_zoo import Logits
from tests.gloo_run import init_gloo, needs_gloo, spawn, state_unchanged
from tests.report_plans import typed

transformers = pytest.importorskip("transformers")

NODES = "cuda:0=h100@a,cuda:1=h100@a,cuda:2=h100@b,cuda:3=h100@b,net=400Gb/s"
LAYERS = 3  # over 2 stages: an uneven split


def tiny(kind: str = "Llama", layers: int = LAYERS, **extra: object) -> nn.Module:
    """A random causal LM of ``kind``, the same weights in every process (seeded)."""
    torch.manual_seed(0)
    config = getattr(transformers, f"{kind}Config")(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
        num_hidden_layers=layers, vocab_size=256, max_position_embeddings=64, use_cache=False,
        **extra)
    return getattr(transformers, f"{kind}ForCausalLM")(config).eval()


def _ids() -> torch.Tensor:
    return torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(1))


def _planned(model: nn.Module, sequence_parallel: bool = False, layers: int = LAYERS):
    import graphopt

    plan = graphopt.plan(model, (_ids(),), target="h100-sxm")
    res = two_d(plan, parse_devices(NODES), source=model, sequence_parallel=sequence_parallel)
    return plan, res


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    splits = pickle.loads((Path(out_dir) / "splits.pkl").read_bytes())
    init_gloo(rank, world, port)
    try:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "tp"))
        model = tiny()
        before = {k: v.clone() for k, v in model.state_dict().items()}
        outs, facts = {}, {}
        for name in ("plain", "sp"):
            run = apply_two_d(model, splits[name], mesh)
            outs[name] = run.run(_ids())
            q = next(iter(run.module.layers.values())).self_attn.q_proj.weight
            facts[name] = {"layers": sorted(int(i) for i in run.module.layers),
                           "q_local": list(q.to_local().shape) if isinstance(q, DTensor)
                           else None, "micro_batches": run.micro_batches}
        outs["1f1b"] = apply_two_d(model, splits["plain"], mesh, schedule="1F1B").run(_ids())
        scope = {"model": model, "input_ids": _ids()}
        exec(splits["sp"].layout.code, scope)  # the report's code, as a user runs it
        outs["snippet"] = scope["out"]
        facts["user_model_unchanged"] = state_unchanged(model, before)
        torch.save(outs, Path(out_dir) / f"out_{rank}.pt")
        (Path(out_dir) / f"facts_{rank}.json").write_text(json.dumps(facts))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@needs_gloo
def test_two_d_on_four_gloo_processes_equals_the_model(tmp_path: Path) -> None:
    model = tiny()
    splits = {}
    for name, sp in (("plain", False), ("sp", True)):
        plan, res = _planned(model, sp)
        splits[name] = on_module_boundaries(res, plan, model, device_type="cpu")
    (tmp_path / "splits.pkl").write_bytes(pickle.dumps(splits))
    spawn(_worker, 4, tmp_path, "2-D run", timeout_s=180)
    with torch.no_grad():
        want = model(_ids()).logits
    for rank in range(4):
        outs = torch.load(tmp_path / f"out_{rank}.pt", weights_only=True)
        facts = json.loads((tmp_path / f"facts_{rank}.json").read_text())
        last = rank >= 2  # ranks 0, 1: stage 1 (pp 0); ranks 2, 3: stage 2
        for name, got in outs.items():
            if last:
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=name)
            else:
                assert got is None, name
        for name in ("plain", "sp"):
            spans = splits[name].notes["stage_layers"][rank // 2]
            assert facts[name] == {"layers": list(range(*spans)), "q_local": [32, 64],
                                   "micro_batches": 2}
        assert facts["user_model_unchanged"] is True
    for name in ("plain", "sp"):  # 3 layers over 2 stages, said so
        assert splits[name].notes["uneven"] == "3 decoder layers over 2 stages: " + ", ".join(
            str(b - a) for a, b in splits[name].notes["stage_layers"])


# --- stage modules and boundaries (one process) ----------------------------------------------

@pytest.mark.parametrize(("kind", "extra"), [
    ("Llama", {}),
    ("Mistral", {"sliding_window": 4}),  # 8 tokens: the window masks
    ("Qwen2", {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1}),
])
def test_stage_modules_chained_equal_the_model(kind: str, extra: dict[str, object]) -> None:
    """The stage modules recompute position ids, rotary tables and each layer's mask (case 5)."""
    model = tiny(kind, **extra)
    if kind == "Qwen2":  # a full and a sliding-window layer in the same stage
        assert set(model.config.layer_types) == {"full_attention", "sliding_attention"}
    for m, wrap in ((model, False), (Logits(model), True)):
        x = _ids()
        for spans in ([(0, 1), (1, 3)], [(0, 0), (0, 3)], [(0, 3), (3, 3)]):
            h = x
            for i, span in enumerate(spans):
                h = decoder_stage(m, embed=i == 0, layers=span, head=i == len(spans) - 1)(h)
            with torch.no_grad():
                torch.testing.assert_close(h, m(x) if wrap else m(x).logits, rtol=1e-5,
                                           atol=1e-5)
    dec = decoder_of(Logits(model))
    assert (dec.fqn, dec.lm_head) == ("lm.model", "lm.lm_head")


@pytest.mark.parametrize("tied", [False, True])
def test_boundaries_fall_after_the_residual_add(tied: bool) -> None:
    """A tied LM head reads the embedding's weight: it still belongs to the last stage."""
    model = tiny(layers=4, tie_word_embeddings=tied)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) is tied
    plan, res = _planned(model, layers=4)
    spots = module_boundaries(plan, model, res.devices, source=model)
    assert sorted(spots.values()) == [0, 1, 2, 3, 4]
    at = {k: plan.nodes[j - 1] for j, k in spots.items()}
    assert at[0].name == "embedding"  # the embedding's output alone crosses
    for k in range(1, 5):  # the residual add closing layer k - 1
        assert at[k].name.startswith("add") and str(at[k].analysis.kernel_class) == \
            "elementwise", at[k].name
    out = on_module_boundaries(res, plan, model)
    assert out.notes["stage_layers"] == [[0, 2], [2, 4]] and "uneven" not in out.notes


def test_a_cut_inside_a_layer_moves_to_the_nearest_boundary_and_is_recosted() -> None:
    model = tiny()
    plan, res = _planned(model)
    spots = module_boundaries(plan, model, res.devices, source=model)
    mlp = next(i for i, n in enumerate(plan.nodes) if n.name == "linear_11")  # layer 1's gate
    inside = cost_split(plan, res.devices, [0, mlp, len(plan.nodes)], groups=list(res.groups),
                        source=model)
    out = on_module_boundaries(inside, plan, model)
    (moved,) = out.moved_cuts
    want = min(spots, key=lambda j: (abs(j - mlp), j))
    assert (moved.planned, moved.moved_to, moved.at) == (mlp, want, "before model.layers.2")
    assert moved.why == "inside model.layers.1"
    again = cost_split(plan, res.devices, [0, want, len(plan.nodes)], groups=list(res.groups),
                       source=model)
    assert out.latency_s == pytest.approx(again.latency_s, rel=1e-12)
    assert out.notes["planned_latency_s"] == inside.latency_s
    assert out.notes["uneven"] == "3 decoder layers over 2 stages: 2, 1"
    d = out.to_record(ParallelizeUnavailable("not asked", None)).pipeline
    assert d.moved_cuts[0].at == "before model.layers.2" and d.micro_batches == 2
    assert d.emitted.stages[1].modules == ("model.layers.2", "model.norm", "lm_head")
    json.dumps(d.to_json())
    on = on_module_boundaries(out, plan, model)  # already on a boundary: nothing moves
    assert on.moved_cuts == () and on.latency_s == out.latency_s


# --- what is refused ---------------------------------------------------------------------------

class Scaled(nn.Module):
    """A wrapper with a parameter of its own: the stages would skip it."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm, self.scale = lm, nn.Parameter(torch.ones(()))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm(ids).logits * self.scale


class Both(nn.Module):
    """Returns more than the logits: the last stage would not."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.lm(ids, output_hidden_states=True)
        return out.logits, out.hidden_states[1]


def test_models_it_cannot_stage_are_refused_with_why() -> None:
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_embd=64, n_head=4, n_layer=2, vocab_size=256, n_positions=32))
    with pytest.raises(GraphoptError, match="holds 0 transformers Llama/Mistral/Qwen2") as e:
        decoder_of(gpt2)
    assert "--strategy tensor" in e.value.fix
    with pytest.raises(GraphoptError, match=r"holds scale outside its decoder lm"):
        decoder_of(Scaled(tiny()))
    model = Both(tiny())
    plan, res = _planned(model)
    with pytest.raises(GraphoptError, match="returns 2 tensor"):
        on_module_boundaries(res, plan, model)
    with pytest.raises(GraphoptError, match="costed only"):
        apply_two_d(tiny(), res, object())

    class Mesh:  # checked before any process group work
        mesh_dim_names, shape = ("tp",), (4,)

    ok = on_module_boundaries(*reversed(_planned(tiny())), tiny())
    with pytest.raises(GraphoptError, match=r"is not \(pp=2, tp=2\)"):
        apply_two_d(tiny(), ok, Mesh())


# --- auto and the report ---------------------------------------------------------------------

def test_auto_compares_only_what_it_can_emit() -> None:
    from graphopt.api.planning import with_partition
    from graphopt.partition.strategies import compare

    model = tiny()
    plan, _ = _planned(model)
    ds = parse_devices(NODES)
    cands = {c.name: c for c in compare(plan, ds, source=model)}
    two = cands["2d"]
    assert two.emittable and two.result.layout is not None
    assert "decoder layers per stage 0, 1-2" in two.detail or "decoder layers per stage 0-1, 2" \
        in two.detail
    assert "(uneven)" in two.detail and "micro-batches, GPipe" in two.detail
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_embd=64, n_head=4, n_layer=2, vocab_size=256, n_positions=32, use_cache=False))
    import graphopt

    gplan = graphopt.plan(Logits(gpt2), (_ids(),), target="h100-sxm")
    g = {c.name: c for c in compare(gplan, ds, source=Logits(gpt2))}["2d"]
    assert g.feasible and not g.emittable and "Llama/Mistral/Qwen2" in g.not_emitted
    assert g.result.not_emitted == g.not_emitted
    out = with_partition(plan, NODES, "auto", source=model, module=model)
    st = out.strategy
    ok = [c for c in st.candidates if c.feasible and c.emittable]
    assert st.winner == min(ok, key=lambda c: c.latency_s).strategy


def test_report_gives_the_emitted_two_d_code() -> None:
    from graphopt.partition.tp_attach import attach_split
    from graphopt.report.html import render_html
    from graphopt.report.markdown import render_markdown

    model = tiny()
    plan, res = _planned(model)
    mlp = next(i for i, n in enumerate(plan.nodes) if n.name == "linear_11")
    inside = cost_split(plan, res.devices, [0, mlp, len(plan.nodes)], groups=list(res.groups),
                        source=model)
    out = on_module_boundaries(inside, plan, model)
    choice = StrategyChoice(Strategy.TWO_D, Strategy.TWO_D, False, "request", "asked", (), ())
    data = json.loads(attach_split(plan, out, choice, source=model, module=model).to_json())
    md = render_markdown(typed(data))
    assert "### 2-D plan (pipeline stages x tensor parallel)" in md
    assert 'mesh_dim_names=("pp", "tp")' in md and "PipelineStage(stage, pp, 2" in md
    assert "ScheduleGPipe(pipe, n_microbatches=2)" in md
    assert "(inside model.layers.1), moved before model.layers.2" in md
    assert "**uneven:** 3 decoder layers over 2 stages: 2, 1" in md
    page = render_html(typed(data))
    assert "PipelineStage(stage, pp, 2" in page and "moved before model.layers.2" in page
