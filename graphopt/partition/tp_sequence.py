"""Sequence parallelism for ``parallelize_module`` (Megatron-SP, Korthikanti et al. 2022),
laid out as torchtitan's Llama apply_tp does it.

Between the blocks the residual stream is split by tokens (dim 1) and the norms run on their
token shard (SequenceParallel). Each attention / MLP module all-gathers its input
(PrepareModuleInput Shard(1) -> Replicate) and its row-split Linear reduce-scatters instead of
all-reducing (RowwiseParallel(output_layouts=Shard(1))). The LM head all-gathers the tokens;
when the plan splits it by vocabulary it gathers its logits too.

One difference from torchtitan: the embedding stays replicated and the first decoder layer
takes its token shard locally (PrepareModuleInput Replicate -> Shard(1), no communication).
transformers' LlamaModel computes position ids, the rotary tables and the causal mask from the
embedding output's sequence length; a token-sharded embedding would give them the local
length while attention sees the gathered one. The embedding is a gather, not a GEMM, so
keeping it whole costs nothing measurable.

Call conventions it relies on (transformers' decoder layers, Llama/Mistral/Qwen): the decoder
layer is called with the hidden states positionally, the attention module with them as the
keyword of its forward's first parameter, the MLP positionally. Another convention fails loudly
(PrepareModuleInput's arity check, or attention's shape check), never silently.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from graphopt.errors import GraphoptError
from graphopt.partition.tp_roles import BlockKind
from graphopt.partition.tp_styles import (
    LM_HEAD,
    Specs,
    TPBlockLike,
    attention_module,
    emittable,
    not_emittable,
    style_specs,
    submodule,
)

__all__ = ["SPLayout", "guard_tokens", "sequence_parallel_layout", "sequence_parallel_specs",
           "sequence_parallel_support"]


@dataclass(frozen=True)
class _SPLayer:
    """One decoder layer: its FQN, its norms, its attention and MLP module FQNs."""

    fqn: str
    norms: tuple[str, ...]
    attention: str
    attention_arg: str
    mlp: str


@dataclass(frozen=True)
class SPLayout:
    """Where the sequence-parallel plan puts its styles, found from the blocks and the module."""

    layers: tuple[_SPLayer, ...]
    final_norm: str
    lm_head: str
    split_head: bool = False  # an lm_head block splits it by vocabulary


def _parent(fqn: str) -> str:
    return fqn.rpartition(".")[0]


def _is_norm(mod: nn.Module, hidden: int) -> bool:
    """A per-token norm: a leaf whose parameters are all vectors of the hidden size (RMSNorm,
    LayerNorm), so a token shard computes exactly what the whole tensor would."""
    params = list(mod.parameters(recurse=False))
    return (not list(mod.children()) and bool(params)
            and not isinstance(mod, (nn.Linear, nn.Embedding))
            and all(p.dim() == 1 and p.shape[0] == hidden for p in params))


def _norm_children(root: nn.Module, fqn: str, hidden: int) -> list[str]:
    parent = root.get_submodule(fqn) if fqn else root
    prefix = f"{fqn}." if fqn else ""
    return [prefix + name for name, child in parent.named_children() if _is_norm(child, hidden)]


def _first_arg(mod: nn.Module) -> str:
    params = list(inspect.signature(mod.forward).parameters)
    return params[0] if params else "hidden_states"


def _sp_layer(root: nn.Module, attn: TPBlockLike, mlp: TPBlockLike, hidden: int
              ) -> _SPLayer | str:
    where, mlp_fqn = attention_module(attn), attention_module(mlp)
    layer = _parent(where)
    if not layer or _parent(mlp_fqn) != layer:
        return (f"attention {where} and MLP {mlp_fqn} are not the two children of one "
                "decoder layer")
    norms = _norm_children(root, layer, hidden)
    if len(norms) != 2:
        return f"decoder layer {layer} has {len(norms)} norms, not one before each block"
    return _SPLayer(layer, tuple(norms), where, _first_arg(root.get_submodule(where)), mlp_fqn)


def _lm_head(root: nn.Module, hidden: int) -> str | None:
    get = getattr(root, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if not isinstance(head, nn.Linear) or head.in_features != hidden:
        return None
    return next((name for name, m in root.named_modules() if m is head), None)


def sequence_parallel_layout(blocks: Sequence[TPBlockLike], module: nn.Module
                             ) -> SPLayout | str:
    """The layout of :func:`sequence_parallel_specs`, or why the model does not have it: each
    decoder layer one attention and one MLP block with a norm before each, one final norm
    beside the layers, and a Linear LM head (``get_output_embeddings``), which an
    ``"lm_head"`` block, if any, names."""
    attn = [b for b in blocks if b.kind == BlockKind.ATTENTION]
    mlp = [b for b in blocks if b.kind == BlockKind.MLP]
    heads = [b for b in blocks if b.kind == LM_HEAD]
    if not attn or len(attn) != len(mlp) or len(attn) + len(mlp) + len(heads) != len(blocks):
        return (f"{len(attn)} attention and {len(mlp)} MLP blocks: sequence parallelism needs "
                "every decoder layer split, one attention and one MLP block each")
    try:
        q = submodule(module, attn[0].column_modules[0])
    except GraphoptError as e:
        return e.problem
    if not isinstance(q, nn.Linear):
        return f"{attn[0].column_modules[0]} is not nn.Linear"
    hidden = q.in_features
    layers = []
    for a, m in zip(attn, mlp, strict=True):
        layer = _sp_layer(module, a, m, hidden)
        if isinstance(layer, str):
            return layer
        layers.append(layer)
    stack = {_parent(layer.fqn) for layer in layers}
    if len(stack) != 1:
        return f"decoder layers under {sorted(stack)}, not one layer list"
    where = stack.pop()
    count = len(list(module.get_submodule(where).children()))
    if count != len(layers):
        return f"{len(layers)} of the {count} decoder layers in {where} are split"
    finals = _norm_children(module, _parent(where), hidden)
    if len(finals) != 1:
        return f"{len(finals)} final norms beside the decoder layers, not one"
    head = _lm_head(module, hidden)
    if head is None:
        return "no nn.Linear LM head (get_output_embeddings) reading the hidden states"
    if any(b.column_modules != (head,) for b in heads):
        return (f"the vocabulary-split projection {heads[0].column_modules} is not the LM head "
                f"{head}")
    return SPLayout(tuple(layers), finals[0], head, split_head=bool(heads))


def sequence_parallel_support(blocks: Sequence[TPBlockLike], module: nn.Module | None
                              ) -> tuple[bool, str]:
    """Whether the emitter can emit sequence parallelism for ``module``, and why not."""
    if module is None:
        return False, "no torch module given (the plan alone does not name the norms)"
    kept, unsplit = emittable([b for b in blocks if b.kind != LM_HEAD])
    if unsplit:
        return False, f"not every block splits: {unsplit[0]}"
    heads = [b for b in blocks if b.kind == LM_HEAD and not not_emittable(b)]
    layout = sequence_parallel_layout([*kept, *heads], module)
    if isinstance(layout, str):
        return False, layout
    return True, (f"{len(layout.layers)} decoder layers, final norm {layout.final_norm}, "
                  f"LM head {layout.lm_head}")


def sequence_parallel_specs(blocks: Sequence[TPBlockLike], module: nn.Module
                            ) -> Specs:
    """The Megatron-SP plan (see the comment above) as FQN -> (style, keyword arguments)."""
    from torch.distributed.tensor import Replicate, Shard

    layout = sequence_parallel_layout(blocks, module)
    if isinstance(layout, str):
        raise GraphoptError(f"sequence parallelism cannot be emitted: {layout}",
                            "use plain tensor parallelism (sequence_parallel=False)")
    plain = style_specs(blocks)
    tokens, whole = Shard(1), Replicate()
    specs: Specs = {
        layout.layers[0].fqn: ("PrepareModuleInput", {
            "input_layouts": (whole,), "desired_input_layouts": (tokens,),
            "use_local_output": True})}
    for layer in layout.layers:
        specs.update({norm: ("SequenceParallel", {}) for norm in layer.norms})
        specs[layer.attention] = ("PrepareModuleInput", {
            "input_kwarg_layouts": {layer.attention_arg: tokens},
            "desired_input_kwarg_layouts": {layer.attention_arg: whole},
            "use_local_output": True})
        specs[layer.mlp] = ("PrepareModuleInput", {
            "input_layouts": (tokens,), "desired_input_layouts": (whole,),
            "use_local_output": True})
    for name, (cls, _) in plain.items():
        specs[name] = (cls, {"output_layouts": tokens} if cls == "RowwiseParallel" else {})
    specs[layout.final_norm] = ("SequenceParallel", {})
    # the LM head reads every token: gathered, then split by vocabulary with the logits
    # gathered too, or run whole on each device
    specs[layout.lm_head] = (
        ("ColwiseParallel", {"input_layouts": tokens, "output_layouts": whole})
        if layout.split_head else
        ("PrepareModuleInput", {"input_layouts": (tokens,), "desired_input_layouts": (whole,),
                                "use_local_output": True}))
    return specs


def guard_tokens(first_layer: nn.Module, degree: int) -> None:
    """Refuse a token count that does not divide by ``degree`` before any collective: the
    token shards would be uneven, which ``SequenceParallel``'s ``from_local`` does not expect
    (the ranks' gathers then disagree and the process group dies without saying why)."""

    def check(_m: nn.Module, args: tuple[Any, ...]) -> None:
        tokens = args[0].shape[1] if args and args[0].dim() > 1 else None
        if tokens is not None and tokens % degree:
            raise GraphoptError(
                f"sequence parallelism over {degree} devices got {tokens} tokens, which do "
                "not divide evenly", f"pad the sequence to a multiple of {degree} tokens, or "
                "use plain tensor parallelism (sequence_parallel=False)")

    first_layer.register_forward_pre_hook(check)
