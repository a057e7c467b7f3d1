"""Each node's share of a tensor-parallel split and its cost on each device (cases 1-3 and 8
of :mod:`.tensor_parallel`).

Why apart from the clock: which node runs how much of itself, on which tensors and parameters,
is decided here once; :mod:`.tensor_parallel` only runs the segments and collectives over it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from graphopt.analysis.kernel_class import KernelClass
from graphopt.analysis.record import NodeAnalysis
from graphopt.cost import estimate
from graphopt.cost.roofline import cost_key
from graphopt.ir.plan import NodePlan, Plan
from graphopt.partition.devices import DeviceSet
from graphopt.partition.plan_flow import weight_of
from graphopt.partition.tp_blocks import LM_HEAD, TPBlock
from graphopt.partition.tp_roles import Role, Share

__all__ = ["Shares", "cost_on_each", "split_analysis", "split_nodes", "split_tokens"]

#: outside the blocks, classes that keep a head-sharded input sharded (case 2)
_TAIL = frozenset({KernelClass.VIEW, KernelClass.DATA_MOVEMENT, KernelClass.ELEMENTWISE})
#: replicated classes that work per token, so split by tokens under sequence parallelism
_SEQ = frozenset({KernelClass.RMSNORM, KernelClass.NORM, KernelClass.ELEMENTWISE,
                  KernelClass.VIEW})
_NORMS = frozenset({KernelClass.RMSNORM, KernelClass.NORM})


def split_analysis(n: NodePlan, role: Role, degree: int, sharded_in: int,
                   block: TPBlock | None = None) -> NodeAnalysis:
    """The analysis of ``n``'s share on one of ``degree`` devices (case 1).

    ``role``: :attr:`Role.COLUMN`, :attr:`Role.ROW`, :attr:`Role.INNER` (any other node of a
    block, or a sharded tail) or :attr:`Role.TOKENS` (case 8: 1/t of the tokens, parameters
    whole); the plain values ("column", ...) work too;
    ``sharded_in``: bytes of ``n``'s inputs that arrive split by ``degree`` (its sharded
    activations, and the weight of a column or row GEMM).
    """
    a, t = n.analysis, degree
    dims = dict(a.dims)
    if role == Role.COLUMN:
        dims["N"] = max(1, int(dims.get("N", 1)) // t)
    elif role == Role.ROW:
        dims["K"] = max(1, int(dims.get("K", 1)) // t)
    elif role == Role.TOKENS:
        for key in ("numel", "rows"):
            if key in dims and dims[key] % t == 0:
                dims[key] //= t
    else:
        for key in ("heads", "numel"):
            if key in dims and dims[key] % t == 0:
                dims[key] //= t
        if block is not None and dims.get("cols") == block.inner and block.inner % t == 0:
            dims["cols"] //= t
    read = max(0, a.bytes_read - round(sharded_in * (1 - 1 / t)))
    written = a.bytes_written if role == Role.ROW else math.ceil(a.bytes_written / t)
    params = a.param_count
    if role in (Role.COLUMN, Role.INNER):
        params = math.ceil(params / t)
    elif role == Role.ROW:
        w = weight_of(n)
        wn = w.numel if w is not None else 0
        params = params - wn + math.ceil(wn / t)
    return replace(a, dims=dims, flops=math.ceil(a.flops / t), bytes_read=read,
                   bytes_written=written, param_count=params)


@dataclass
class Shares:
    """Each node's share (cases 1-3 and 8) and its cost on each device at that share."""

    role: dict[int, tuple[Role, TPBlock | None]]  # split nodes; the rest run replicated
    sharded: set[int]  # head-sharded tensors
    split_params: set[int]  # parameters held 1/t per device
    cost: list[list[float]]  # device -> node -> seconds
    tails: int = 0  # case 2's nodes
    seq_nodes: set[int] = field(default_factory=set)  # case 8: token-split nodes
    seq_t: set[int] = field(default_factory=set)  # token-sharded tensors
    scatter: set[int] = field(default_factory=set)  # row GEMMs that end in a reduce-scatter

    def share(self, v: int) -> Share:
        """Node ``v``'s share, for its ``device`` decision."""
        if v in self.seq_nodes:
            return Share.TOKENS
        return Share.SPLIT if v in self.role else Share.REPLICATED


def split_nodes(plan: Plan, pb: Any, blocks: list[TPBlock], devices: DeviceSet,
                 index: Mapping[str, int], memo: dict[tuple[Any, ...], float]) -> Shares:
    """Cases 1-3: each node's role and its cost on each device; which tensors and parameters
    are split."""
    t = len(devices.devices)
    role: dict[int, tuple[Role, TPBlock | None]] = {}
    for b in blocks:
        for name in b.nodes:
            role[index[name]] = (Role.INNER, b)
        for name in b.column:
            role[index[name]] = (Role.COLUMN, b)
        for name in b.row:
            role[index[name]] = (Role.ROW, b)
    sharded = {pb.t_names.index(x) for b in blocks for x in b.kv_inputs} if any(
        b.kv_inputs for b in blocks) else set()
    whole_params: set[int] = set()
    # case 3: the plan's own costs where replicated
    sh = Shares(role, sharded, set(), [list(row) for row in pb.cost])
    for v, n in enumerate(plan.nodes):
        r, b = role.get(v, (None, None))
        ins = pb.node_inputs[v]
        if r is None and ins and all(x in sharded for x in ins) \
                and n.analysis.kernel_class in _TAIL:
            r, sh.tails = Role.INNER, sh.tails + 1  # case 2
        if r is None:
            whole_params.update(pb.node_params[v])
            continue
        sharded_in = sum(pb.t_bytes[x] for x in ins if x in sharded)
        if r in (Role.COLUMN, Role.ROW):
            w = _weight_index(pb, v, n)
            owned = [p for p in pb.node_params[v] if r == Role.COLUMN or p == w]
            sh.split_params.update(owned)
            whole_params.update(p for p in pb.node_params[v] if p not in owned)
            sharded_in += sum(pb.p_bytes[p] for p in owned)
        else:
            sh.split_params.update(pb.node_params[v])
            sharded_in += sum(pb.p_bytes[p] for p in pb.node_params[v])
        if r != Role.ROW and (b is None or b.kind != LM_HEAD):  # the head's logits: gathered
            sharded.update(pb.node_outputs[v])
        cost_on_each(split_analysis(n, r, t, sharded_in, b), v, devices, sh.cost, memo)
        role[v] = (r, b)
    sh.split_params -= whole_params  # a tied weight also read whole stays whole
    return sh


def split_tokens(plan: Plan, pb: Any, sh: Shares, blocks: list[TPBlock],
                  rows: Mapping[int, TPBlock], devices: DeviceSet,
                  memo: dict[tuple[Any, ...], float]) -> None:
    """Case 8: the token-split nodes, their cost, and the row GEMMs whose all-reduce becomes a
    reduce-scatter (read only by token-split nodes, returning nothing)."""
    t = len(devices.devices)
    sh.seq_nodes = _sequence_nodes(plan, pb, sh.role, sh.sharded, blocks, t)
    for v in rows:
        outs = pb.node_outputs[v]
        if outs and all(c in sh.seq_nodes for x in outs for c in pb.t_consumers[x]) \
                and not any(pb.t_output[x] for x in outs):
            sh.scatter.add(v)
            sh.seq_t.update(outs)
    for v in sorted(sh.seq_nodes):
        n = plan.nodes[v]
        sa = split_analysis(n, Role.TOKENS, t, sum(pb.t_bytes[x] for x in pb.node_inputs[v]))
        cost_on_each(sa, v, devices, sh.cost, memo)
        sh.seq_t.update(pb.node_outputs[v])


def _sequence_nodes(plan: Plan, pb: Any, role: Mapping[int, Any], sharded: set[int],
                    blocks: list[TPBlock], t: int) -> set[int]:
    """Case 8: replicated per-token nodes whose every activation is (tokens, hidden) or a
    per-token statistic (tokens, 1) inside a norm, tokens divisible by ``t``, reading no
    head-sharded tensor."""
    hiddens = {b.hidden for b in blocks}
    if len(hiddens) != 1:
        return set()
    hidden = hiddens.pop()
    out = set()
    for v, n in enumerate(plan.nodes):
        if v in role or n.analysis.kernel_class not in _SEQ \
                or any(x in sharded for x in pb.node_inputs[v]):
            continue
        infos = [x for x in (*n.inputs, *n.outputs)
                 if x is not None and x.kind not in ("param", "constant")]
        # (tokens, hidden) activations, or per-token statistics (tokens, 1) inside a norm
        widths = (hidden, 1) if n.analysis.kernel_class in _NORMS else (hidden,)
        tokens = {x.numel // x.shape[-1] if x.is_static and x.shape and x.shape[-1] in widths
                  else 0 for x in infos}
        if infos and len(tokens) == 1 and (k := tokens.pop()) >= t and k % t == 0:
            out.add(v)
    return out


def cost_on_each(sa: NodeAnalysis, v: int, devices: DeviceSet, cost: list[list[float]],
                  memo: dict[tuple[Any, ...], float]) -> None:
    """Node ``v``'s time on every device of the group at the split work ``sa`` (a repeated
    layer's split is estimated once per device profile)."""
    key = cost_key(sa)
    for d, dev in enumerate(devices.devices):
        k = (id(dev.profile), *key)
        if k not in memo:
            memo[k] = estimate(sa, dev.profile).est_time_s
        cost[d][v] = memo[k]


def _weight_index(pb: Any, v: int, n: NodePlan) -> int | None:
    """The id of GEMM ``n``'s weight (:func:`.plan_flow.weight_of`) among node ``v``'s
    parameters."""
    w = weight_of(n)
    return None if w is None else next(
        (p for p in pb.node_params[v] if pb.p_names[p] == w.name), None)
