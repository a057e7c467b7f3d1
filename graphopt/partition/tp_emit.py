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
   torchtitan's Llama plan (:mod:`.tp_sequence`), found from the blocks and the module's
   structure (the transformers model, a module wrapping it, or a plain module of the same
   shape), or why not.
6. The vocabulary-parallel LM head (an ``"lm_head"`` block, when the cost model found it
   worth its all-gather): ``ColwiseParallel(output_layouts=Replicate())``, so each device
   computes ``vocab / t`` logits and the caller gets all of them (:mod:`.tp_styles`).

The user's model is never changed: :func:`apply_tensor_parallel` parallelizes a deep copy.
``parallelize_module`` replaces the parameters of the modules it splits, and its ``Replicate``
placement broadcasts rank 0's values into the source tensor in place (torch 2.13,
``placement_types._make_replicate_tensor``), so weights shared with the user's model would be
overwritten.

2-D (tensor parallelism in a group, pipeline stages across groups): see
:func:`two_d_support`.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from torch import nn

from graphopt.errors import GraphoptError
from graphopt.partition.tp_roles import BlockKind
from graphopt.partition.tp_sequence import (
    SPLayout,
    guard_tokens,
    sequence_parallel_layout,
    sequence_parallel_specs,
    sequence_parallel_support,
)
from graphopt.partition.tp_styles import (
    LM_HEAD,
    Specs,
    TPBlockLike,
    attention_module,
    build_styles,
    check_degree,
    check_linears,
    emittable,
    style_code,
    style_imports,
    style_specs,
    submodule,
)

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


def parallelize_plan(blocks: Sequence[TPBlockLike], *, degree: int | None = None,
                     sequence_parallel: bool = False, module: nn.Module | None = None
                     ) -> dict[str, ParallelStyle]:
    """The ``parallelize_module`` plan: module FQN -> ``ColwiseParallel`` / ``RowwiseParallel``
    (cases 1, 2), or with ``sequence_parallel`` the Megatron-SP plan for ``module``
    (:func:`sequence_parallel_specs`). With ``degree`` the blocks are checked first
    (:func:`check_degree`); a block that is not :func:`emittable` raises."""
    if degree is not None:
        check_degree(blocks, degree)
    return build_styles(_specs(blocks, sequence_parallel, module))


def _specs(blocks: Sequence[TPBlockLike], sequence_parallel: bool, module: nn.Module | None
           ) -> Specs:
    if not sequence_parallel:
        return style_specs(blocks)
    if module is None:
        raise GraphoptError("the sequence-parallel plan needs the model to find its norms and "
                            "LM head", "pass module=<the nn.Module>")
    return sequence_parallel_specs(blocks, module)


def head_attributes(module: nn.Module, blocks: Sequence[TPBlockLike], degree: int
                    ) -> dict[str, dict[str, tuple[int, int]]]:
    """Int head-count attributes of each attention module to divide by ``degree`` (case 4):
    ``{attention FQN: {attribute: (global, local)}}``; empty for ``view(..., -1, head_dim)``
    modules. Matched by name and value, so ``num_key_value_groups`` is never touched."""
    out: dict[str, dict[str, tuple[int, int]]] = {}
    for b in blocks:
        if b.kind != BlockKind.ATTENTION or not b.heads:
            continue
        where = attention_module(b)
        attn = submodule(module, where)
        q = submodule(module, b.column_modules[0])
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
    check_linears(module, blocks, degree)
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
        guard_tokens(copied.get_submodule(layout.layers[0].fqn), degree, layout.layer_call)
    parallelize_module(copied, mesh, plan)
    logger.info("tensor parallel over %d devices: %d Linears split in %d blocks", degree,
                len(plan), len(blocks))
    return copied


def plan_snippet(blocks: Sequence[TPBlockLike], degree: int, device_type: str = "cuda", *,
                 sequence_parallel: bool = False, module: nn.Module | None = None) -> str:
    """The code a user runs on every rank (``torchrun --nproc-per-node <degree>``)."""
    specs = _specs(blocks, sequence_parallel, module)
    lines = [f"    {name!r}: {style_code(cls, kwargs)}," for name, (cls, kwargs) in specs.items()]
    styles = sorted({cls for cls, _ in specs.values()})
    layouts = [x for x in ("Replicate", "Shard") if any(f"{x}(" in line for line in lines)]
    return "\n".join([
        "from torch.distributed.device_mesh import init_device_mesh",
        *([f"from torch.distributed.tensor import {', '.join(layouts)}"] if layouts else []),
        *style_imports(styles),
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
    blocks, unsplit = emittable(blocks, module)
    if not blocks and unsplit:
        raise GraphoptError("no block can be split by parallelize_module: "
                            + "; ".join(unsplit[:3]), "run the model unsplit or pipelined")
    check_degree(blocks, degree)
    rows = []
    for b in blocks:
        row: dict[str, Any] = {"kind": str(b.kind), "column": list(b.column_modules),
                               "row": list(b.row_modules)}
        if b.kind == BlockKind.ATTENTION:
            kv = b.kv_heads or b.heads
            row.update(module=attention_module(b), heads=b.heads, kv_heads=kv,
                       local_heads=(b.heads or 0) // degree, local_kv_heads=(kv or 0) // degree)
        elif b.kind == LM_HEAD:
            row["gather"] = f"all-gather of the logits: 1/{degree} of the vocabulary per device"
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
        check_linears(module, blocks, degree)
        out["head_attributes"] = {where: {k: list(v) for k, v in attrs.items()}
                                  for where, attrs in head_attributes(module, blocks,
                                                                      degree).items()}
    return out


def two_d_support() -> dict[str, Any]:
    """What torch's engine allows for tensor parallelism inside a group with pipeline stages
    across groups, and where graphopt emits it.

    torch allows it on a 2-D mesh ``init_device_mesh(dev, (pp, tp), mesh_dim_names=("pp",
    "tp"))``: each rank keeps its stage as an ``nn.Module`` (the model's own layers of that
    stage, as torchtitan does), calls ``parallelize_module(stage, mesh["tp"], plan)``, and wraps
    it in ``PipelineStage(stage, i, n, device, group=mesh["pp"].get_group())``.

    graphopt emits it with module-level stages (:mod:`.two_d_emit`: cuts on decoder-layer
    boundaries, ``apply_two_d`` and the code) for Llama-layout decoders (transformers' Llama,
    Mistral and Qwen2, possibly wrapped), not from its fx pipeline stages
    (:mod:`graphopt.partition.pipeline_stages`): those are ``GraphModule`` parts cut from
    ``torch.export``'s graph, where every Linear is an ``aten.linear`` call on a parameter, so
    no ``nn.Linear`` is left for ``ColwiseParallel``/``RowwiseParallel``, and exporting a
    parallelized module rejects its DTensor parameters (torch 2.13).
    """
    return {
        "torch_allows": True,
        "emitted": True,
        "emitter": "graphopt.partition.two_d_emit",
        "models": "Llama-layout decoders: transformers' LlamaModel, MistralModel, Qwen2Model "
                  "and their *ForCausalLM, possibly wrapped by modules without parameters",
        "statement": (
            "2-D parallelism (tensor parallel within a group, pipeline stages across groups) "
            "is emitted for Llama-layout decoders (transformers' Llama, Mistral, Qwen2, "
            "possibly wrapped): stages cut on decoder-layer boundaries (the embedding with the "
            "first, the norm and LM head with the last), each stage a deep copy of its "
            "modules with the cost model's parallelize_module plan on mesh['tp'], wrapped in "
            "PipelineStage(..., group=mesh['pp'].get_group()) and run by ScheduleGPipe "
            "(graphopt.partition.two_d_emit.apply_two_d). Other models get the 2-D split "
            "costed, not emitted: graphopt's fx pipeline stages leave no nn.Linear for "
            "parallelize_module."),
        "recipe": "\n".join([
            'mesh = init_device_mesh("cuda", (pp, tp), mesh_dim_names=("pp", "tp"))',
            "run = apply_two_d(model, two_d_result, mesh)  # graphopt.partition.two_d_emit",
            "logits = run.run(input_ids)  # on the last stage; None on the others",
        ]),
    }
