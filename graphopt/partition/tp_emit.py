"""Emit tensor parallelism for ``torch.distributed.tensor.parallel``: graphopt decides which
blocks split, PyTorch's DTensor engine runs them.

The identity (Megatron-LM, Shoeybi et al. 2019): for an MLP ``down(act(gate(x)) * up(x))``,
splitting the columns of ``gate``/``up`` (output features) and the rows of ``down`` (input
features) over ``t`` devices gives each device ``down_r(act(gate_r(x)) * up_r(x))``, and
``sum_r`` of those is the unsplit output: the element-wise middle needs no communication and
one all-reduce follows the row split. Attention is the same with the head dimension: Q/K/V are
column-split (whole heads per device), each device attends over its own heads, and the output
projection is row-split.

Cases the emitter handles:

1. Column-split Linear -> ``ColwiseParallel()``: input replicated, weight ``Shard(0)``,
   output the local shard (``use_local_output=True``), so the module between the splits sees
   ordinary tensors.
2. Row-split Linear -> ``RowwiseParallel()``: input the local shard, weight ``Shard(1)``,
   output all-reduced to a replicated tensor.
3. Attention heads. A device holds ``heads / t`` query heads and ``kv_heads / t`` KV heads;
   with contiguous sharding device ``r``'s query heads read exactly its KV heads, because the
   ratio ``heads / kv_heads`` (the GQA group) is the same locally. Both must divide by ``t``
   (:func:`check_degree`); a KV head is never split.
4. How the attention module learns its local head count. transformers' Llama/Mistral/Qwen
   attention (transformers >= 4.48, and 5.x here) reshapes with
   ``view(*input_shape, -1, self.head_dim)`` and uses ``num_key_value_groups`` (unchanged
   locally), so the local count is inferred and nothing is adjusted. Older modules keep the
   count as an int attribute (``self.num_heads``, ``self.num_key_value_heads``, and the width
   ``self.hidden_size = heads * head_dim`` in the output reshape); those attributes, matched by
   name and value, are divided by ``t`` on the copy (:func:`head_attributes`). A shared
   ``config`` object is never edited: masks and rotary tables read it for the whole model.

5. Sequence parallelism (``sequence_parallel=True``): norms on token shards, an all-gather
   before each block and a reduce-scatter after it in place of the all-reduce; laid out as
   torchtitan's Llama plan (:func:`sequence_parallel_specs`), found from the blocks and the
   module's structure (:func:`sequence_parallel_layout`), or why not
   (:func:`sequence_parallel_support`).

The user's model is never changed: :func:`apply_tensor_parallel` parallelizes a deep copy
(``parallelize_module`` replaces parameters in place).

2-D (tensor parallelism in a group, pipeline stages across groups): see
:func:`two_d_support`.
"""

from __future__ import annotations

import copy
import inspect
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from math import gcd
from typing import TYPE_CHECKING, Any, Protocol

from torch import nn

from graphopt.errors import GraphoptError

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ParallelStyle

__all__ = ["SPLayout", "TPBlockLike", "apply_tensor_parallel", "attention_module",
           "check_degree", "describe_plan", "emittable", "head_attributes", "parallelize_plan",
           "plan_snippet", "sequence_parallel_layout", "sequence_parallel_specs",
           "sequence_parallel_support", "two_d_support"]

logger = logging.getLogger(__name__)

# Attribute names under which attention modules keep their head counts (case 4): Llama/Mistral
# before transformers 4.48 (num_heads, num_key_value_heads, hidden_size), GPT-NeoX/Falcon
# (num_attention_heads), GPT-2 (num_heads, embed_dim), Meta's llama reference (n_heads,
# n_kv_heads), BERT (num_attention_heads, all_head_size).
_HEAD_NAMES = ("num_heads", "num_attention_heads", "n_heads", "n_head")
_KV_NAMES = ("num_key_value_heads", "num_kv_heads", "n_kv_heads")
_WIDTH_NAMES = ("hidden_size", "embed_dim", "all_head_size", "inner_dim")


class TPBlockLike(Protocol):
    """What the emitter reads from a block (``graphopt.partition.tp_blocks.TPBlock`` has it)."""

    @property
    def kind(self) -> str: ...  # "mlp" | "attention"

    @property
    def column_modules(self) -> tuple[str, ...]: ...

    @property
    def row_modules(self) -> tuple[str, ...]: ...

    @property
    def heads(self) -> int | None: ...

    @property
    def kv_heads(self) -> int | None: ...


def _divisors(n: int) -> list[int]:
    return [d for d in range(2, n + 1) if n % d == 0]


def attention_module(block: TPBlockLike) -> str:
    """FQN of the module that owns an attention block's projections (their common parent)."""
    parents = {name.rpartition(".")[0] for name in (*block.column_modules, *block.row_modules)}
    if len(parents) != 1:
        raise GraphoptError(f"attention block projections {sorted(parents)} have no single "
                            "parent module", "list one attention module's Q/K/V/O per block")
    return parents.pop()


def _label(block: TPBlockLike) -> str:
    first = (*block.column_modules, *block.row_modules, "?")[0]
    return f"{block.kind} block {getattr(block, 'name', None) or first}"


def _not_emittable(block: TPBlockLike) -> str:
    if not block.column_modules or not block.row_modules:
        return ("no torch module paths (find_tp_blocks fills them when given the model as "
                "source=)")
    return str(getattr(block, "note", "") or "")


def emittable(blocks: Sequence[TPBlockLike]) -> tuple[list[TPBlockLike], list[str]]:
    """The blocks plain ``ColwiseParallel``/``RowwiseParallel`` can split, and why each other
    block runs unsplit (no module paths, or the block's ``note``: a fused QKV, a K x N weight).
    """
    kept: list[TPBlockLike] = []
    unsplit: list[str] = []
    for b in blocks:
        why = _not_emittable(b)
        if why:
            unsplit.append(f"{_label(b)} runs unsplit: {why}")
        else:
            kept.append(b)
    return kept, unsplit


def check_degree(blocks: Sequence[TPBlockLike], degree: int) -> None:
    """Legality of splitting ``blocks`` over ``degree`` devices (case 3); raises with the fix."""
    if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
        raise GraphoptError(f"tensor-parallel degree {degree!r} is not a positive integer",
                            "pass the number of devices in the tensor-parallel group")
    if not blocks:
        raise GraphoptError("no tensor-parallel blocks to split",
                            "find them with graphopt.partition.tp_blocks.find_tp_blocks")
    seen: set[str] = set()
    for b in blocks:
        if b.kind not in ("mlp", "attention"):
            raise GraphoptError(f"unknown tensor-parallel block kind {b.kind!r}",
                                "use 'mlp' or 'attention'")
        why = _not_emittable(b)
        if why:
            raise GraphoptError(f"{_label(b)}: {why}",
                                "leave it unsplit: pass emittable(blocks)[0]")
        for name in (*b.column_modules, *b.row_modules):
            if name in seen:
                raise GraphoptError(f"module {name} is in two tensor-parallel blocks",
                                    "split each Linear once")
            seen.add(name)
        if b.kind != "attention":
            continue
        where = attention_module(b)
        heads, kv = b.heads, b.kv_heads or b.heads
        if not heads or not kv:
            raise GraphoptError(f"attention block {where} has no head count",
                                "set heads (and kv_heads for GQA) on the block")
        if heads % degree:
            raise GraphoptError(
                f"attention {where}: {heads} heads do not divide over {degree} devices "
                "(a head cannot be split)",
                f"use a tensor-parallel degree that divides {heads} (one of "
                f"{_divisors(heads)}) or leave this block unsplit")
        if kv % degree:
            raise GraphoptError(
                f"attention {where}: {kv} KV heads (GQA, {heads} query heads) do not divide "
                f"over {degree} devices; each device needs whole KV heads for its query heads",
                f"use a tensor-parallel degree that divides {kv} (one of "
                f"{_divisors(gcd(heads, kv))}) or leave this block unsplit")


def _style_specs(blocks: Sequence[TPBlockLike]) -> dict[str, tuple[str, dict[str, Any]]]:
    """Plain plan (cases 1, 2) as FQN -> (style class name, keyword arguments)."""
    specs: dict[str, tuple[str, dict[str, Any]]] = {}
    for b in blocks:
        why = _not_emittable(b)
        if why:
            raise GraphoptError(f"{_label(b)}: {why}", "leave it unsplit: pass "
                                "emittable(blocks)[0]")
        specs.update({name: ("ColwiseParallel", {}) for name in b.column_modules})
        specs.update({name: ("RowwiseParallel", {}) for name in b.row_modules})
    return specs


def _build(specs: dict[str, tuple[str, dict[str, Any]]]) -> dict[str, ParallelStyle]:
    import torch.distributed.tensor.parallel as tp_styles

    return {name: getattr(tp_styles, cls)(**kwargs) for name, (cls, kwargs) in specs.items()}


def _code(cls: str, kwargs: dict[str, Any]) -> str:
    return f"{cls}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"


def parallelize_plan(blocks: Sequence[TPBlockLike], *, degree: int | None = None,
                     sequence_parallel: bool = False, module: nn.Module | None = None
                     ) -> dict[str, ParallelStyle]:
    """The ``parallelize_module`` plan: module FQN -> ``ColwiseParallel`` / ``RowwiseParallel``
    (cases 1, 2), or with ``sequence_parallel`` the Megatron-SP plan for ``module``
    (:func:`sequence_parallel_specs`). With ``degree`` the blocks are checked first
    (:func:`check_degree`); a block that is not :func:`emittable` raises."""
    if degree is not None:
        check_degree(blocks, degree)
    return _build(_specs(blocks, sequence_parallel, module))


def _specs(blocks: Sequence[TPBlockLike], sequence_parallel: bool, module: nn.Module | None
           ) -> dict[str, tuple[str, dict[str, Any]]]:
    if not sequence_parallel:
        return _style_specs(blocks)
    if module is None:
        raise GraphoptError("the sequence-parallel plan needs the model to find its norms and "
                            "LM head", "pass module=<the nn.Module>")
    return sequence_parallel_specs(blocks, module)


# ---------------------------------------------------------------------------------------------
# Sequence parallelism (Megatron-SP, Korthikanti et al. 2022), laid out as torchtitan's Llama
# apply_tp does it: between the blocks the residual stream is split by tokens (dim 1), the norms
# run on their token shard (SequenceParallel), each attention / MLP module all-gathers its input
# (PrepareModuleInput Shard(1) -> Replicate) and its row-split Linear reduce-scatters instead of
# all-reducing (RowwiseParallel(output_layouts=Shard(1))); the LM head all-gathers the tokens.
#
# One difference from torchtitan: the embedding stays replicated and the first decoder layer
# takes its token shard locally (PrepareModuleInput Replicate -> Shard(1), no communication).
# transformers' LlamaModel computes position ids, the rotary tables and the causal mask from the
# embedding output's sequence length; a token-sharded embedding would give them the local
# length while attention sees the gathered one. The embedding is a gather, not a GEMM, so
# keeping it whole costs nothing measurable.
#
# Call conventions it relies on (transformers' decoder layers, Llama/Mistral/Qwen): the decoder
# layer is called with the hidden states positionally, the attention module with them as the
# keyword of its forward's first parameter, the MLP positionally. Another convention fails loudly
# (PrepareModuleInput's arity check, or attention's shape check), never silently.
# ---------------------------------------------------------------------------------------------


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
    beside the layers, and a Linear LM head (``get_output_embeddings``)."""
    attn = [b for b in blocks if b.kind == "attention"]
    mlp = [b for b in blocks if b.kind == "mlp"]
    if not attn or len(attn) != len(mlp) or len(attn) + len(mlp) != len(blocks):
        return (f"{len(attn)} attention and {len(mlp)} MLP blocks: sequence parallelism needs "
                "every decoder layer split, one attention and one MLP block each")
    try:
        q = _submodule(module, attn[0].column_modules[0])
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
    return SPLayout(tuple(layers), finals[0], head)


def sequence_parallel_support(blocks: Sequence[TPBlockLike], module: nn.Module | None
                              ) -> tuple[bool, str]:
    """Whether the emitter can emit sequence parallelism for ``module``, and why not."""
    if module is None:
        return False, "no torch module given (the plan alone does not name the norms)"
    kept, unsplit = emittable(blocks)
    if unsplit:
        return False, f"not every block splits: {unsplit[0]}"
    layout = sequence_parallel_layout(kept, module)
    if isinstance(layout, str):
        return False, layout
    return True, (f"{len(layout.layers)} decoder layers, final norm {layout.final_norm}, "
                  f"LM head {layout.lm_head}")


def sequence_parallel_specs(blocks: Sequence[TPBlockLike], module: nn.Module
                            ) -> dict[str, tuple[str, dict[str, Any]]]:
    """The Megatron-SP plan (see the comment above) as FQN -> (style, keyword arguments)."""
    from torch.distributed.tensor import Replicate, Shard

    layout = sequence_parallel_layout(blocks, module)
    if isinstance(layout, str):
        raise GraphoptError(f"sequence parallelism cannot be emitted: {layout}",
                            "use plain tensor parallelism (sequence_parallel=False)")
    plain = _style_specs(blocks)
    tokens, whole = Shard(1), Replicate()
    specs: dict[str, tuple[str, dict[str, Any]]] = {
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
    specs[layout.lm_head] = ("ColwiseParallel", {"input_layouts": tokens,
                                                 "output_layouts": whole})
    return specs


def _submodule(root: nn.Module, fqn: str) -> nn.Module:
    try:
        return root.get_submodule(fqn)
    except AttributeError:
        raise GraphoptError(f"module {fqn!r} is not in {type(root).__name__}",
                            "give the blocks the model's own module paths "
                            "(model.named_modules())") from None


def head_attributes(module: nn.Module, blocks: Sequence[TPBlockLike], degree: int
                    ) -> dict[str, dict[str, tuple[int, int]]]:
    """Int head-count attributes of each attention module to divide by ``degree`` (case 4):
    ``{attention FQN: {attribute: (global, local)}}``; empty for ``view(..., -1, head_dim)``
    modules. Matched by name and value, so ``num_key_value_groups`` is never touched."""
    out: dict[str, dict[str, tuple[int, int]]] = {}
    for b in blocks:
        if b.kind != "attention" or not b.heads:
            continue
        where = attention_module(b)
        attn = _submodule(module, where)
        q = _submodule(module, b.column_modules[0])
        width = q.out_features if isinstance(q, nn.Linear) else None
        kv = b.kv_heads or b.heads
        want = {**dict.fromkeys(_HEAD_NAMES, b.heads), **dict.fromkeys(_KV_NAMES, kv),
                **dict.fromkeys(_WIDTH_NAMES, width)}
        found = {name: (value, value // degree) for name, value in vars(attn).items()
                 if name in want and isinstance(value, int) and not isinstance(value, bool)
                 and value == want[name]}
        if found:
            out[where] = found
    return out


def _check_linears(module: nn.Module, blocks: Sequence[TPBlockLike], degree: int) -> None:
    for b in blocks:
        for name, dim in ([(n, "out_features") for n in b.column_modules]
                          + [(n, "in_features") for n in b.row_modules]):
            lin = _submodule(module, name)
            if not isinstance(lin, nn.Linear):
                raise GraphoptError(
                    f"{name} is a {type(lin).__name__}, not nn.Linear; ColwiseParallel and "
                    "RowwiseParallel only split nn.Linear (and nn.Embedding)",
                    "leave this block unsplit (e.g. GPT-2's fused Conv1D c_attn)")
            size = getattr(lin, dim)
            if size % degree:
                raise GraphoptError(f"{name}: {dim}={size} does not divide over {degree} "
                                    "devices", f"use a degree that divides {size}")


def _guard_tokens(first_layer: nn.Module, degree: int) -> None:
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


def apply_tensor_parallel(module: nn.Module, mesh: DeviceMesh, blocks: Sequence[TPBlockLike],
                          *, sequence_parallel: bool = False) -> nn.Module:
    """A tensor-parallel copy of ``module`` over the 1-D ``mesh``; ``module`` is not changed.
    With ``sequence_parallel`` the Megatron-SP plan (:func:`sequence_parallel_specs`); the
    token count of each call must then divide by the mesh size.

    Every rank calls it with the same module (``parallelize_module`` scatters rank 0's
    weights). The copy costs one model's memory per rank before sharding frees most of it.
    """
    from torch.distributed.tensor.parallel import parallelize_module

    if mesh.ndim != 1:
        raise GraphoptError(f"tensor parallelism needs a 1-D device mesh, got {mesh.ndim}-D",
                            "pass the tensor-parallel dimension, e.g. mesh['tp']")
    degree = mesh.size()
    check_degree(blocks, degree)
    _check_linears(module, blocks, degree)
    adjust = head_attributes(module, blocks, degree)
    copied = copy.deepcopy(module)
    for where, attrs in adjust.items():
        attn = copied.get_submodule(where)
        for name, (_, local) in attrs.items():
            setattr(attn, name, local)
            logger.debug("%s.%s = %d (local heads)", where, name, local)
    plan = parallelize_plan(blocks, sequence_parallel=sequence_parallel, module=copied)
    layout = sequence_parallel_layout(blocks, copied) if sequence_parallel else None
    if isinstance(layout, SPLayout):
        _guard_tokens(copied.get_submodule(layout.layers[0].fqn), degree)
    parallelize_module(copied, mesh, plan)
    logger.info("tensor parallel over %d devices: %d Linears split in %d blocks", degree,
                len(plan), len(blocks))
    return copied


def plan_snippet(blocks: Sequence[TPBlockLike], degree: int, device_type: str = "cuda", *,
                 sequence_parallel: bool = False, module: nn.Module | None = None) -> str:
    """The code a user runs on every rank (``torchrun --nproc-per-node <degree>``)."""
    specs = _specs(blocks, sequence_parallel, module)
    lines = [f"    {name!r}: {_code(cls, kwargs)}," for name, (cls, kwargs) in specs.items()]
    styles = sorted({cls for cls, _ in specs.values()})
    return "\n".join([
        "from torch.distributed.device_mesh import init_device_mesh",
        *(["from torch.distributed.tensor import Replicate, Shard"] if sequence_parallel else []),
        "from torch.distributed.tensor.parallel import (",
        f"    {', '.join(styles)}, parallelize_module)",
        "",
        f'mesh = init_device_mesh("{device_type}", ({degree},), mesh_dim_names=("tp",))',
        "parallelize_module(model, mesh, {", *lines, "})",
    ])


def describe_plan(blocks: Sequence[TPBlockLike], degree: int, *, module: nn.Module | None = None,
                  device_type: str = "cuda", sequence_parallel: bool = False) -> dict[str, Any]:
    """JSON-able description for the report: the plan over the :func:`emittable` blocks, the
    mesh, per-block local heads, why other blocks run unsplit, the attributes
    :func:`apply_tensor_parallel` would divide (with ``module``), the code snippet and what the
    engine allows for 2-D. Raises like :func:`check_degree` when heads do not divide."""
    blocks, unsplit = emittable(blocks)
    if not blocks and unsplit:
        raise GraphoptError("no block can be split by parallelize_module: "
                            + "; ".join(unsplit[:3]), "run the model unsplit or pipelined")
    check_degree(blocks, degree)
    rows = []
    for b in blocks:
        row: dict[str, Any] = {"kind": b.kind, "column": list(b.column_modules),
                               "row": list(b.row_modules)}
        if b.kind == "attention":
            kv = b.kv_heads or b.heads
            row.update(module=attention_module(b), heads=b.heads, kv_heads=kv,
                       local_heads=(b.heads or 0) // degree, local_kv_heads=(kv or 0) // degree)
        rows.append(row)
    out: dict[str, Any] = {
        "engine": "torch.distributed.tensor.parallel.parallelize_module",
        "degree": degree, "mesh_shape": [degree], "mesh_dim_names": ["tp"],
        "sequence_parallel": sequence_parallel,
        "plan": {name: cls for name, (cls, _) in _specs(blocks, sequence_parallel,
                                                          module).items()},
        "blocks": rows, "unsplit": unsplit,
        "code": plan_snippet(blocks, degree, device_type, sequence_parallel=sequence_parallel,
                             module=module),
        "two_d": two_d_support(),
    }
    if module is not None:
        _check_linears(module, blocks, degree)
        out["head_attributes"] = {where: {k: list(v) for k, v in attrs.items()}
                                  for where, attrs in head_attributes(module, blocks,
                                                                      degree).items()}
    return out


def two_d_support() -> dict[str, Any]:
    """What torch's engine allows for tensor parallelism inside a group with pipeline stages
    across groups, and why graphopt does not emit it from its pipeline stages.

    torch allows it on a 2-D mesh ``init_device_mesh(dev, (pp, tp), mesh_dim_names=("pp",
    "tp"))``: each rank keeps its stage as an ``nn.Module`` (the model with other stages'
    layers removed, as torchtitan does), calls ``parallelize_module(stage, mesh["tp"], plan)``,
    and wraps it in ``PipelineStage(stage, i, n, device, group=mesh["pp"].get_group())``.

    graphopt's pipeline stages (:mod:`graphopt.partition.pipeline_stages`) are fx
    ``GraphModule`` parts cut from ``torch.export``'s graph, where every Linear is an
    ``aten.linear`` call on a parameter: no ``nn.Linear`` submodule is left for
    ``ColwiseParallel``/``RowwiseParallel`` to take, and the parts cut at fx nodes, not at
    module boundaries (``parallelize_module`` on such a part raises ``NotImplementedError``,
    torch 2.13). The other order fails too: ``torch.export`` of a parallelized module rejects
    the DTensor parameters (``DTensorSpec`` is not an fx-graphable type, torch 2.13).
    Combining the two needs module-level stages, which graphopt does not build yet.
    """
    return {
        "torch_allows": True,
        "emitted": False,
        "statement": (
            "2-D parallelism (tensor parallel within a group, pipeline stages across groups) "
            "runs in torch on a 2-D DeviceMesh (pp, tp): parallelize_module(stage, "
            "mesh['tp'], plan) on each stage's nn.Module, then PipelineStage(..., "
            "group=mesh['pp'].get_group()). graphopt does not emit it: its pipeline stages "
            "are fx graphs cut from torch.export, where Linear layers are aten.linear calls "
            "on parameters, so parallelize_module finds no nn.Linear to split; exporting an "
            "already parallelized model fails on its DTensor parameters (torch 2.13). Only "
            "the 1-D tensor-parallel plan and the pipeline stages are emitted, separately."),
        "recipe": "\n".join([
            'mesh = init_device_mesh("cuda", (pp, tp), mesh_dim_names=("pp", "tp"))',
            "stage = model_with_only_this_stages_layers  # nn.Module, not an fx cut",
            'parallelize_module(stage, mesh["tp"], plan)',
            "PipelineStage(stage, stage_index, pp, device, "
            'group=mesh["pp"].get_group())',
        ]),
    }
