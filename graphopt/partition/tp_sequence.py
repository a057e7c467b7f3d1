"""Sequence parallelism for ``parallelize_module`` (Megatron-SP, Korthikanti et al. 2022),
laid out as torchtitan's Llama apply_tp does it.

Between the blocks the residual stream is split by tokens (dim 1) and the norms run on their
token shard (SequenceParallel). Each attention / MLP module all-gathers its input
(PrepareModuleInput Shard(1) -> Replicate) and its row-split Linear reduce-scatters instead of
all-reducing (RowwiseParallel(output_layouts=Shard(1))). The LM head all-gathers the tokens;
when the plan splits it by vocabulary it gathers its logits too.

One difference from torchtitan: the embedding stays replicated and the first decoder layer
takes its token shard locally (PrepareModuleInput Replicate -> Shard(1), no communication):
transformers' LlamaModel computes position ids, rotary tables and the causal mask from the
embedding output's length, which a token-sharded embedding would make the local one. The
embedding is a gather, not a GEMM: keeping it whole costs nothing measurable.

The structure is found by walking the module from the blocks' FQNs, never from its class:
transformers' ``LlamaForCausalLM``, a module wrapping one (``model.model.layers.0...``,
``model.lm_head``) and a plain ``nn.Module`` of the same shape all get the plan. "The same
shape" (:func:`sequence_parallel_layout`; a case that fails is refused with its reason):

1. Blocks: every decoder layer split, one ``attention`` block (Q/K/V/O ``nn.Linear``) and one
   ``mlp`` block (gate/up/down or two ``nn.Linear``) each; hidden size = Q's ``in_features``.
2. Decoder layer: the attention and MLP are two children of one module, which also holds
   exactly two per-token norms (leaves whose parameters are all hidden-size vectors: RMSNorm,
   LayerNorm) and no other child with parameters; its own parameters are hidden-size vectors.
3. Stack: the layers are all the children of one ``nn.ModuleList``, ``ModuleDict`` or
   ``Sequential``; the stack's parent calls them.
4. Final norm: exactly one per-token norm beside the stack (a child of the stack's parent).
5. Embedding: an ``nn.Embedding`` of the hidden width outside the layers (replicated, above).
6. LM head: an ``nn.Linear`` outside the layers reading the hidden size: the one an
   ``"lm_head"`` block names, else the one the outermost ``get_output_embeddings()`` names
   (transformers' ``*ForCausalLM``), else the only one.
7. Calls, read from the ``forward`` source (``ast``): the stack's parent calls each layer,
   the layer its attention, MLP and norms, with the hidden states first of the positional
   arguments (the others get ``None`` in PrepareModuleInput) or as the keyword of the callee's
   first ``forward`` parameter, one way at every call site, never through ``*args``
   (transformers' layers call the attention by keyword). The stack's parent, the final norm
   and the LM head are called by the modules above them, up to the root: a wrapper that runs
   the layers itself is refused.
8. Not read from the module: what the layer computes outside its attention and MLP (residual
   adds, scales) must work per token, as it runs on a token shard; the cost model splits by
   tokens only the plan's per-token nodes (:mod:`.tensor_parallel` case 8).
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
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

__all__ = ["CallSite", "SPLayout", "guard_tokens", "sequence_parallel_layout",
           "sequence_parallel_specs", "sequence_parallel_support"]


@dataclass(frozen=True)
class CallSite:
    """How a caller passes the hidden states (case 7): first of ``positional`` arguments, or
    (``positional`` 0) as the keyword ``keyword``."""

    positional: int = 1
    keyword: str = ""

    def prepare(self, src: Any, dst: Any) -> tuple[str, dict[str, Any]]:
        """``PrepareModuleInput`` moving the hidden states from layout ``src`` to ``dst``."""
        rest = (None,) * (self.positional - 1)
        kwargs = ({"input_kwarg_layouts": {self.keyword: src},
                   "desired_input_kwarg_layouts": {self.keyword: dst}} if self.keyword else
                  {"input_layouts": (src, *rest), "desired_input_layouts": (dst, *rest)})
        return "PrepareModuleInput", {**kwargs, "use_local_output": True}


@dataclass(frozen=True)
class _SPLayer:
    """One decoder layer: its FQN, norms, attention and MLP FQNs, how it calls those two."""

    fqn: str
    norms: tuple[str, ...]
    attention: str
    attention_arg: str
    mlp: str
    attention_call: CallSite = CallSite()
    mlp_call: CallSite = CallSite()


@dataclass(frozen=True)
class SPLayout:
    """Where the sequence-parallel plan puts its styles, found from the blocks and the module."""

    layers: tuple[_SPLayer, ...]
    final_norm: str
    lm_head: str
    split_head: bool = False  # an lm_head block splits it by vocabulary
    layer_call: CallSite = CallSite()  # how the stack's parent calls each layer


def _parent(fqn: str) -> str:
    return fqn.rpartition(".")[0]


def _child(fqn: str) -> str:  # the last name of an FQN
    return fqn.rpartition(".")[2]


def _is_norm(mod: nn.Module, hidden: int) -> bool:
    """A per-token norm: a leaf whose parameters are all vectors of the hidden size (RMSNorm,
    LayerNorm), so a token shard computes exactly what the whole tensor would."""
    params = list(mod.parameters(recurse=False))
    return (not list(mod.children()) and bool(params)
            and not isinstance(mod, (nn.Linear, nn.Embedding))
            and all(p.dim() == 1 and p.shape[0] == hidden for p in params))


def _norm_children(root: nn.Module, fqn: str, hidden: int) -> list[str]:
    return [f"{fqn}.{name}".lstrip(".") for name, child in root.get_submodule(fqn)
            .named_children() if _is_norm(child, hidden)]


def _first_arg(mod: nn.Module) -> str:
    return next(iter(inspect.signature(mod.forward).parameters), "hidden_states")


@functools.lru_cache(maxsize=256)
def _forward_tree(cls: type) -> tuple[ast.AST, str] | str:
    """``cls.forward`` parsed, and the name of its ``self``; or why it cannot be read."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls.forward)))
    except (OSError, TypeError, SyntaxError) as e:
        return f"the source of {cls.__qualname__}.forward is not readable ({e})"
    fn = tree.body[0]
    args = fn.args.args if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) else []
    return tree, args[0].arg if args else "self"


def _dotted(node: ast.AST, me: str) -> str | None:
    """``self.a.b`` -> ``"a.b"``; None for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join(reversed(parts)) if parts and isinstance(node, ast.Name) \
        and node.id == me else None


def _calls(caller: nn.Module, child: str) -> list[ast.Call] | str:
    """Case 7: the calls of ``caller``'s descendant ``child`` (a dotted path) in its forward:
    ``self.child(...)``, ``self.child[i](...)``, or ``v(...)`` with ``v`` a loop variable
    over ``self.child``."""
    read = _forward_tree(type(caller))
    if isinstance(read, str):
        return read
    tree, me = read
    loop_vars = {n.id for node in ast.walk(tree) if isinstance(node, (ast.For, ast.comprehension))
                 and any(_dotted(x, me) == child for x in ast.walk(node.iter))
                 for n in ast.walk(node.target) if isinstance(n, ast.Name)}
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call) and (
        _dotted(node.func, me) == child
        or (isinstance(node.func, ast.Subscript) and _dotted(node.func.value, me) == child)
        or (isinstance(node.func, ast.Name) and node.func.id in loop_vars))]


def _reached(root: nn.Module, fqn: str) -> bool:
    """Case 7: ``fqn`` runs when ``root`` does: a module above it, itself reached, calls it
    by its dotted path in its forward (a wrapper running the layers itself does not)."""
    parts = fqn.split(".")
    for i in range(len(parts)):
        above = ".".join(parts[:i])
        calls = _calls(root.get_submodule(above), ".".join(parts[i:]))
        if calls and not isinstance(calls, str) and (not above or _reached(root, above)):
            return True
    return False


def _call_site(caller: nn.Module, caller_fqn: str, child: str, callee: nn.Module
               ) -> CallSite | str:
    """Case 7: how ``caller`` passes the hidden states to its child ``child``, or why that is
    not known."""
    what = f"{caller_fqn + '.' if caller_fqn else ''}{child}"
    if isinstance(caller, nn.Sequential):
        return CallSite()  # Sequential.forward: module(input)
    calls = _calls(caller, child)
    if isinstance(calls, str):
        return f"how {what} is called is unknown: {calls}"
    if not calls:
        return f"no call of {what} found in {type(caller).__qualname__}.forward"
    first = _first_arg(callee)
    sites = set()
    for c in calls:
        if any(isinstance(a, ast.Starred) for a in c.args):
            return f"{what} is called with *args: where its hidden states go is unknown"
        if c.args:
            sites.add(CallSite(len(c.args)))
        elif any(k.arg == first for k in c.keywords):
            sites.add(CallSite(0, first))
        else:
            return (f"{what} is called without its hidden states ({first!r}) as the first "
                    "positional argument or keyword")
    return sites.pop() if len(sites) == 1 else (
        f"{what} is called {len(sites)} different ways in {type(caller).__qualname__}.forward")


def _sp_layer(root: nn.Module, attn: TPBlockLike, mlp: TPBlockLike, hidden: int,
              sites: dict[tuple[type, str], CallSite | str]) -> _SPLayer | str:
    """Case 2 and the layer's call sites of case 7 (``sites``: read once per layer class)."""
    where, mlp_fqn = attention_module(attn), attention_module(mlp)
    fqn = _parent(where)
    if not fqn or _parent(mlp_fqn) != fqn:
        return (f"attention {where} and MLP {mlp_fqn} are not the two children of one "
                "decoder layer")
    norms = _norm_children(root, fqn, hidden)
    if len(norms) != 2:
        return f"decoder layer {fqn} has {len(norms)} norms, not one before each block"
    layer = root.get_submodule(fqn)
    known = {_child(x) for x in (where, mlp_fqn, *norms)}
    other = next((n for n, c in layer.named_children()
                  if n not in known and next(c.parameters(), None) is not None), None)
    if other is not None:
        return (f"decoder layer {fqn} has {other} ({type(layer.get_submodule(other)).__name__}) "
                "with parameters besides its attention, MLP and two norms")
    if any(p.dim() != 1 or p.shape[0] != hidden for p in layer.parameters(recurse=False)):
        return f"decoder layer {fqn} holds a parameter that is not a vector of the hidden size"
    calls: list[CallSite] = []  # the attention, the MLP, then the norms
    for child in (_child(where), _child(mlp_fqn), *map(_child, norms)):
        key = (type(layer), child)
        if key not in sites:
            sites[key] = _call_site(layer, fqn, child, layer.get_submodule(child))
        site = sites[key]
        if isinstance(site, str):
            return site
        calls.append(site)
    return _SPLayer(fqn, tuple(norms), where, _first_arg(root.get_submodule(where)), mlp_fqn,
                    calls[0], calls[1])


def _lm_head(root: nn.Module, hidden: int, stack: str, named: tuple[str, ...]
             ) -> str | None:
    """Case 6: the LM head's FQN, or None."""
    heads = [name for name, m in root.named_modules() if isinstance(m, nn.Linear)
             and not name.startswith(stack + ".") and m.in_features == hidden]
    if named:
        return named[0] if named[0] in heads else None
    for _, m in root.named_modules():  # the outermost get_output_embeddings() naming one
        get = getattr(m, "get_output_embeddings", None)
        head = get() if callable(get) else None
        hit = next((name for name in heads if root.get_submodule(name) is head), None)
        if hit is not None:
            return hit
    return heads[0] if len(heads) == 1 else None


def _stack(module: nn.Module, layers: Sequence[_SPLayer], hidden: int
           ) -> tuple[str, str, CallSite] | str:
    """Cases 3-5: the layer stack, the final norm and how the stack's parent calls a layer."""
    stacks = {_parent(layer.fqn) for layer in layers}
    if len(stacks) != 1:
        return f"decoder layers under {sorted(stacks)}, not one layer list"
    where = stacks.pop()
    container = module.get_submodule(where)
    if not isinstance(container, (nn.ModuleList, nn.ModuleDict, nn.Sequential)):
        return f"the decoder layers' parent {where} is a {type(container).__name__}, not " \
               "an nn.ModuleList, ModuleDict or Sequential"
    if len(container) != len(layers):
        return f"{len(layers)} of the {len(container)} decoder layers in {where} are split"
    body = _parent(where)
    finals = _norm_children(module, body, hidden)
    if len(finals) != 1:
        return f"{len(finals)} final norms beside the decoder layers, not one"
    if not any(isinstance(m, nn.Embedding) and m.embedding_dim == hidden
               and not name.startswith(where + ".") for name, m in module.named_modules()):
        return f"no nn.Embedding of the hidden width {hidden} outside the decoder layers"
    for fqn in (body, finals[0]):
        if fqn and not _reached(module, fqn):
            return (f"{fqn} ({type(module.get_submodule(fqn)).__name__}) is not called from "
                    "the forward of the modules above it: its hooks would never run")
    if isinstance(container, nn.Sequential):
        return where, finals[0], CallSite()
    call = _call_site(module.get_submodule(body), body, _child(where),
                      module.get_submodule(layers[0].fqn))
    return call if isinstance(call, str) else (where, finals[0], call)


def sequence_parallel_layout(blocks: Sequence[TPBlockLike], module: nn.Module
                             ) -> SPLayout | str:
    """The layout of :func:`sequence_parallel_specs` found in ``module`` (cases 1-7 of the
    module docstring), or why the model does not have it."""
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
    layers, sites = [], {}
    for a, m in zip(attn, mlp, strict=True):
        layer = _sp_layer(module, a, m, hidden, sites)
        if isinstance(layer, str):
            return layer
        layers.append(layer)
    found = _stack(module, layers, hidden)
    if isinstance(found, str):
        return found
    where, final, call = found
    named = tuple(heads[0].column_modules) if heads else ()
    head = _lm_head(module, hidden, where, named)
    if head is None:
        return (f"the vocabulary-split projection {named} is not an nn.Linear LM head "
                f"reading the hidden size {hidden}" if named else
                f"no nn.Linear LM head reading the hidden size {hidden} outside the layers "
                "(or several, none named by get_output_embeddings)")
    if not _reached(module, head):
        return f"the LM head {head} is not called from the forward of the modules above it"
    return SPLayout(tuple(layers), final, head, split_head=bool(heads), layer_call=call)


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
    specs: Specs = {layout.layers[0].fqn: layout.layer_call.prepare(whole, tokens)}
    for layer in layout.layers:
        specs.update({norm: ("SequenceParallel", {}) for norm in layer.norms})
        specs[layer.attention] = layer.attention_call.prepare(tokens, whole)
        specs[layer.mlp] = layer.mlp_call.prepare(tokens, whole)
    for name, (cls, _) in plain.items():
        specs[name] = (cls, {"output_layouts": tokens} if cls == "RowwiseParallel" else {})
    specs[layout.final_norm] = ("SequenceParallel", {})
    # the LM head reads every token: gathered, then split by vocabulary with the logits
    # gathered too, or run whole on each device
    specs[layout.lm_head] = (
        ("ColwiseParallel", {"input_layouts": tokens, "output_layouts": whole})
        if layout.split_head else CallSite().prepare(tokens, whole))
    return specs


def guard_tokens(first_layer: nn.Module, degree: int, call: CallSite = CallSite()) -> None:
    """Refuse a token count that does not divide by ``degree`` before any collective: the
    token shards would be uneven, which ``SequenceParallel``'s ``from_local`` does not expect
    (the ranks' gathers then disagree and the process group dies without saying why).
    ``call``: how the layer gets its hidden states (:attr:`SPLayout.layer_call`)."""

    def check(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        x = kwargs.get(call.keyword) if call.keyword else (args[0] if args else None)
        tokens = x.shape[1] if isinstance(x, torch.Tensor) and x.dim() > 1 else None
        if tokens is not None and tokens % degree:
            raise GraphoptError(
                f"sequence parallelism over {degree} devices got {tokens} tokens, which do "
                "not divide evenly", f"pad the sequence to a multiple of {degree} tokens, or "
                "use plain tensor parallelism (sequence_parallel=False)")

    first_layer.register_forward_pre_hook(check, with_kwargs=True)
