"""Tensor-parallel blocks on a plan: the Megatron column/row pairs, found from kernel classes.

Identity (Megatron-LM): for ``Y = f(X A) B`` with ``f`` elementwise, split ``A`` by columns
(``A = [A_1 .. A_t]``) and ``B`` by rows; then ``Y = sum_i f(X A_i) B_i``: each of ``t``
devices computes one term from the full ``X`` and one all-reduce sums them. Attention is the
same with ``f`` = attention over a subset of heads (heads are independent).

Cases recognized (read from the plan's dataflow, never from module names):

1. **MLP**: one or two GEMMs reading the same activation (up, or gate and up) whose outputs
   reach one GEMM (down) only through elementwise nodes (SiLU, GELU, mul) and views that keep
   the last (intermediate) dim, and down's output width is the column GEMMs' input width
   (it returns to the hidden size).
2. **Attention**: an attention unit (one ``KernelClass.ATTENTION`` node, or a decomposed
   ``attention:N`` pattern) whose q, k and v inputs come, through views, data movement, RoPE
   and elementwise nodes, from GEMMs reading one activation (separate Q, K, V or one fused
   QKV), and whose output reaches exactly one GEMM (the output projection) through views.
   Heads and head_dim come from the attention dims; KV heads from the K/V widths (GQA), or
   from a fused QKV width ``(heads + 2 kv) * head_dim``.
3. **LM head** (vocabulary-parallel): the last GEMM with a weight, outside the blocks above,
   that widens (``N > K``: hidden size to vocabulary) and whose output reaches a graph output
   through views, data movement and elementwise nodes (casts, logit soft-capping). Split by
   columns, each device computes ``N / t`` logits; an all-gather joins them right after the
   GEMM, so whatever follows runs on the whole logits. Worth it when the GEMM saves more than
   the gather costs, which :mod:`.tensor_parallel` decides.
4. **Must not fire**: a walk that reaches a norm, softmax, reduction or other GEMM-less
   source, a column GEMM or an attention output that leaves the block (read outside it or
   returned: each device holds only its heads), or widths that do not match; a final GEMM
   that narrows (a classifier) is no LM head.

Legality at a degree ``t`` (:func:`can_split`) is apart from profitability (the cost model in
:mod:`.tensor_parallel`): heads, KV heads and the split widths must divide by ``t``; a block
that does not is reported with the reason and runs unsplit.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from graphopt.analysis.kernel_class import KernelClass
from graphopt.ir.legality import Legality
from graphopt.ir.plan import NodePlan, Plan
from graphopt.partition.plan_flow import (
    GEMMS,
    PlanFlow,
    activations,
    forward_from_tensors,
    gemm_input,
    gemm_weight_layout,
    weight_of,
)
from graphopt.partition.tp_roles import BlockKind

__all__ = ["LM_HEAD", "TPBlock", "can_split", "find_tp_blocks", "parameter_fqns", "splittable"]

logger = logging.getLogger(__name__)

#: between a column GEMM and attention: reshapes, head transposes, RoPE, casts, scaling
_ATTN_PATH = frozenset({KernelClass.VIEW, KernelClass.DATA_MOVEMENT, KernelClass.ROPE,
                        KernelClass.ELEMENTWISE})
#: inside an MLP: activations and the gating product, and views that keep the feature dim
_MLP_PATH = frozenset({KernelClass.VIEW, KernelClass.ELEMENTWISE, KernelClass.SILU})
#: from attention to the output projection: the head merge
_MERGE_PATH = frozenset({KernelClass.VIEW, KernelClass.DATA_MOVEMENT})
#: from the LM head to the model's output: slices, casts, soft-capping
_OUT_PATH = frozenset({KernelClass.VIEW, KernelClass.DATA_MOVEMENT, KernelClass.ELEMENTWISE})
LM_HEAD = BlockKind.LM_HEAD


@dataclass(frozen=True, slots=True)
class TPBlock:
    """One tensor-parallel block: which GEMMs split by columns and which by rows.

    ``column_modules``/``row_modules`` are the torch module paths of those layers (their
    weight's FQN less ``.weight``) when the plan came from a torch module and the source was
    given to :func:`find_tp_blocks`; empty otherwise. ``weight_layout`` is ``"linear"``
    (weight ``N x K``, ``nn.Linear``) or ``"k_by_n"`` (``addmm``/GPT-2 ``Conv1D``).
    ``kv_inputs``: graph inputs holding the KV cache this attention reads (split by heads).
    ``note``: why an emitter cannot use plain Colwise/RowwiseParallel here ("" if it can); a
    ``k_by_n`` block's Conv1Ds are split by :mod:`.tp_fused_qkv`'s styles instead.
    """

    kind: BlockKind
    column: tuple[str, ...]
    row: tuple[str, ...]
    nodes: tuple[str, ...]
    hidden: int
    inner: int  # the split width: intermediate size, heads * head_dim, or vocabulary
    heads: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    attention: tuple[str, ...] = ()
    kv_inputs: tuple[str, ...] = ()
    fused_qkv: bool = False
    weight_layout: str = "linear"
    column_modules: tuple[str, ...] = ()
    row_modules: tuple[str, ...] = ()
    note: str = ""

    @property
    def name(self) -> str:
        """A label for reports: the kind and its row GEMM (the LM head's own GEMM)."""
        return f"{self.kind}@{(self.row or self.column)[0]}"

    def dims_text(self) -> dict[str, str]:
        """Which dims each side splits, for the report."""
        if self.kind == BlockKind.ATTENTION:
            return {"column": "N (heads)", "row": "K (heads)"}
        if self.kind == LM_HEAD:
            return {"column": "N (vocabulary)"}
        return {"column": "N (intermediate)", "row": "K (intermediate)"}


def can_split(block: TPBlock, degree: int) -> Legality:
    """Does ``block`` split evenly over ``degree`` devices."""
    if degree < 1:
        return Legality.no(f"degree {degree} is not a positive device count")
    if block.kind == BlockKind.ATTENTION:
        if block.heads % degree:
            return Legality.no(f"{block.heads} heads do not divide by degree {degree}")
        if block.kv_heads % degree:
            return Legality.no(f"{block.kv_heads} KV heads do not divide by degree {degree} "
                               "(GQA: each device needs whole KV heads)")
    elif block.inner % degree:
        what = "vocabulary" if block.kind == LM_HEAD else "intermediate size"
        return Legality.no(f"{what} {block.inner} does not divide by degree {degree}")
    return Legality.OK


def splittable(blocks: Iterable[TPBlock], degree: int) -> tuple[list[TPBlock], list[str]]:
    """(the blocks that split at ``degree``, why each other one runs unsplit)."""
    kept, reasons = [], []
    for b in blocks:
        legal = can_split(b, degree)
        if legal:
            kept.append(b)
        else:
            reasons.append(f"{b.kind} block {b.name} runs unsplit: {legal.reason}")
    return kept, reasons


def parameter_fqns(source: Any) -> dict[str, str]:
    """Placeholder (plan tensor) name -> parameter FQN, from a Graph (its ``source_model``), an
    ``ExportedProgram`` or an ``nn.Module`` (torch.export names a parameter's placeholder
    ``p_`` + its FQN with every non-identifier character as ``_``)."""
    src = getattr(source, "source_model", source)
    sig = getattr(src, "graph_signature", None)
    if sig is not None:
        return dict(sig.inputs_to_parameters)
    named = getattr(src, "named_parameters", None)
    if named is None:
        return {}
    # every name of a tied weight: export names the placeholder after one of them
    return {"p_" + re.sub(r"\W", "_", fqn): fqn for fqn, _ in named(remove_duplicate=False)}


def _attention_units(flow: PlanFlow) -> list[tuple[tuple[str, ...], list[str]]]:
    """(unit nodes, [q, k, v] input tensors) for each fused or decomposed attention."""
    groups: dict[str, list[str]] = {}
    for name, n in flow.nodes.items():
        if n.analysis.kernel_class is KernelClass.ATTENTION:
            groups.setdefault(n.analysis.pattern or name, []).append(name)
    units = []
    for members in groups.values():
        members.sort(key=flow.order.__getitem__)
        first, last = flow.nodes[members[0]], flow.nodes[members[-1]]
        if len(members) == 1:
            qkv = [t.name for t in activations(first)[:3]]
        else:  # qk = MatMul(q, k^T) ... pv = MatMul(probs, v)
            a, b = activations(first), activations(last)
            qkv = [a[0].name, a[1].name, b[1].name] if len(a) >= 2 and len(b) >= 2 else []
        if len(qkv) == 3:
            units.append((tuple(members), qkv))
    return units


def _attention_block(flow: PlanFlow, unit: tuple[str, ...], qkv: list[str]
                     ) -> tuple[TPBlock | None, str]:
    """Case 2: the block around one attention unit, or None and why not."""
    a = flow.nodes[unit[0]].analysis.dims
    heads, hd = int(a.get("heads", 0)), int(a.get("head_dim", 0))
    if heads < 1 or hd < 1:
        return None, "attention dims have no heads/head_dim"
    walks = [flow.back(t, _ATTN_PATH) for t in qkv]
    if any(w[3] for w in walks) or not all(w[0] for w in walks):
        return None, "q, k or v does not come from a GEMM through views and RoPE only"
    q_g, k_g, v_g = (w[0] for w in walks)
    columns = sorted(q_g | k_g | v_g, key=flow.order.__getitem__)
    xs = {gemm_input(flow.nodes[g]) for g in columns}
    if len(xs) != 1 or None in xs or any(weight_of(flow.nodes[g]) is None for g in columns):
        return None, "the Q/K/V GEMMs do not all read one activation with a weight"
    hidden = int(flow.nodes[columns[0]].analysis.dims.get("K", 0))
    width = sum(int(flow.nodes[g].analysis.dims.get("N", 0)) for g in columns)
    fused = len(columns) == 1
    if fused:
        rest = width // hd - heads if width % hd == 0 else -1
        kv = rest // 2 if rest > 0 and rest % 2 == 0 else 0
    else:
        if q_g & (k_g | v_g) or k_g & v_g:
            return None, "Q, K and V share some but not all GEMMs"
        nq = sum(int(flow.nodes[g].analysis.dims.get("N", 0)) for g in q_g)
        nk = sum(int(flow.nodes[g].analysis.dims.get("N", 0)) for g in k_g)
        nv = sum(int(flow.nodes[g].analysis.dims.get("N", 0)) for g in v_g)
        kv = nk // hd if nq == heads * hd and nk == nv and nk % hd == 0 else 0
    if kv < 1 or heads % kv:
        return None, f"Q/K/V widths ({width}) do not give whole KV heads for {heads}x{hd}"
    out = unit[-1]
    merge = flow.forward([out], _MERGE_PATH)
    rows = sorted({c for t in [out, *merge] for o in flow.nodes[t].outputs if o is not None
                   for c in flow.consumers.get(o.name, ()) if flow.cls(c) in GEMMS},
                  key=flow.order.__getitem__)
    if len(rows) != 1 or weight_of(flow.nodes[rows[0]]) is None:
        return None, "the attention output does not reach one projection GEMM through views"
    row = flow.nodes[rows[0]]
    if int(row.analysis.dims.get("K", 0)) != heads * hd:
        return None, f"the output projection's K {row.analysis.dims.get('K')} != heads x dim"
    if int(row.analysis.dims.get("N", 0)) != hidden:
        return None, "the output projection does not return to the hidden size"
    merge = {m for m in merge if flow.order[m] < flow.order[row.name]}
    # nodes between the column GEMMs and attention (not RoPE's shared cos/sin chain)
    path = set().union(*(w[1] for w in walks)) & flow.forward(columns, _ATTN_PATH)
    kv_inputs = sorted({t for w in walks[1:] for t in w[2] if _is_cache(flow, t, kv, hd)})
    cache_path = set().union(*(w[1] for w in walks[1:])) & forward_from_tensors(
        flow, kv_inputs, _ATTN_PATH)
    nodes = {*columns, *path, *cache_path, *unit, *merge, row.name}
    if flow.leaves_block(columns, nodes):
        return None, "a Q/K/V projection's output is read outside the attention block"
    if flow.leaves_block([*unit, *merge], nodes):  # each device would hold only its heads
        return None, "the attention's output is read outside the block or returned"
    layout = gemm_weight_layout(flow.nodes[columns[0]])
    return TPBlock(BlockKind.ATTENTION, tuple(columns), (row.name,),
                   tuple(sorted(nodes, key=flow.order.__getitem__)), hidden, heads * hd,
                   heads=heads, kv_heads=kv, head_dim=hd, attention=unit,
                   kv_inputs=tuple(kv_inputs), fused_qkv=fused, weight_layout=layout,
                   note=_note(layout, fused)), ""


def _is_cache(flow: PlanFlow, tensor: str, kv: int, hd: int) -> bool:
    """A graph input read on the K/V path whose shape holds the KV heads and head_dim."""
    for n in flow.consumers.get(tensor, ()):
        for t in flow.nodes[n].inputs:
            if t is not None and t.name == tensor and t.shape is not None:
                return len(t.shape) >= 4 and kv in t.shape and t.shape[-1] == hd
    return False


def _note(layout: str, fused: bool) -> str:
    why = []
    if fused:
        why.append("Q, K and V are one fused GEMM: a column split needs its columns regrouped "
                   "so each shard holds whole heads of q, k and v")
    if layout != "linear":
        why.append("the weight is K x N (addmm / Conv1D), not an nn.Linear: "
                   "ColwiseParallel/RowwiseParallel shard nn.Linear and nn.Embedding only "
                   "(tp_fused_qkv's styles split a Conv1D, its fused QKV regrouped by heads)")
    return "; ".join(why)


def _mlp_block(flow: PlanFlow, down: NodePlan, taken: set[str]) -> TPBlock | None:
    """Case 1: the MLP ending at GEMM ``down``, or None."""
    x = gemm_input(down)
    if x is None or weight_of(down) is None:
        return None
    gemms, passed, inputs, blocked = flow.back(x, _MLP_PATH)
    if blocked or inputs or not 1 <= len(gemms) <= 2 or gemms & taken:
        return None
    columns = sorted(gemms, key=flow.order.__getitem__)
    cnodes = [flow.nodes[g] for g in columns]
    xs = {gemm_input(n) for n in cnodes}
    if len(xs) != 1 or None in xs or any(weight_of(n) is None for n in cnodes):
        return None
    inner = {int(n.analysis.dims.get("N", 0)) for n in cnodes}
    hidden = {int(n.analysis.dims.get("K", 0)) for n in cnodes}
    d = down.analysis.dims
    if len(inner) != 1 or len(hidden) != 1 or inner != {int(d.get("K", 0))} \
            or hidden != {int(d.get("N", 0))}:
        return None
    width = inner.pop()
    for p in passed:  # the split is along the last dim: every interior tensor must keep it
        for t in flow.nodes[p].outputs:
            if t is not None and (t.shape is None or not t.shape or t.shape[-1] != width):
                return None
    nodes = {*columns, *passed, down.name}
    if flow.leaves_block([*columns, *passed], nodes):
        return None
    layout = gemm_weight_layout(cnodes[0])
    return TPBlock(BlockKind.MLP, tuple(columns), (down.name,),
                   tuple(sorted(nodes, key=flow.order.__getitem__)), hidden.pop(), width,
                   weight_layout=layout, note=_note(layout, False))


def _lm_head_block(flow: PlanFlow, taken: set[str]) -> TPBlock | None:
    """Case 3: the last widening GEMM outside the blocks whose output reaches a graph output
    through ``_OUT_PATH`` nodes, or None."""
    for name in sorted(flow.nodes, key=flow.order.__getitem__, reverse=True):
        n = flow.nodes[name]
        if name in taken or n.analysis.kernel_class not in GEMMS or weight_of(n) is None \
                or gemm_input(n) is None:
            continue
        k, width = int(n.analysis.dims.get("K", 0)), int(n.analysis.dims.get("N", 0))
        outs = [t.name for t in n.outputs if t is not None]
        after = forward_from_tensors(flow, outs, _OUT_PATH)
        tensors = {*outs, *(t.name for a in after for t in flow.nodes[a].outputs
                            if t is not None)}
        if not tensors & flow.outputs:
            continue
        if width <= k:
            return None  # the output GEMM narrows: a classifier, not an LM head
        layout = gemm_weight_layout(n)
        return TPBlock(LM_HEAD, (name,), (), (name,), k, width, weight_layout=layout,
                       note=_note(layout, False))
    return None


def _fqn(placeholder: str, fqns: Mapping[str, str]) -> str | None:
    """The FQN of a weight placeholder; a module that was traced inside a wrapper
    (``p_lm_model_layers_0_...`` for the user's ``model.layers.0...``) matches by suffix when
    exactly one of the user's parameters does."""
    if placeholder in fqns:
        return fqns[placeholder]
    hits = [fqn for key, fqn in fqns.items()
            if key.startswith("p_") and placeholder.endswith("_" + key[2:])]
    return hits[0] if len(hits) == 1 else None


def _with_modules(block: TPBlock, flow: PlanFlow, fqns: Mapping[str, str]) -> TPBlock:
    def mods(names: tuple[str, ...]) -> tuple[str, ...]:
        out = []
        for n in names:
            w = weight_of(flow.nodes[n])
            fqn = _fqn(w.name, fqns) if w is not None else None
            if fqn is None:
                return ()
            out.append(fqn.removesuffix(".weight"))
        return tuple(out)

    return replace(block, column_modules=mods(block.column), row_modules=mods(block.row))


def find_tp_blocks(plan: Plan, degree: int | None = None, *, source: Any = None
                   ) -> tuple[list[TPBlock], list[str]]:
    """The tensor-parallel blocks of ``plan`` and, at ``degree``, why each block that cannot
    split evenly falls back (those are left out of the list).

    Args:
        plan: any plan; blocks are found from kernel classes and dataflow (cases 1-3).
        degree: the tensor-parallel degree to check; None checks nothing.
        source: the traced Graph, its ExportedProgram or the nn.Module, to fill each block's
            ``column_modules``/``row_modules`` (see :func:`parameter_fqns`).
    """
    flow = PlanFlow(plan)
    blocks: list[TPBlock] = []
    skipped: list[str] = []
    for unit, qkv in _attention_units(flow):
        block, why = _attention_block(flow, unit, qkv)
        if block is None:
            skipped.append(f"attention at {unit[0]} not split: {why}")
            logger.debug("attention at %s: %s", unit[0], why)
        else:
            blocks.append(block)
    taken = {n for b in blocks for n in b.nodes}
    for n in plan.nodes:
        if n.analysis.kernel_class in GEMMS and n.name not in taken:
            block = _mlp_block(flow, n, taken)
            if block is not None:
                blocks.append(block)
                taken.update(block.nodes)
    head = _lm_head_block(flow, taken)
    if head is not None:
        blocks.append(head)
    blocks.sort(key=lambda b: flow.order[b.column[0]])
    if source is not None:
        fqns = parameter_fqns(source)
        blocks = [_with_modules(b, flow, fqns) for b in blocks]
    reasons = list(skipped)
    kept = blocks
    if degree is not None:
        kept, unsplit = splittable(blocks, degree)
        reasons += unsplit
    logger.info("tensor-parallel blocks: %d attention, %d MLP, %d LM head%s",
                sum(b.kind == BlockKind.ATTENTION for b in kept),
                sum(b.kind == BlockKind.MLP for b in kept),
                sum(b.kind == LM_HEAD for b in kept),
                f" ({len(reasons)} not split)" if reasons else "")
    return kept, reasons
