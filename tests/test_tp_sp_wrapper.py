"""Sequence parallelism found through wrappers (issue 23, item 3): a transformers Llama inside
the usual ``forward(ids) -> logits`` module, and a plain ``nn.Module`` of the same shape; the
layout found (FQNs with the wrapper's prefix), the cases it must refuse and why, 2 gloo
processes against the single-process model, and the held-out Llama-70B check."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from graphopt.errors import GraphoptError
from graphopt.partition.tp_emit import (
    apply_tensor_parallel,
    parallelize_plan,
    sequence_parallel_layout,
    sequence_parallel_support,
)
from graphopt.partition.tp_sequence import CallSite, guard_tokens
from tests.gloo_run import every_rank_equals, gloo_mesh, needs_gloo, save_rank, spawn
from tests.test_tp_run import Block, llama_blocks, tiny_llama

transformers = pytest.importorskip("transformers")

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INNER, VOCAB, LAYERS = 64, 4, 2, 16, 128, 256, 2
TWO = "cuda:0=h100-sxm,cuda:1=h100-sxm"


class Logits(nn.Module):
    """The usual wrapper: token ids in, logits out."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(ids).logits


# --- a plain nn.Module Llama: no transformers class anywhere ------------------------------


class RMSNorm(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-b, a), dim=-1) * sin


class Attention(nn.Module):
    """GQA attention; local head counts come from the shapes (``view(b, s, -1, head_dim)``)."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(HIDDEN, HEADS * HEAD_DIM, bias=False)
        self.k = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
        self.v = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
        self.o = nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]
                ) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (p(x).view(b, s, -1, HEAD_DIM).transpose(1, 2) for p in (self.q, self.k,
                                                                             self.v))
        q, k = _rotate(q, *rope), _rotate(k, *rope)
        kv, groups = k.shape[1], q.shape[1] // k.shape[1]  # transformers' repeat_kv
        k, v = (t[:, :, None].expand(b, kv, groups, s, HEAD_DIM).reshape(b, -1, s, HEAD_DIM)
                for t in (k, v))
        out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(out.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(HIDDEN, INNER, bias=False)
        self.up = nn.Linear(HIDDEN, INNER, bias=False)
        self.down = nn.Linear(INNER, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(nn.functional.silu(self.gate(x)) * self.up(x))


class Layer(nn.Module):
    """Pre-norm residual layer: attention called positionally with a second argument, the
    MLP by keyword (both conventions of case 7)."""

    def __init__(self) -> None:
        super().__init__()
        self.attn_norm, self.attn = RMSNorm(HIDDEN), Attention()
        self.mlp_norm, self.mlp = RMSNorm(HIDDEN), MLP()

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]
                ) -> torch.Tensor:
        h = x + self.attn(self.attn_norm(x), rope)
        return h + self.mlp(x=self.mlp_norm(h))


class PlainLlama(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
        self.norm = RMSNorm(HIDDEN)
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def rope(self, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        inv = 1.0 / 10000 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM)
        angles = torch.arange(tokens).float()[:, None] * inv[None]
        emb = torch.cat((angles, angles), dim=-1)
        return emb.cos(), emb.sin()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        rope = self.rope(x.shape[1])  # from the replicated embedding: every token
        for layer in self.layers:
            x = layer(x, rope)
        return self.head(self.norm(x))


def plain_llama() -> nn.Module:
    torch.manual_seed(0)
    return PlainLlama().eval()


def plain_blocks(head: bool = False) -> list[Block]:
    blocks = []
    for i in range(LAYERS):
        p = f"layers.{i}"
        blocks.append(Block("attention", (f"{p}.attn.q", f"{p}.attn.k", f"{p}.attn.v"),
                            (f"{p}.attn.o",), HEADS, KV_HEADS))
        blocks.append(Block("mlp", (f"{p}.mlp.gate", f"{p}.mlp.up"), (f"{p}.mlp.down",)))
    return [*blocks, Block("lm_head", ("head",), ())] if head else blocks


def prefixed(blocks: list[Block], prefix: str) -> list[Block]:
    return [Block(b.kind, tuple(prefix + n for n in b.column_modules),
                  tuple(prefix + n for n in b.row_modules), b.heads, b.kv_heads)
            for b in blocks]


def _ids(tokens: int = 8) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, tokens), generator=torch.Generator().manual_seed(9))


# --- the layout found ----------------------------------------------------------------------


def test_layout_through_a_wrapper_has_the_wrappers_prefix() -> None:
    wrapped = Logits(tiny_llama())
    layout = sequence_parallel_layout(prefixed(llama_blocks(head=True), "model."), wrapped)
    assert not isinstance(layout, str), layout
    first = layout.layers[0]
    assert first.fqn == "model.model.layers.0"
    assert first.norms == ("model.model.layers.0.input_layernorm",
                           "model.model.layers.0.post_attention_layernorm")
    assert (first.attention, first.mlp) == ("model.model.layers.0.self_attn",
                                            "model.model.layers.0.mlp")
    # transformers: the layer positionally, the attention by keyword, the MLP positionally
    assert layout.layer_call == CallSite(1)
    assert first.attention_call == CallSite(0, "hidden_states")
    assert first.mlp_call == CallSite(1)
    assert (layout.final_norm, layout.lm_head, layout.split_head) == (
        "model.model.norm", "model.lm_head", True)
    plan = parallelize_plan(prefixed(llama_blocks(head=True), "model."), degree=2,
                            sequence_parallel=True, module=wrapped)
    assert type(plan["model.model.layers.1.input_layernorm"]).__name__ == "SequenceParallel"
    assert "Shard(dim=1)" in repr(plan["model.model.layers.1.mlp.down_proj"])
    assert type(plan["model.lm_head"]).__name__ == "ColwiseParallel"


def test_layout_of_a_plain_module() -> None:
    layout = sequence_parallel_layout(plain_blocks(head=True), plain_llama())
    assert not isinstance(layout, str), layout
    assert [x.fqn for x in layout.layers] == ["layers.0", "layers.1"]
    assert layout.layers[1].norms == ("layers.1.attn_norm", "layers.1.mlp_norm")
    assert (layout.final_norm, layout.lm_head) == ("norm", "head")
    # layer(x, rope), attn(norm(x), rope), mlp(x=...)
    assert layout.layer_call == CallSite(2)
    assert layout.layers[0].attention_call == CallSite(2)
    assert layout.layers[0].mlp_call == CallSite(0, "x")
    plan = {k: repr(v) for k, v in parallelize_plan(
        plain_blocks(), degree=2, sequence_parallel=True, module=plain_llama()).items()}
    assert "input_layouts=(Replicate(), None)" in plan["layers.0"]
    assert "input_layouts=(Shard(dim=1), None)" in plan["layers.0.attn"]
    assert "input_kwarg_layouts={'x': Shard(dim=1)}" in plan["layers.0.mlp"]


def test_the_tensor_strategy_takes_sequence_parallelism_through_the_wrapper() -> None:
    import graphopt

    torch.manual_seed(0)
    wide = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=256, num_attention_heads=4, num_key_value_heads=2, intermediate_size=512,
        num_hidden_layers=2, vocab_size=256, max_position_embeddings=2048,
        use_cache=False)).eval()
    ids = torch.randint(0, 256, (1, 1024), generator=torch.Generator().manual_seed(5))
    plan = graphopt.plan(Logits(wide), (ids,), target="h100-sxm", devices=TWO,
                         strategy="tensor")
    assert plan.strategy.sequence_parallel is True
    emitted = plan.tensor_parallel.parallelize_module
    assert emitted.sequence_parallel is True
    assert emitted.plan["model.model.layers.0.input_layernorm"] == "SequenceParallel"
    assert emitted.plan["model.model.norm"] == "SequenceParallel"
    assert "'model.lm_head':" in emitted.code


# --- where it must not fire, and why -------------------------------------------------------


class ThreeNorms(Layer):
    def __init__(self) -> None:
        super().__init__()
        self.extra_norm = RMSNorm(HIDDEN)


class Gated(Layer):
    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(HIDDEN, HIDDEN)


class StarCall(Layer):
    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]
                ) -> torch.Tensor:
        args = (self.attn_norm(x), rope)
        h = x + self.attn(*args)
        return h + self.mlp(x=self.mlp_norm(h))


class TwoWays(Layer):
    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]
                ) -> torch.Tensor:
        h = x + self.attn(self.attn_norm(x), rope)
        return h + self.mlp(self.mlp_norm(h)) + self.mlp(x=h)


class NoHidden(Layer):
    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]
                ) -> torch.Tensor:
        h = x + self.attn(self.attn_norm(x), rope)
        return h + self.mlp(hidden=self.mlp_norm(h))  # not MLP.forward's first parameter


class ViaHelper(PlainLlama):
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self._run(self.embed(ids))))

    def _run(self, x: torch.Tensor) -> torch.Tensor:
        rope = self.rope(x.shape[1])
        for layer in self.layers:
            x = layer(x, rope)
        return x


def _with(layer: type[Layer] = Layer, **change: object) -> nn.Module:
    model = plain_llama()
    model.layers = nn.ModuleList(layer() for _ in range(LAYERS))
    for name, value in change.items():
        setattr(model, name, value)
    return model


def _why(model: nn.Module, blocks: list[Block] | None = None) -> str:
    ok, why = sequence_parallel_support(plain_blocks() if blocks is None else blocks, model)
    assert not ok
    return why


def test_refusals_say_why() -> None:
    assert sequence_parallel_support(plain_blocks(), plain_llama())[0] is True
    assert "has 3 norms, not one before each block" in _why(_with(ThreeNorms))
    assert "has gate (Linear) with parameters besides" in _why(_with(Gated))
    assert "1 of the 2 decoder layers in layers are split" in _why(plain_llama(),
                                                                     plain_blocks()[:2])
    assert "0 final norms beside the decoder layers" in _why(_with(norm=nn.Identity()))
    assert "no nn.Embedding of the hidden width 64" in _why(_with(embed=nn.Embedding(4, 8)))
    assert "no nn.Linear LM head" in _why(_with(head=nn.Identity()))
    two = _with(extra=nn.Linear(HIDDEN, 3))  # two Linears could be the head, none named
    assert "several, none named by get_output_embeddings" in _why(two)
    assert "is called with *args" in _why(_with(StarCall))
    assert "layers.0.mlp is called 2 different ways in TwoWays.forward" in _why(_with(TwoWays))
    assert "without its hidden states ('x')" in _why(_with(NoHidden))
    helper = ViaHelper().eval()
    assert "no call of layers found in ViaHelper.forward" in _why(helper)
    stack = nn.Module()  # the layers as plain attributes "0", "1" of a module
    for i in range(LAYERS):
        stack.add_module(str(i), Layer())
    assert "layers is a Module, not an nn.ModuleList" in _why(_with(layers=stack))
    head = plain_blocks() + [Block("lm_head", ("layers.0.mlp.gate",), ())]
    assert "the vocabulary-split projection ('layers.0.mlp.gate',)" in _why(plain_llama(), head)


class Around(nn.Module):
    """Skips LlamaForCausalLM.forward: calls its body and head by their dotted paths."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head(self.model.model(ids).last_hidden_state)


def test_what_runs_is_what_is_hooked() -> None:
    """Case 7's second half: the layer loop hooked must be the one that runs."""
    from graphopt.frontends.llm_steps import PrefillStep

    blocks = prefixed(llama_blocks(), "lm.")
    ok, why = sequence_parallel_support(blocks, PrefillStep(tiny_llama()))
    assert not ok and why.startswith("lm.model (LlamaModel) is not called from the forward")
    ok, why = sequence_parallel_support(prefixed(llama_blocks(), "model."),
                                        Around(tiny_llama()))
    assert ok, why
    assert "LM head model.lm_head" in why


def test_a_forward_without_source_is_refused() -> None:
    scope: dict[str, object] = {"Layer": Layer}
    exec("class Hidden(Layer):\n    def forward(self, x, rope):\n"  # noqa: S102
         "        return x + self.mlp(x=self.mlp_norm(x + self.attn(self.attn_norm(x), rope)))",
         scope)
    why = _why(_with(scope["Hidden"]))  # type: ignore[arg-type]
    assert "the source of Hidden.forward is not readable" in why


class Keyword(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def test_the_token_guard_reads_a_keyword_call() -> None:
    layer = Keyword()
    guard_tokens(layer, 2, CallSite(0, "x"))
    layer(x=torch.zeros(1, 8, 4))
    with pytest.raises(GraphoptError, match="got 7 tokens"):
        layer(x=torch.zeros(1, 7, 4))


# --- 2 gloo processes against the single-process model -------------------------------------


def _model(which: str) -> nn.Module:
    return Logits(tiny_llama()) if which == "wrapped" else plain_llama()


def _run(which: str, rank: int, world: int, port: int, out_dir: str) -> None:
    """One rank: the blocks found on the plan of the user's module, applied with SP."""
    import graphopt
    from graphopt.partition.tp_blocks import find_tp_blocks

    model = _model(which)
    blocks, _ = find_tp_blocks(graphopt.plan(model, (_ids(),), target="h100"), world,
                               source=model)
    with gloo_mesh(rank, world, port) as mesh:
        sp = apply_tensor_parallel(model, mesh, blocks, sequence_parallel=True)
        seen: dict[str, object] = {"kinds": [str(b.kind) for b in blocks],
                                   "head": [list(b.column_modules) for b in blocks
                                            if b.kind == "lm_head"]}
        norm = sp.get_submodule("model.model.layers.1.post_attention_layernorm"
                                if which == "wrapped" else "layers.1.mlp_norm")
        norm.register_forward_hook(lambda _m, _i, out: seen.__setitem__(
            "norm_out_local", list(out.to_local().shape)))
        with torch.no_grad():
            logits = sp(_ids())
        save_rank(out_dir, rank, logits, seen)


def _wrapped_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    _run("wrapped", rank, world, port, out_dir)


def _plain_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    _run("plain", rank, world, port, out_dir)


@needs_gloo
@pytest.mark.parametrize("which", ["wrapped", "plain"])
def test_two_gloo_processes_through_a_wrapper_equal_the_model(tmp_path: Path, which: str
                                                                ) -> None:
    worker = _wrapped_worker if which == "wrapped" else _plain_worker
    spawn(worker, 2, tmp_path, f"sequence-parallel run ({which})", timeout_s=180)
    with torch.no_grad():
        want = _model(which)(_ids())
    head = "model.lm_head" if which == "wrapped" else "head"
    # the norm ran on 4 of the 8 tokens; the LM head split by vocabulary
    every_rank_equals(tmp_path, 2, want, {
        "kinds": ["attention", "mlp"] * LAYERS + ["lm_head"], "head": [[head]],
        "norm_out_local": [2, 4, HIDDEN]})


# --- the held-out check: Llama-70B's shape in a wrapper, 4 H100s ---------------------------


def test_llama_70b_in_a_wrapper_reaches_half_of_hefts_makespan() -> None:
    """Issue 23's held-out check: at most 0.5x HEFT's makespan (plain TP gives 0.53x; with
    sequence parallelism 0.45x). Traced once on the meta device (about 10 s)."""
    from graphopt.api.planning import dry_run, with_partition
    from graphopt.decisions.planner import build_plan
    from graphopt.frontends import load_graph
    from graphopt.hardware.registry import get_target
    from graphopt.partition import parse_devices, split

    config = transformers.LlamaConfig(
        hidden_size=8192, num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
        intermediate_size=28672, vocab_size=32000, max_position_embeddings=8192,
        use_cache=False)
    with torch.device("meta"):
        model = Logits(transformers.LlamaForCausalLM(config).to(torch.bfloat16)).eval()
    graph = load_graph(model, (torch.zeros(1, 1024, dtype=torch.long, device="meta"),))
    plan = dry_run(build_plan(graph, get_target("h100")), graph)
    devices = ",".join(f"cuda:{i}=h100" for i in range(4))
    heft = split(plan, parse_devices(devices), "heft").makespan_s
    tp = with_partition(plan, devices, "tensor", source=graph, module=model)
    ratio = tp.partition.makespan_s / heft
    assert tp.strategy.sequence_parallel is True
    assert ratio <= 0.5, f"tensor parallel is {ratio:.3f}x HEFT's makespan"
    emitted = tp.tensor_parallel.parallelize_module
    assert emitted.sequence_parallel is True
    assert emitted.plan["model.model.layers.79.post_attention_layernorm"] == \
        "SequenceParallel"
