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

from graphopt.cost import estimate
from graphopt.hardware.profile import Link
from graphopt.ir.plan import Plan
from graphopt.partition.assemble import human_bytes, human_s
from graphopt.partition.collectives import group_link, ring_allreduce_s, ring_half_s
from graphopt.partition.devices import DeviceSet
from graphopt.partition.parse import parse_devices
from graphopt.partition.problem import build_problem, live_profile
from graphopt.partition.result import ScheduledNode
from graphopt.partition.tp_blocks import LM_HEAD, TPBlock, find_tp_blocks, splittable
from graphopt.partition.tp_result import BlockSplit, Collective, TensorParallel
from graphopt.partition.tp_roles import CollectiveKind, Role
from graphopt.partition.tp_shares import Shares, split_analysis, split_nodes, split_tokens

__all__ = ["BlockSplit", "Collective", "TensorParallel", "split_analysis", "tensor_parallel"]

logger = logging.getLogger(__name__)


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
    if not isinstance(devices, DeviceSet):  # a --devices string, or a list of items

        devices = parse_devices(devices)
    t = len(devices.devices)
    if blocks is None:
        blocks, fallbacks = find_tp_blocks(plan, t, source=source)
    else:
        blocks, fallbacks = splittable(blocks, t)
    pb = build_problem(plan, devices)
    link = group_link(devices)
    index = {name: i for i, name in enumerate(pb.names)}
    blocks, lost = _worth_a_gather(plan, pb, blocks, devices, link, index)
    fallbacks = [*fallbacks, *lost]
    memo: dict[tuple[Any, ...], float] = {}
    sh = split_nodes(plan, pb, blocks, devices, index, memo)
    rows = {index[x]: b for b in blocks for x in b.row}
    gathers = {index[b.column[0]] for b in blocks if b.kind == LM_HEAD}  # case 9
    if sequence_parallel and t > 1:
        split_tokens(plan, pb, sh, blocks, rows, devices, memo)
    clock = _Clock(pb, [d.name for d in devices.devices], link)
    clock.run(sh, rows, gathers, _reasons(plan, sh, t))
    result = _result(pb, devices, link, blocks, index, sh, clock, fallbacks,
                     sequence_parallel)
    logger.info("tensor parallel x%d: %d blocks split, %d unsplit; makespan %s (%s of "
                "all-reduce); %s per device%s", t, len(result.splits), len(fallbacks),
                human_s(result.makespan_s), human_s(clock.comm),
                human_bytes(max(result.memory_used.values(), default=0)),
                f"; over: {result.overflow_text()}" if result.over else "")
    return result


class _Clock:
    """Cases 4/5: the segments between collectives; a segment ends when its slowest device
    does, then the collective runs on the group's link."""

    def __init__(self, pb: Any, names: list[str], link: Link | None) -> None:
        self.pb, self.names, self.link, self.t = pb, names, link, len(names)
        self.seg_start = 0.0
        self.seg = [0.0] * self.t
        self.schedule: list[ScheduledNode] = []
        self.collectives: list[Collective] = []
        self.comm = 0.0
        self.gathered: set[int] = set()

    def flush(self, kind: CollectiveKind, after: int, nbytes: int) -> None:
        """End the segment with a collective of ``nbytes`` after node ``after``."""
        start = self.seg_start + max(self.seg)
        half = kind != CollectiveKind.ALL_REDUCE
        t, link = self.t, self.link
        c = 0.0 if link is None else (ring_half_s if half else ring_allreduce_s)(nbytes, t, link)
        self.collectives.append(Collective(kind, self.pb.names[after], nbytes, start, start + c))
        self.comm += c
        self.seg_start, self.seg = start + c, [0.0] * t

    def run(self, sh: Shares, rows: Mapping[int, TPBlock], gathers: set[int],
            reasons: list[str]) -> None:
        """Every node on every device in plan order, with the collectives after them."""
        pb, t = self.pb, self.t
        for v in range(pb.n):
            if v not in sh.seq_nodes:  # case 8: gather token-sharded inputs first
                for x in pb.node_inputs[v]:
                    if x in sh.seq_t and x not in self.gathered:
                        self.gathered.add(x)
                        self.flush(CollectiveKind.ALL_GATHER, pb.t_producer[x], pb.t_bytes[x])
            share = sh.share(v)
            for d in range(t):
                s = self.seg_start + self.seg[d]
                self.seg[d] += sh.cost[d][v]
                self.schedule.append(ScheduledNode(pb.names[v], self.names[d], s,
                                                   self.seg_start + self.seg[d], reasons[v],
                                                   share))
            if v in rows and t > 1:
                self.flush(CollectiveKind.REDUCE_SCATTER if v in sh.scatter
                           else CollectiveKind.ALL_REDUCE, v,
                           sum(pb.t_bytes[x] for x in pb.node_outputs[v]))
            elif v in gathers and t > 1:
                self.flush(CollectiveKind.ALL_GATHER, v,
                           sum(pb.t_bytes[x] for x in pb.node_outputs[v]))
        for x in sorted(x for x in sh.seq_t if pb.t_output[x] and x not in self.gathered):
            self.gathered.add(x)  # a returned token-sharded tensor is gathered at the end
            self.flush(CollectiveKind.ALL_GATHER, pb.t_producer[x], pb.t_bytes[x])

    @property
    def makespan(self) -> float:
        return self.seg_start + max(self.seg, default=0.0)


def _result(pb: Any, devices: DeviceSet, link: Link | None, blocks: list[TPBlock],
            index: Mapping[str, int], sh: Shares, clock: _Clock, fallbacks: list[str],
            sequence_parallel: bool) -> TensorParallel:
    """The result, with case 7's memory per device."""
    t, names, cost = len(devices.devices), clock.names, sh.cost
    makespan, comm = clock.makespan, clock.comm
    compute = makespan - comm
    split_t = sh.sharded | {x for v in sh.seq_nodes for x in pb.node_outputs[v]}
    scaled = tuple(math.ceil(nb / t) if x in split_t and x not in clock.gathered else nb
                   for x, nb in enumerate(pb.t_bytes))
    acts = max(live_profile(replace(pb, t_bytes=scaled)), default=0)
    pbytes = sum(math.ceil(nb / t) if p in sh.split_params else nb
                 for p, nb in enumerate(pb.p_bytes))
    gemm = any(pb.node_gemm)
    memory = {name: pbytes + acts + (pb.workspace[d] if gemm else 0)
              for d, name in enumerate(names)}
    busy = {name: sum(cost[d]) for d, name in enumerate(names)}
    splits = tuple(_block_split(b, t, index, cost, pb, link) for b in blocks)
    return TensorParallel(
        degree=t, devices=devices, link=link, makespan_s=makespan, compute_s=compute,
        throughput_per_s=1 / makespan if makespan > 0 else 0.0,
        throughput_overlapped_per_s=(1 / max(compute, comm) if max(compute, comm) > 0
                                     else 0.0),
        memory_used=memory, params=dict.fromkeys(names, pbytes),
        activations=dict.fromkeys(names, acts), busy_s=busy,
        collective_s=dict.fromkeys(names, comm), splits=splits, fallbacks=tuple(fallbacks),
        collectives=tuple(clock.collectives), schedule=tuple(clock.schedule),
        notes=_notes(pb, sh, clock, sequence_parallel))


def _notes(pb: Any, sh: Shares, clock: _Clock, sequence_parallel: bool) -> dict[str, Any]:
    """The result's notes: what runs replicated, and how the clock is modelled."""
    return {"replicated": "nodes outside the split blocks (embeddings, norms, residual adds, "
                          "blocks that do not divide, an LM head not worth its all-gather) "
                          "run whole on every device",
            "replicated_nodes": sum(1 for v in range(pb.n) if v not in sh.role),
            "replicated_s": max(sum(row[v] for v in range(pb.n) if v not in sh.role)
                                for row in sh.cost),
            "sharded_tails": sh.tails,
            "sequence_parallel": {"enabled": sequence_parallel, "nodes": len(sh.seq_nodes),
                                  "reduce_scatters": len(sh.scatter),
                                  "all_gathers": len(clock.gathered)},
            "collective_model": "ring all-reduce after each row GEMM (all-gather after a "
                                "vocabulary-split LM head) over the group's slowest link, "
                                "on the critical path",
            "throughput_is": "back to back: 1/makespan; overlapped: 1/max(compute, "
                             "collectives) with two micro-batches in flight"}


def _reasons(plan: Plan, sh: Shares, t: int) -> list[str]:
    """Each node's reason text (the decision's share is :meth:`Shares.share`, not this)."""
    out = []
    for v in range(len(plan.nodes)):
        r, b = sh.role.get(v, (None, None))
        if v in sh.seq_nodes:
            out.append(f"1/{t} of the tokens on each device (sequence parallel)")
        elif r is None:
            out.append(f"replicated on all {t} devices (outside the split blocks)")
        elif b is None:
            out.append(f"1/{t} on each device: reads only head-sharded tensors")
        elif r == Role.COLUMN and b.kind == LM_HEAD:
            out.append(f"column split of {b.name}: 1/{t} of {b.dims_text()['column']}, then "
                       "all-gather")
        elif r == Role.COLUMN:
            out.append(f"column split of {b.name}: 1/{t} of {b.dims_text()['column']}")
        elif r == Role.ROW:
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
        collective=CollectiveKind.ALL_GATHER if head else CollectiveKind.ALL_REDUCE)


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
        sa = split_analysis(plan.nodes[v], Role.COLUMN, t, owned, b)
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
