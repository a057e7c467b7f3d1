"""The plain tensor-parallel plan: which ``nn.Linear`` gets which ``ParallelStyle``, and whether
the blocks can be split at all. :mod:`.tp_emit` applies it, :mod:`.tp_sequence` builds the
sequence-parallel plan on top of it.

Block kinds (``graphopt.partition.tp_blocks.TPBlock`` and any object with the same fields):

1. ``"mlp"`` and ``"attention"``: the Megatron pairs. Column-split Linears become
   ``ColwiseParallel()`` (input replicated, weight ``Shard(0)``, the local shard out), row-split
   ones ``RowwiseParallel()`` (the local shard in, weight ``Shard(1)``, output all-reduced).
   Attention needs whole query and KV heads per device (:func:`check_degree`).
2. ``"lm_head"``: the vocabulary-parallel LM head, one column-split Linear whose logits are
   gathered at once (``ColwiseParallel(output_layouts=Replicate())``): each device computes
   ``vocab / t`` of the logits from the whole hidden state, one all-gather joins them. It has no
   row side and its vocabulary must divide by the degree.
3. Blocks whose GEMMs read a K x N weight (``weight_layout == "k_by_n"``: GPT-2's
   ``Conv1D``, its QKV fused): the same pairs with :mod:`.tp_fused_qkv`'s styles, which place
   the transposed weight and regroup the fused QKV by heads; the modules must be Conv1Ds.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import gcd
from typing import TYPE_CHECKING, Any, Protocol

from torch import nn

from graphopt.errors import GraphoptError
from graphopt.partition.tp_blocks import LM_HEAD
from graphopt.partition.tp_fused_qkv import STYLES as CONV1D_STYLES
from graphopt.partition.tp_fused_qkv import conv1d_problem, conv1d_specs, qkv_permutation
from graphopt.partition.tp_roles import BlockKind

if TYPE_CHECKING:
    from torch.distributed.tensor.parallel import ParallelStyle

__all__ = ["KINDS", "LM_HEAD", "TPBlockLike", "attention_module", "block_label", "build_styles",
           "check_degree", "check_linears", "emittable", "k_by_n", "not_emittable",
           "style_code", "style_imports", "style_specs", "submodule"]

KINDS = tuple(BlockKind)  # mlp, attention, lm_head

#: FQN -> (style class name in torch.distributed.tensor.parallel, keyword arguments)
Specs = dict[str, tuple[str, dict[str, Any]]]


class TPBlockLike(Protocol):
    """What the emitter reads from a block (``graphopt.partition.tp_blocks.TPBlock`` has it)."""

    @property
    def kind(self) -> str: ...  # a BlockKind, or its value

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


def block_label(block: TPBlockLike) -> str:
    """"<kind> block <name>" for messages."""
    first = (*block.column_modules, *block.row_modules, "?")[0]
    return f"{block.kind} block {getattr(block, 'name', None) or first}"


def k_by_n(block: TPBlockLike) -> bool:
    """Case 3: the block's GEMMs read K x N weights (a block without ``weight_layout``, as
    hand-written ones, is ``nn.Linear``)."""
    return getattr(block, "weight_layout", "linear") == "k_by_n"


def _fused_qkv(block: TPBlockLike) -> bool:
    """Case 3's fused QKV: an attention block with one K x N column projection."""
    return k_by_n(block) and block.kind == BlockKind.ATTENTION and len(block.column_modules) == 1


def not_emittable(block: TPBlockLike) -> str:
    """Why neither the plain styles nor the Conv1D ones (case 3) can split ``block`` ("" when
    one can); a block's ``note`` says why the plain ones cannot."""
    rows_needed = block.kind != LM_HEAD
    if not block.column_modules or (rows_needed and not block.row_modules):
        return ("no torch module paths (find_tp_blocks fills them when given the model as "
                "source=)")
    return "" if k_by_n(block) else str(getattr(block, "note", "") or "")


def _not_linear(module: nn.Module, block: TPBlockLike) -> str:
    if k_by_n(block):
        return conv1d_problem(module, (*block.column_modules, *block.row_modules))
    for name in (*block.column_modules, *block.row_modules):
        try:
            mod = submodule(module, name)
        except GraphoptError as e:
            return e.problem
        if not isinstance(mod, nn.Linear):
            return f"{name} is a {type(mod).__name__}, not nn.Linear"
    return ""


def emittable(blocks: Sequence[TPBlockLike], module: nn.Module | None = None
              ) -> tuple[list[TPBlockLike], list[str]]:
    """The blocks ``ColwiseParallel``/``RowwiseParallel`` (or case 3's Conv1D styles) can split,
    and why each other block runs unsplit (no module paths, the block's ``note``: a fused QKV
    in an ``nn.Linear``; with ``module``, a path that is not an ``nn.Linear``, or for case 3 not
    a Conv1D, there).
    """
    kept: list[TPBlockLike] = []
    unsplit: list[str] = []
    for b in blocks:
        why = not_emittable(b) or (_not_linear(module, b) if module is not None else "")
        if why:
            unsplit.append(f"{block_label(b)} runs unsplit: {why}")
        else:
            kept.append(b)
    return kept, unsplit


def _check_heads(b: TPBlockLike, degree: int) -> None:
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


def check_degree(blocks: Sequence[TPBlockLike], degree: int) -> None:
    """Legality of splitting ``blocks`` over ``degree`` devices; raises with the fix."""
    if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
        raise GraphoptError(f"tensor-parallel degree {degree!r} is not a positive integer",
                            "pass the number of devices in the tensor-parallel group")
    if not blocks:
        raise GraphoptError("no tensor-parallel blocks to split",
                            "find them with graphopt.partition.tp_blocks.find_tp_blocks")
    seen: set[str] = set()
    heads = 0
    for b in blocks:
        if b.kind not in KINDS:
            raise GraphoptError(f"unknown tensor-parallel block kind {b.kind!r}",
                                f"use one of {', '.join(repr(str(k)) for k in KINDS)}")
        why = not_emittable(b)
        if why:
            raise GraphoptError(f"{block_label(b)}: {why}",
                                "leave it unsplit: pass emittable(blocks)[0]")
        for name in (*b.column_modules, *b.row_modules):
            if name in seen:
                raise GraphoptError(f"module {name} is in two tensor-parallel blocks",
                                    "split each Linear once")
            seen.add(name)
        if b.kind == LM_HEAD:
            heads += 1
            if heads > 1 or len(b.column_modules) != 1 or b.row_modules:
                raise GraphoptError(f"{block_label(b)}: an LM head block is one Linear, once",
                                    "give one lm_head block with one column module")
        elif b.kind == BlockKind.ATTENTION:
            _check_heads(b, degree)


def style_specs(blocks: Sequence[TPBlockLike]) -> Specs:
    """The plan (kinds 1-3) as FQN -> (style class name, keyword arguments)."""
    from torch.distributed.tensor import Replicate

    specs: Specs = {}
    for b in blocks:
        why = not_emittable(b)
        if why:
            raise GraphoptError(f"{block_label(b)}: {why}", "leave it unsplit: pass "
                                "emittable(blocks)[0]")
        if k_by_n(b):
            fused = _fused_qkv(b)
            specs.update(conv1d_specs(
                b.kind, b.column_modules, b.row_modules, heads=b.heads or 0,
                kv_heads=b.kv_heads or 0, fused=fused,
                attention=attention_module(b) if fused else ""))
            continue
        if b.kind == LM_HEAD:
            specs[b.column_modules[0]] = ("ColwiseParallel", {"output_layouts": Replicate()})
            continue
        specs.update({name: ("ColwiseParallel", {}) for name in b.column_modules})
        specs.update({name: ("RowwiseParallel", {}) for name in b.row_modules})
    return specs


def build_styles(specs: Specs) -> dict[str, ParallelStyle]:
    """The ``parallelize_module`` plan: each spec as its ``ParallelStyle`` object (torch's, or
    case 3's from :mod:`.tp_fused_qkv`)."""
    import torch.distributed.tensor.parallel as tp_styles

    return {name: (CONV1D_STYLES.get(cls) or getattr(tp_styles, cls))(**kwargs)
            for name, (cls, kwargs) in specs.items()}


def style_imports(styles: Sequence[str]) -> list[str]:
    """The snippet's import lines for the style class names ``styles``."""
    ours = sorted(s for s in styles if s in CONV1D_STYLES)
    torch_ones = sorted(s for s in styles if s not in CONV1D_STYLES)
    return ["from torch.distributed.tensor.parallel import (",
            f"    {', '.join([*torch_ones, 'parallelize_module'])})",
            *([f"from graphopt.partition.tp_fused_qkv import {', '.join(ours)}"] if ours
              else [])]


def style_code(cls: str, kwargs: dict[str, Any]) -> str:
    """One spec as the Python a user pastes."""
    return f"{cls}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"


def submodule(root: nn.Module, fqn: str) -> nn.Module:
    """``root.get_submodule(fqn)``, or the error saying the blocks name another model."""
    try:
        return root.get_submodule(fqn)
    except AttributeError:
        raise GraphoptError(f"module {fqn!r} is not in {type(root).__name__}",
                            "give the blocks the model's own module paths "
                            "(model.named_modules())") from None


def check_linears(module: nn.Module, blocks: Sequence[TPBlockLike], degree: int) -> None:
    """Every split module is an ``nn.Linear`` (case 3: a Conv1D, its fused QKV of whole heads)
    whose split width divides by ``degree``."""
    for b in blocks:
        conv = k_by_n(b)
        for name, dim in ([(n, "nf" if conv else "out_features") for n in b.column_modules]
                          + [(n, "nx" if conv else "in_features") for n in b.row_modules]):
            lin = submodule(module, name)
            if conv and (why := conv1d_problem(module, (name,))):
                raise GraphoptError(why, "leave this block unsplit, or find the blocks on this "
                                    "model's own plan")
            if not conv and not isinstance(lin, nn.Linear):
                raise GraphoptError(
                    f"{name} is a {type(lin).__name__}, not nn.Linear; ColwiseParallel and "
                    "RowwiseParallel only split nn.Linear (and nn.Embedding)",
                    "leave this block unsplit, or mark a Conv1D block weight_layout='k_by_n' "
                    "(find_tp_blocks does)")
            size = getattr(lin, dim)
            if _fused_qkv(b) and name in b.column_modules:
                qkv_permutation(b.heads or 0, b.kv_heads or b.heads or 0, size, degree)
            if size % degree:
                raise GraphoptError(f"{name}: {dim}={size} does not divide over {degree} "
                                    "devices", f"use a degree that divides {size}")
