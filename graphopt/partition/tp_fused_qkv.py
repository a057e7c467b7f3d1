"""GPT-2's ``Conv1D`` projections split by DTensor placements on their K x N weights, and its
fused QKV regrouped so every shard holds whole heads.

transformers' ``Conv1D`` (GPT-2 and its copies: DistilGPT-2, ImageGPT, Decision Transformer)
computes ``y = x W + b`` with ``W`` of shape ``(nx, nf) = (K, N)``: ``nn.Linear``'s weight
transposed, which ``ColwiseParallel``/``RowwiseParallel`` refuse (they take ``nn.Linear`` and
``nn.Embedding`` only). The styles here are those two with the placements swapped for the
transposed weight; GPT-2's ``c_attn`` (one Conv1D for Q, K and V) is regrouped first.

Why placements, not a rewrite of each Conv1D into an ``nn.Linear``: the split model keeps the
user's modules, ``state_dict`` names and weight layouts, and the plan is a plain
``parallelize_module`` plan, so whatever applies a plan (the 1-D emitter, a pipeline stage,
the user's pasted snippet) splits GPT-2 with no rewrite step to run first.

Identities (``t`` devices, rank ``r``), the numbered cases below:

1. Column split (:class:`Conv1DColwiseParallel`): ``W = [W_0 .. W_{t-1}]`` by columns
   (``Shard(1)``) and ``b`` likewise (``Shard(0)``): ``x W_r + b_r`` is the ``r``-th column
   block of ``y``, from the replicated ``x``; no communication.
2. Row split (:class:`Conv1DRowwiseParallel`): ``W`` by rows (``Shard(0)``), ``x`` by its last
   dim: ``y = sum_r x_r W_r + b``; the sum is one all-reduce and ``b`` (replicated) is added
   once.
3. Fused QKV (:class:`FusedQKVColwiseParallel`): ``c_attn``'s columns are ``[Q | K | V]``, each
   head by head (Q ``heads * hd`` wide, K and V ``kv_heads * hd``), so a contiguous shard would
   give rank 0 queries only. With the column permutation ``P`` = ``[Q_0 K_0 V_0 | Q_1 K_1 V_1 |
   ...]`` (``Q_r``: the columns of query heads ``r h/t .. (r+1) h/t``, ``K_r``/``V_r`` those of
   KV heads ``r kv/t ..``), ``x (W P) + b P = y P``, so rank ``r``'s contiguous shard of
   ``W P`` computes ``[q_r | k_r | v_r]``: whole heads, each query head with the KV heads of
   its group. Attention is per head, and the row-split ``c_proj`` (case 2) holds the rows of
   the same heads (its input is the heads concatenated in order), so the sum over ranks is the
   unsplit output.
4. Local head counts (:class:`LocalHeads`): GPT2Attention cuts ``c_attn``'s output with
   ``split(self.split_size, dim=2)`` (transformers 5.x; 4.x also reshapes with
   ``self.num_heads``), so on the parallel model ``split_size`` and ``embed_dim`` (equal to
   ``E = heads * hd``) become ``E / t`` and ``num_heads`` (equal to ``heads``) ``heads / t``,
   matched by name and value as :func:`.tp_emit.head_attributes` does; ``head_dim`` and the
   softmax ``scaling`` stay.

Must not fire (:func:`conv1d_problem`, :func:`qkv_permutation`): a module that is not a Conv1D
(class ``Conv1D`` with its weight ``(nx, nf)``), a fused width that is not
``(heads + 2 kv_heads) * hd``, heads, KV heads or widths that do not divide by ``t``.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import (
    DeviceMesh,
    Placement,
    Replicate,
    Shard,
    distribute_module,
    distribute_tensor,
)
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel

from graphopt.errors import GraphoptError
from graphopt.partition.tp_roles import BlockKind

__all__ = ["STYLES", "Conv1DColwiseParallel", "Conv1DRowwiseParallel",
           "FusedQKVColwiseParallel", "LocalHeads", "conv1d_problem", "conv1d_specs",
           "is_conv1d", "local_head_attributes", "qkv_permutation"]

logger = logging.getLogger(__name__)

#: GPT2Attention's int attributes holding the head count and the width ``heads * head_dim``
_HEAD_NAMES = ("num_heads",)
_WIDTH_NAMES = ("split_size", "embed_dim")


def is_conv1d(module: nn.Module) -> bool:
    """A transformers ``Conv1D``: ``y = x W + b`` with ``W`` of shape ``(nx, nf)``."""
    w = getattr(module, "weight", None)
    nx, nf = getattr(module, "nx", None), getattr(module, "nf", None)
    return (type(module).__name__ == "Conv1D" and isinstance(nx, int) and isinstance(nf, int)
            and isinstance(w, torch.Tensor) and tuple(w.shape) == (nx, nf))


def qkv_permutation(heads: int, kv_heads: int, width: int, degree: int) -> list[int]:
    """Case 3's ``P``: the order ``[Q_0 K_0 V_0 | Q_1 K_1 V_1 | ...]`` of a fused ``[Q | K | V]``
    of ``width`` columns, ``degree`` groups; raises when the heads do not split evenly."""
    parts = heads + 2 * kv_heads
    if heads < 1 or kv_heads < 1 or width % parts:
        raise GraphoptError(f"a fused QKV of {width} columns is not (heads + 2 kv_heads) x "
                            f"head_dim for {heads} heads and {kv_heads} KV heads",
                            "give the attention block its heads and kv_heads")
    if heads % degree or kv_heads % degree:
        raise GraphoptError(f"{heads} heads and {kv_heads} KV heads do not both divide over "
                            f"{degree} devices (a head cannot be split)",
                            "use a tensor-parallel degree that divides both, or leave this "
                            "attention unsplit")
    hd = width // parts
    q, kv = heads // degree * hd, kv_heads // degree * hd
    k0, v0 = heads * hd, (heads + kv_heads) * hd
    order: list[int] = []
    for r in range(degree):
        order += [*range(r * q, (r + 1) * q), *range(k0 + r * kv, k0 + (r + 1) * kv),
                  *range(v0 + r * kv, v0 + (r + 1) * kv)]
    return order


def conv1d_problem(module: nn.Module, names: tuple[str, ...]) -> str:
    """Why the modules ``names`` of ``module`` are not all Conv1Ds ("" when they are)."""
    for name in names:
        try:
            mod = module.get_submodule(name)
        except AttributeError:
            return f"module {name!r} is not in {type(module).__name__}"
        if not is_conv1d(mod):
            return (f"{name} is a {type(mod).__name__}, not a transformers Conv1D (the plan "
                    "reads its weight as K x N)")
    return ""


def conv1d_specs(kind: str, column: tuple[str, ...], row: tuple[str, ...], *, heads: int = 0,
                 kv_heads: int = 0, fused: bool = False, attention: str = ""
                 ) -> dict[str, tuple[str, dict[str, Any]]]:
    """A Conv1D block's plan as FQN -> (style, keyword arguments): cases 1 and 2, and for a
    fused attention (``fused``, one column module under ``attention``) cases 3 and 4."""
    if kind == BlockKind.LM_HEAD:
        return {column[0]: ("Conv1DColwiseParallel", {"output_layouts": Replicate()})}
    specs: dict[str, tuple[str, dict[str, Any]]] = {}
    if fused:
        qkv = {"heads": heads, "kv_heads": kv_heads or heads}
        specs[attention] = ("LocalHeads", {**qkv, "qkv": column[0].removeprefix(attention + ".")})
        specs[column[0]] = ("FusedQKVColwiseParallel", qkv)
    else:
        specs.update({name: ("Conv1DColwiseParallel", {}) for name in column})
    specs.update({name: ("Conv1DRowwiseParallel", {}) for name in row})
    return specs


def _require_conv1d(module: nn.Module, style: str) -> None:
    if not is_conv1d(module):
        raise GraphoptError(f"{style} splits a transformers Conv1D (weight nx x nf), not a "
                            f"{type(module).__name__}",
                            "use ColwiseParallel/RowwiseParallel for nn.Linear")


def _distribute(module: nn.Module, mesh: DeviceMesh, placements: dict[str, Placement],
                src_data_rank: int | None, order: list[int] | None = None) -> None:
    """Each named parameter as a DTensor with its placement; ``order`` regroups the output
    columns first (case 3: the weight's dim 1, the bias's dim 0)."""
    for name, placement in placements.items():
        p = getattr(module, name, None)
        if p is None:
            continue
        data = p.detach()
        if order is not None:
            data = data.index_select(data.dim() - 1, torch.tensor(order, device=data.device))
        dist = distribute_tensor(data, mesh, [placement], src_data_rank=src_data_rank)
        module.register_parameter(name, nn.Parameter(dist, requires_grad=p.requires_grad))


class Conv1DColwiseParallel(ColwiseParallel):
    """Case 1: ``ColwiseParallel`` for a Conv1D (weight ``Shard(1)``, bias ``Shard(0)``); the
    same input and output layouts and keyword arguments."""

    def _partition_conv1d(self, name: str, module: nn.Module, mesh: DeviceMesh) -> None:
        _distribute(module, mesh, {"weight": Shard(1), "bias": Shard(0)}, self.src_data_rank)

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        _require_conv1d(module, type(self).__name__)
        return distribute_module(
            module, device_mesh, self._partition_conv1d,
            partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
            partial(self._prepare_output_fn, self.output_layouts, self.use_local_output))


class FusedQKVColwiseParallel(Conv1DColwiseParallel):
    """Case 3: a fused ``[Q | K | V]`` Conv1D regrouped per rank, then split as case 1."""

    def __init__(self, *, heads: int, kv_heads: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.heads, self.kv_heads = heads, kv_heads

    def _partition_conv1d(self, name: str, module: nn.Module, mesh: DeviceMesh) -> None:
        order = qkv_permutation(self.heads, self.kv_heads, int(module.nf), mesh.size())
        _distribute(module, mesh, {"weight": Shard(1), "bias": Shard(0)}, self.src_data_rank,
                    order)
        logger.debug("fused QKV of %d columns regrouped for %d devices", module.nf,
                     mesh.size())

    def __repr__(self) -> str:
        return f"{type(self).__name__}(heads={self.heads}, kv_heads={self.kv_heads})"


class Conv1DRowwiseParallel(RowwiseParallel):
    """Case 2: ``RowwiseParallel`` for a Conv1D (weight ``Shard(0)``, bias replicated)."""

    def _partition_conv1d(self, name: str, module: nn.Module, mesh: DeviceMesh) -> None:
        _distribute(module, mesh, {"weight": Shard(0), "bias": Replicate()}, self.src_data_rank)

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        _require_conv1d(module, type(self).__name__)
        self.desired_input_layouts = (Shard(-1),)
        return distribute_module(
            module, device_mesh, self._partition_conv1d,
            partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
            partial(self._prepare_output_fn, self.output_layouts, self.use_local_output))


def local_head_attributes(attn: nn.Module, heads: int, width: int, degree: int
                          ) -> dict[str, tuple[int, int]]:
    """Case 4: ``{attribute: (global, local)}`` for the head count and width attributes of
    ``attn`` that hold the global value; raises when one holds neither value (the block's heads
    are not this module's)."""
    want = {**dict.fromkeys(_HEAD_NAMES, heads), **dict.fromkeys(_WIDTH_NAMES, width)}
    out = {}
    for name, value in want.items():
        got = getattr(attn, name, None)
        if not isinstance(got, int) or isinstance(got, bool) or got == value // degree:
            continue  # absent, or already local (tp_emit.head_attributes divides num_heads)
        if got != value:
            raise GraphoptError(f"{type(attn).__name__}.{name} is {got}, not {value} as the "
                                "attention block says", "find the blocks on this model's plan")
        out[name] = (value, value // degree)
    return out


class LocalHeads(ParallelStyle):
    """Case 4, on the attention module: its head count and width attributes divided by the mesh
    size (``qkv``: the fused projection's path under it, whose width gives ``E``)."""

    def __init__(self, *, heads: int, kv_heads: int, qkv: str) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.qkv = heads, kv_heads, qkv

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        fused = module.get_submodule(self.qkv)
        _require_conv1d(fused, type(self).__name__)
        width = int(fused.nf) * self.heads // (self.heads + 2 * self.kv_heads)
        for name, (_, local) in local_head_attributes(module, self.heads, width,
                                                      device_mesh.size()).items():
            setattr(module, name, local)
        return module

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(heads={self.heads}, kv_heads={self.kv_heads}, "
                f"qkv={self.qkv!r})")


#: the styles of this module, by the names a plan spec uses
STYLES: dict[str, type[ParallelStyle]] = {
    cls.__name__: cls for cls in (Conv1DColwiseParallel, Conv1DRowwiseParallel,
                                  FusedQKVColwiseParallel, LocalHeads)}
