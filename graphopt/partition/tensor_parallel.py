"""Cost a tensor-parallel split of degree t over a group of devices (Megatron-style, SPMD).

Every device of the group runs every node, in plan order; what differs is how much of it.

1. **Split blocks** (:mod:`.tp_blocks`, legal at ``t``): a column GEMM computes ``N / t`` of its
   outputs from the full input (1/t of its FLOPs, weight and output bytes); a row GEMM reads
   ``K / t`` of its input and weight and writes a full-size partial sum; the nodes between
   (RoPE, attention over ``heads / t`` heads, SiLU, views) do 1/t of the work on 1/t of the
   bytes. Each is re-estimated with the roofline (:func:`graphopt.cost.estimate`) on the
   device's profile at those dims, not scaled: a GEMM with 1/t of N may run below 1/t the
   time of the whole when it gets too small for the tensor cores.
2. **Sharded tails**: a view, data-movement or elementwise node outside the blocks whose
   activation inputs are all head-sharded (stacking the new K/V entries) runs sharded too.
3. **Replicated**: every other node (embeddings, norms, residual adds, blocks that do not
   divide by ``t``) runs whole on every device, at the plan's cost there.
9. **Vocabulary-parallel LM head** (an ``"lm_head"`` block): a column GEMM at ``N / t``
   followed at once by an all-gather of its logits (:func:`.collectives.ring_half_s` of the
   whole output), so whatever reads the logits runs on all of them. Split only when the GEMM's
   saving on the slowest device exceeds the gather; otherwise it stays replicated and the
   fallbacks say by how much it lost.
4. **Collectives**: after each row GEMM, a ring all-reduce of its output
   (:func:`.collectives.ring_allreduce_s`) over the group's slowest link; it is on the
   critical path (the next norm reads the sum), so it is not overlapped with compute.
5. **Clock**: the all-reduces cut the program into segments; a segment ends when its slowest
   device does, then the all-reduce runs. The makespan is the sum over segments plus the
   all-reduces: one request's latency.
6. **Throughput** for a stream of micro-batches: every device works on every micro-batch, so
   back to back it is ``1 / makespan``; with one micro-batch's all-reduce overlapped with
   the next one's compute (two streams), at best ``1 / max(compute, collectives)``.
7. **Memory per device** = split weights / t (column GEMMs' weights and biases, row GEMMs'
   weights; a row GEMM's bias is added once after the sum and kept whole) + replicated
   parameters + one GEMM workspace + the peak of live activations in plan order
   (:func:`.problem.live_profile`) with head-sharded tensors and the KV cache at 1/t.
8. **Sequence parallelism** (``sequence_parallel=True``; Korthikanti et al. 2022, torch's
   ``SequenceParallel``): a replicated norm, elementwise or view node whose every activation is
   ``(tokens, hidden)``-shaped, with tokens divisible by t, runs on 1/t of the tokens (its
   parameters whole). A row GEMM read only by such nodes ends in a reduce-scatter instead of an
   all-reduce; a token-sharded tensor read by any other node (the next block's column GEMMs,
   the LM head) or returned is all-gathered first, once. Each half costs
   :func:`.collectives.ring_half_s`, so the traffic equals the all-reduce's while the norms and
   residual adds shrink by t. A decode step of one sequence (one token) has nothing to split.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from graphopt.analysis.kernel_class import KernelClass
from graphopt.analysis.record import NodeAnalysis
from graphopt.cost import estimate
from graphopt.cost.roofline import cost_key
from graphopt.hardware.profile import Link
from graphopt.ir.plan import NodePlan, Plan
from graphopt.partition.assemble import human_bytes, human_s
from graphopt.partition.collectives import group_link, ring_allreduce_s, ring_half_s
from graphopt.partition.devices import DeviceSet
from graphopt.partition.plan_flow import weight_of
from graphopt.partition.problem import build_problem, live_profile
from graphopt.partition.result import ScheduledNode
from graphopt.partition.tp_blocks import LM_HEAD, TPBlock, find_tp_blocks, splittable
from graphopt.partition.tp_result import BlockSplit, Collective, TensorParallel

__all__ = ["BlockSplit", "Collective", "TensorParallel", "split_analysis", "tensor_parallel"]

logger = logging.getLogger(__name__)

#: outside the blocks, classes that keep a head-sharded input sharded (case 2)
_TAIL = frozenset({KernelClass.VIEW, KernelClass.DATA_MOVEMENT, KernelClass.ELEMENTWISE})
#: replicated classes that work per token, so split by tokens under sequence parallelism
_SEQ = frozenset({KernelClass.RMSNORM, KernelClass.NORM, KernelClass.ELEMENTWISE,
                  KernelClass.VIEW})
_NORMS = frozenset({KernelClass.RMSNORM, KernelClass.NORM})


def split_analysis(n: NodePlan, role: str, degree: int, sharded_in: int,
                   block: TPBlock | None = None) -> NodeAnalysis:
    """The analysis of ``n``'s share on one of ``degree`` devices (case 1).

    ``role``: "column", "row", "inner" (any other node of a block, or a sharded tail) or
    "tokens" (case 8: 1/t of the tokens, parameters whole);
    ``sharded_in``: bytes of ``n``'s inputs that arrive split by ``degree`` (its sharded
    activations, and the weight of a column or row GEMM).
    """
    a, t = n.analysis, degree
    dims = dict(a.dims)
    if role == "column":
        dims["N"] = max(1, int(dims.get("N", 1)) // t)
    elif role == "row":
        dims["K"] = max(1, int(dims.get("K", 1)) // t)
    elif role == "tokens":
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
    written = a.bytes_written if role == "row" else math.ceil(a.bytes_written / t)
    params = a.param_count
    if role in ("column", "inner"):
        params = math.ceil(params / t)
    elif role == "row":
        w = weight_of(n)
        wn = w.numel if w is not None else 0
        params = params - wn + math.ceil(wn / t)
    return replace(a, dims=dims, flops=math.ceil(a.flops / t), bytes_read=read,
                   bytes_written=written, param_count=params)


def tensor_parallel(plan: Plan, devices: DeviceSet | str, *,
                    blocks: list[TPBlock] | None = None, source: Any = None,
                    sequence_parallel: bool = False) -> TensorParallel:
    """Cost ``plan`` split tensor-parallel over every device of ``devices`` (degree = their
    count).

    Args:
        plan: the plan (its costs are those of the unsplit nodes on the plan's target).
        devices: the group, a DeviceSet or a ``--devices`` string.
        blocks: the blocks to split (default :func:`find_tp_blocks` on ``plan``); a block
            that does not divide by the degree runs replicated, with its reason in
            ``fallbacks``.
        source: passed to :func:`find_tp_blocks` for the blocks' module paths.
        sequence_parallel: also split the replicated per-token nodes by tokens (case 8).
    """
    if isinstance(devices, str):
        from graphopt.partition.parse import parse_devices

        devices = parse_devices(devices)
    t = len(devices.devices)
    if blocks is None:
        blocks, fallbacks = find_tp_blocks(plan, t, source=source)
    else:
        blocks, fallbacks = splittable(blocks, t)
    pb = build_problem(plan, devices)
    names = [d.name for d in devices.devices]
    link = group_link(devices)
    index = {name: i for i, name in enumerate(pb.names)}
    blocks, lost = _worth_a_gather(plan, pb, blocks, devices, link, index)
    fallbacks = [*fallbacks, *lost]
    role: dict[int, tuple[str, TPBlock | None]] = {}
    for b in blocks:
        for name in b.nodes:
            role[index[name]] = ("inner", b)
        for name in b.column:
            role[index[name]] = ("column", b)
        for name in b.row:
            role[index[name]] = ("row", b)
    sharded = {pb.t_names.index(x) for b in blocks for x in b.kv_inputs} if any(
        b.kv_inputs for b in blocks) else set()
    split_params: set[int] = set()
    whole_params: set[int] = set()
    cost = [list(row) for row in pb.cost]  # case 3: the plan's own costs where replicated
    memo: dict[tuple[Any, ...], float] = {}
    tails = 0
    for v, n in enumerate(plan.nodes):
        r, b = role.get(v, (None, None))
        ins = pb.node_inputs[v]
        if r is None and ins and all(x in sharded for x in ins) \
                and n.analysis.kernel_class in _TAIL:
            r, tails = "inner", tails + 1  # case 2
        if r is None:
            whole_params.update(pb.node_params[v])
            continue
        sharded_in = sum(pb.t_bytes[x] for x in ins if x in sharded)
        if r in ("column", "row"):
            w = _weight_index(pb, v, n)
            owned = [p for p in pb.node_params[v] if r == "column" or p == w]
            split_params.update(owned)
            whole_params.update(p for p in pb.node_params[v] if p not in owned)
            sharded_in += sum(pb.p_bytes[p] for p in owned)
        else:
            split_params.update(pb.node_params[v])
            sharded_in += sum(pb.p_bytes[p] for p in pb.node_params[v])
        if r != "row" and (b is None or b.kind != LM_HEAD):  # the head's logits: gathered
            sharded.update(pb.node_outputs[v])
        _cost_on_each(split_analysis(n, r, t, sharded_in, b), v, devices, cost, memo)
        role[v] = (r, b)
    split_params -= whole_params  # a tied weight also read whole stays whole

    rows = {index[x]: b for b in blocks for x in b.row}
    gathers = {index[b.column[0]] for b in blocks if b.kind == LM_HEAD}  # case 9
    seq_nodes: set[int] = set()
    seq_t: set[int] = set()  # token-sharded tensors
    scatter: set[int] = set()  # row GEMMs that end in a reduce-scatter
    if sequence_parallel and t > 1:
        seq_nodes = _sequence_nodes(plan, pb, role, sharded, blocks, t)
        for v in rows:
            outs = pb.node_outputs[v]
            if outs and all(c in seq_nodes for x in outs for c in pb.t_consumers[x]) \
                    and not any(pb.t_output[x] for x in outs):
                scatter.add(v)
                seq_t.update(outs)
        for v in sorted(seq_nodes):
            n = plan.nodes[v]
            sa = split_analysis(n, "tokens", t, sum(pb.t_bytes[x] for x in pb.node_inputs[v]))
            _cost_on_each(sa, v, devices, cost, memo)
            seq_t.update(pb.node_outputs[v])

    # case 4/5: the clock
    seg_start = 0.0
    seg = [0.0] * t
    schedule: list[ScheduledNode] = []
    collectives: list[Collective] = []
    comm = 0.0
    reasons = _reasons(plan, role, t)
    for v in seq_nodes:
        reasons[v] = f"1/{t} of the tokens on each device (sequence parallel)"
    gathered: set[int] = set()

    def flush(kind: str, after: int, nbytes: int) -> None:
        nonlocal seg_start, seg, comm
        start = seg_start + max(seg)
        half = kind != "all-reduce"
        c = 0.0 if link is None else (ring_half_s if half else ring_allreduce_s)(nbytes, t, link)
        collectives.append(Collective(kind, pb.names[after], nbytes, start, start + c))
        comm += c
        seg_start, seg = start + c, [0.0] * t

    for v in range(pb.n):
        if v not in seq_nodes:  # case 8: gather token-sharded inputs first
            for x in pb.node_inputs[v]:
                if x in seq_t and x not in gathered:
                    gathered.add(x)
                    flush("all-gather", pb.t_producer[x], pb.t_bytes[x])
        for d in range(t):
            s = seg_start + seg[d]
            seg[d] += cost[d][v]
            schedule.append(ScheduledNode(pb.names[v], names[d], s, seg_start + seg[d],
                                          reasons[v]))
        if v in rows and t > 1:
            flush("reduce-scatter" if v in scatter else "all-reduce", v,
                  sum(pb.t_bytes[x] for x in pb.node_outputs[v]))
        elif v in gathers and t > 1:
            flush("all-gather", v, sum(pb.t_bytes[x] for x in pb.node_outputs[v]))
    for x in sorted(x for x in seq_t if pb.t_output[x] and x not in gathered):
        gathered.add(x)  # a returned token-sharded tensor is gathered at the end
        flush("all-gather", pb.t_producer[x], pb.t_bytes[x])
    makespan = seg_start + max(seg, default=0.0)
    compute = makespan - comm

    # case 7: memory
    split_t = sharded | {x for v in seq_nodes for x in pb.node_outputs[v]}
    scaled = tuple(math.ceil(nb / t) if x in split_t and x not in gathered else nb
                   for x, nb in enumerate(pb.t_bytes))
    acts = max(live_profile(replace(pb, t_bytes=scaled)), default=0)
    pbytes = sum(math.ceil(nb / t) if p in split_params else nb
                 for p, nb in enumerate(pb.p_bytes))
    gemm = any(pb.node_gemm)
    memory = {name: pbytes + acts + (pb.workspace[d] if gemm else 0)
              for d, name in enumerate(names)}
    busy = {name: sum(cost[d]) for d, name in enumerate(names)}
    splits = tuple(_block_split(b, t, index, cost, pb, link) for b in blocks)
    result = TensorParallel(
        degree=t, devices=devices, link=link, makespan_s=makespan, compute_s=compute,
        throughput_per_s=1 / makespan if makespan > 0 else 0.0,
        throughput_overlapped_per_s=(1 / max(compute, comm) if max(compute, comm) > 0
                                     else 0.0),
        memory_used=memory, params=dict.fromkeys(names, pbytes),
        activations=dict.fromkeys(names, acts), busy_s=busy,
        collective_s=dict.fromkeys(names, comm), splits=splits, fallbacks=tuple(fallbacks),
        collectives=tuple(collectives), schedule=tuple(schedule),
        notes={"replicated": "nodes outside the split blocks (embeddings, norms, residual adds, "
                             "blocks that do not divide, an LM head not worth its all-gather) "
                             "run whole on every device",
               "replicated_nodes": sum(1 for v in range(pb.n) if v not in role),
               "replicated_s": max(sum(row[v] for v in range(pb.n) if v not in role)
                                   for row in cost),
               "sharded_tails": tails,
               "sequence_parallel": {"enabled": sequence_parallel, "nodes": len(seq_nodes),
                                     "reduce_scatters": len(scatter),
                                     "all_gathers": len(gathered)},
               "collective_model": "ring all-reduce after each row GEMM (all-gather after a "
                                   "vocabulary-split LM head) over the group's slowest link, "
                                   "on the critical path",
               "throughput_is": "back to back: 1/makespan; overlapped: 1/max(compute, "
                                "collectives) with two micro-batches in flight"})
    logger.info("tensor parallel x%d: %d blocks split, %d unsplit; makespan %s (%s of "
                "all-reduce); %s per device%s", t, len(splits), len(fallbacks),
                human_s(makespan), human_s(comm), human_bytes(max(memory.values(), default=0)),
                f"; over: {result.overflow_text()}" if result.over else "")
    return result


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


def _cost_on_each(sa: NodeAnalysis, v: int, devices: DeviceSet, cost: list[list[float]],
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


def _reasons(plan: Plan, role: Mapping[int, tuple[str, TPBlock | None]], t: int) -> list[str]:
    out = []
    for v in range(len(plan.nodes)):
        r, b = role.get(v, (None, None))
        if r is None:
            out.append(f"replicated on all {t} devices (outside the split blocks)")
        elif b is None:
            out.append(f"1/{t} on each device: reads only head-sharded tensors")
        elif r == "column" and b.kind == LM_HEAD:
            out.append(f"column split of {b.name}: 1/{t} of {b.dims_text()['column']}, then "
                       "all-gather")
        elif r == "column":
            out.append(f"column split of {b.name}: 1/{t} of {b.dims_text()['column']}")
        elif r == "row":
            out.append(f"row split of {b.name}: 1/{t} of {b.dims_text()['row']}, then "
                       "all-reduce")
        else:
            out.append(f"inside {b.name}: 1/{t} of the work")
    return out


def _block_split(b: TPBlock, t: int, index: Mapping[str, int], cost: list[list[float]],
                 pb: Any, link: Link | None) -> BlockSplit:
    vs = [index[x] for x in b.nodes]
    head = b.kind == LM_HEAD
    nbytes = sum(pb.t_bytes[x] for r in (b.column if head else b.row)
                 for x in pb.node_outputs[index[r]])
    ring = ring_half_s if head else ring_allreduce_s
    return BlockSplit(
        block=b.name, kind=b.kind, degree=t, dims=b.dims_text(), column=b.column, row=b.row,
        compute_s=max(sum(row[v] for v in vs) for row in cost),
        unsplit_s=sum(pb.cost[0][v] for v in vs), allreduce_bytes=nbytes,
        allreduce_s=ring(nbytes, t, link) if link is not None and t > 1 else 0.0,
        collective="all-gather" if head else "all-reduce")


def _worth_a_gather(plan: Plan, pb: Any, blocks: list[TPBlock], devices: DeviceSet,
                    link: Link | None, index: Mapping[str, int]
                    ) -> tuple[list[TPBlock], list[str]]:
    """Case 9: keep an LM head block only when splitting its GEMM saves more on the slowest
    device than the all-gather of its logits costs; else why not."""
    t = len(devices.devices)
    kept, lost = [], []
    for b in blocks:
        if b.kind != LM_HEAD or t < 2:
            kept.append(b)
            continue
        v = index[b.column[0]]
        owned = sum(pb.p_bytes[p] for p in pb.node_params[v])  # a column GEMM's, as below
        sa = split_analysis(plan.nodes[v], "column", t, owned, b)
        split = max(estimate(sa, dev.profile).est_time_s for dev in devices.devices)
        whole = max(row[v] for row in pb.cost)
        nbytes = sum(pb.t_bytes[x] for x in pb.node_outputs[v])
        gather = ring_half_s(nbytes, t, link) if link is not None else 0.0
        if whole - split > gather:
            kept.append(b)
        else:
            lost.append(f"{b.kind} block {b.name} runs unsplit: splitting its vocabulary "
                        f"saves {human_s(max(whole - split, 0.0))}, less than the all-gather "
                        f"of its logits ({human_s(gather)})")
    return kept, lost
