"""2-D parallelism: tensor parallelism inside each NVLink group, pipeline stages across groups.

Why: NVLink is ~10x a node-to-node network, and a tensor-parallel all-reduce after every
block needs the fast link, while a pipeline sends one activation per stage boundary.

1. **Groups** (:func:`nvlink_groups`): devices joined by their peer link (NVLink), the
   connected components in device order; devices on different machines (``@HOST`` in
   ``--devices``) or without a peer link are in different groups.
2. **Stage costs**: each group's per-node time is that of :func:`.tensor_parallel.tensor_parallel`
   over the group on the whole plan (the slowest device's share), plus the collective after
   the node; a stage's time is the sum over its nodes, plus sending the cut's activations
   (every tensor produced before the cut and read after it, as :func:`.pipeline_dp.cut_bytes`)
   over the link between the two groups. Each rank of a group sends the (replicated) cut to
   its counterpart in the next group, all in parallel: one link time.
3. **Cuts** fall between blocks only (a stage keeps its attention and MLP blocks whole), and
   stages take the groups in order: the first ``m`` groups for ``m`` stages, each ``m`` tried.
   The min-max split over the allowed cuts is an exact DP (O(m M^2) with M cuts, vectorized);
   its memory bound per stage is split parameters / t + the rest + the peak live activations
   (unsplit: conservative) + one GEMM workspace.
4. **Exact check**: each chosen stage is re-costed with ``tensor_parallel`` on its own nodes
   (the cut's incoming activations are its inputs), which gives its time, collectives and
   memory per device.
5. **Clock**: one request's latency = sum of stage times + transfers; a stream of
   micro-batches runs at 1 / the slowest stage (its compute + its outgoing transfer).
6. **Run**: the micro-batch count and the schedule (:func:`pipeline_rule`).
7. **Sequence parallelism** (``sequence_parallel=True``): each stage costed with it
   (:func:`.tensor_parallel.tensor_parallel` case 8); between stages each rank sends its token
   shard, 1/t of the cut.

:func:`cost_split` runs cases 4-7 on given cuts: :mod:`.two_d_emit` moves a cut onto a module
boundary and re-costs it there.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import numpy as np

from graphopt.errors import GraphoptError
from graphopt.hardware.profile import Link
from graphopt.ir.plan import Plan
from graphopt.ir.plan_summary import TensorSpec
from graphopt.partition.assemble import human_bytes, human_s
from graphopt.partition.collectives import slowest_link
from graphopt.partition.devices import DeviceSet
from graphopt.partition.parse import parse_devices
from graphopt.partition.pipeline_dp import cut_bytes
from graphopt.partition.problem import build_problem, live_profile
from graphopt.partition.result import Transfer
from graphopt.partition.tensor_parallel import TensorParallel, tensor_parallel
from graphopt.partition.tp_blocks import find_tp_blocks, splittable
from graphopt.partition.two_d_result import Stage2D, TwoD

__all__ = ["Stage2D", "TwoD", "cost_split", "nvlink_groups", "pipeline_rule", "sub_devices",
           "two_d"]

logger = logging.getLogger(__name__)


def _peer(devices: DeviceSet, a: str, b: str) -> bool:
    pa = devices.devices[[d.name for d in devices.devices].index(a)].profile.peer_link
    pb = devices.devices[[d.name for d in devices.devices].index(b)].profile.peer_link
    if pa is None or pb is None:
        return False
    return devices.link(a, b).name in (pa.name, pb.name)


def nvlink_groups(devices: DeviceSet) -> list[tuple[str, ...]]:
    """Case 1: the devices joined by NVLink (peer links), as groups in device order."""
    names = [d.name for d in devices.devices]
    parent = {n: n for n in names}

    def root(x: str) -> str:
        while parent[x] != x:
            x = parent[x]
        return x

    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if _peer(devices, a, b) and _peer(devices, b, a):
                parent[root(b)] = root(a)
    groups: dict[str, list[str]] = {}
    for n in names:
        groups.setdefault(root(n), []).append(n)
    return [tuple(g) for g in groups.values()]


def sub_devices(devices: DeviceSet, names: tuple[str, ...]) -> DeviceSet:
    """The DeviceSet of ``names`` only, with their links."""
    keep = set(names)
    return DeviceSet(tuple(d for d in devices.devices if d.name in keep),
                     {k: v for k, v in devices.links.items() if k[0] in keep and k[1] in keep})


def _between(devices: DeviceSet, g: tuple[str, ...], h: tuple[str, ...]) -> Link:
    """The slowest link from a device of ``g`` to one of ``h``."""
    return slowest_link([devices.link(a, b) for a in g for b in h])


def _cut_points(plan: Plan, blocks: list[Any]) -> list[int]:
    """Case 3: cut positions 0..n that split no block."""
    n = len(plan.nodes)
    index = {x.name: i for i, x in enumerate(plan.nodes)}
    banned = np.zeros(n + 1, dtype=bool)
    for b in blocks:
        idx = [index[x] for x in (*b.nodes, *b.column, *b.row) if x in index]
        if idx:
            banned[min(idx) + 1: max(idx) + 1] = True
    return [j for j in range(n + 1) if not banned[j]]


def _node_times(tp: TensorParallel, names: tuple[str, ...]) -> np.ndarray:
    """Case 2: per node, the slowest device's share plus the collective after it."""
    pos = {x: i for i, x in enumerate(names)}
    out = np.zeros(len(names))
    for s in tp.schedule:
        v = pos[s.node]
        out[v] = max(out[v], s.finish_s - s.start_s)
    for c in tp.collectives:
        out[pos[c.after]] += c.finish_s - c.start_s
    return out


def _sub_plan(plan: Plan, i: int, j: int, pb: Any) -> Plan:
    """Nodes [i, j) as a plan: tensors read after j (or returned) are its outputs."""
    outs = []
    for t, name in enumerate(pb.t_names):
        p = pb.t_producer[t]
        if i <= p < j and (pb.t_output[t] or any(c >= j for c in pb.t_consumers[t])):
            outs.append(TensorSpec(name, None, None))
    return replace(plan, nodes=plan.nodes[i:j], model=replace(plan.model, outputs=tuple(outs)))


def _dp(pre: list[np.ndarray], mem: list[tuple[np.ndarray, np.ndarray, int]],
        send: list[np.ndarray], cuts: list[int], m: int) -> tuple[float, list[int]] | None:
    """Case 3: the min-max split of the cut positions into ``m`` stages on groups 0..m-1."""
    P = np.asarray(cuts)
    M = len(P)
    best = np.full(M, np.inf)
    best[0] = 0.0
    back: list[np.ndarray] = []
    for g in range(m):
        last = g == m - 1
        new = np.full(M, np.inf)
        arg = np.zeros(M, dtype=np.int64)
        params, seg, cap = mem[g]
        for jj in range(1, M):
            if last and jj != M - 1:
                continue
            ii = np.arange(jj)
            t = pre[g][P[jj]] - pre[g][P[ii]] + (0.0 if last else send[g][P[jj]])
            live = np.maximum.accumulate(seg[:jj][::-1])[::-1]
            fits = params[P[jj]] - params[P[ii]] + live <= cap
            cand = np.where(fits, np.maximum(best[:jj], t), np.inf)
            k = int(np.argmin(cand))
            new[jj], arg[jj] = cand[k], k
        back.append(arg)
        best = new
    if not np.isfinite(best[M - 1]):
        return None
    ends, jj = [M - 1], M - 1
    for g in range(m - 1, -1, -1):
        jj = int(back[g][jj])
        ends.append(jj)
    return float(best[M - 1]), [int(P[k]) for k in reversed(ends)]


def two_d(plan: Plan, devices: DeviceSet | str, *, groups: list[tuple[str, ...]] | None = None,
          source: Any = None, sequence_parallel: bool = False) -> TwoD:
    """Split ``plan`` into pipeline stages over the NVLink groups of ``devices``, each stage
    tensor-parallel within its group (cases 1-6); ``sequence_parallel`` costs each stage
    with it (case 7)."""
    devices, groups = _resolve(devices, groups)
    pb = build_problem(plan, devices)
    cut = cut_bytes(pb)
    send = _sends(devices, groups, cut, sequence_parallel)
    live = np.asarray(live_profile(pb), dtype=np.float64)
    pre, mem = [], []
    memo: dict[tuple[Any, ...], TensorParallel] = {}
    all_blocks, _ = find_tp_blocks(plan)
    for g in groups:
        sub = sub_devices(devices, g)
        key = (tuple(id(d.profile) for d in sub.devices),
               tuple(sorted(v.bandwidth_bytes_per_s for v in sub.links.values())))
        if key not in memo:
            memo[key] = tensor_parallel(plan, sub, source=source,
                                        sequence_parallel=sequence_parallel)
        pre.append(np.concatenate([[0.0], np.cumsum(_node_times(memo[key], pb.names))]))
        blocks, _ = splittable(all_blocks, len(g))
        mem.append(_memory_bound(pb, blocks, len(g), live, sub))
    cuts = _cut_points(plan, all_blocks)
    best: tuple[float, list[int]] | None = None
    tried: dict[int, float | None] = {}
    for m in range(2, len(groups) + 1):
        res = _dp(pre, [(p, _segments(live, cuts), c) for p, c in mem], send, cuts, m)
        tried[m] = None if res is None else res[0]
        if res is not None and (best is None or res[0] < best[0] * (1 - 1e-12)):
            best = res
    if best is None:
        raise GraphoptError(
            f"no 2-D split keeps every group within its memory ({len(groups)} groups of "
            f"{', '.join(str(len(g)) for g in groups)} devices)",
            "add devices or raise their memory caps, or quantize the weights")
    return _costed(plan, devices, groups, best[1], pb, cut, send, source, sequence_parallel,
                   {"stage_counts_tried": {str(m): v for m, v in tried.items()}})


def cost_split(plan: Plan, devices: DeviceSet | str, bounds: list[int], *,
               groups: list[tuple[str, ...]] | None = None, source: Any = None,
               sequence_parallel: bool = False, notes: dict[str, Any] | None = None) -> TwoD:
    """Cases 4-6 for given cuts: stage ``i`` runs plan nodes ``[bounds[i], bounds[i + 1])`` on
    group ``i``; how :mod:`.two_d_emit` re-costs a cut it moved onto a module boundary."""
    devices, groups = _resolve(devices, groups)
    n = len(plan.nodes)
    if len(bounds) < 3 or bounds[0] != 0 or bounds[-1] != n or len(bounds) - 1 > len(groups) \
            or any(a >= b for a, b in zip(bounds, bounds[1:], strict=False)):
        raise GraphoptError(f"cuts {bounds} do not split {n} nodes into 2 to {len(groups)} "
                            "non-empty stages", "give 0 < cut_1 < ... < the node count")
    pb = build_problem(plan, devices)
    cut = cut_bytes(pb)
    return _costed(plan, devices, groups, bounds, pb, cut,
                   _sends(devices, groups, cut, sequence_parallel), source, sequence_parallel,
                   notes or {})


def _resolve(devices: DeviceSet | str, groups: list[tuple[str, ...]] | None
             ) -> tuple[DeviceSet, list[tuple[str, ...]]]:
    if not isinstance(devices, DeviceSet):  # a --devices string, or a list of items
        devices = parse_devices(devices)
    groups = [tuple(g) for g in (groups or nvlink_groups(devices))]
    if len(groups) < 2:
        raise GraphoptError(
            f"2-D parallelism needs several NVLink groups; all {len(devices.devices)} devices "
            "are one group", "use strategy 'tensor', or declare machines with @HOST and net=")
    return devices, groups


def _sends(devices: DeviceSet, groups: list[tuple[str, ...]], cut: np.ndarray,
           sequence_parallel: bool) -> list[np.ndarray]:
    """Case 2's transfer after each position, per group to the next (case 7: a token shard)."""
    out = []
    for gi, g in enumerate(groups):
        link = _between(devices, g, groups[(gi + 1) % len(groups)])
        nbytes = cut / len(g) if sequence_parallel else cut
        out.append(np.where(cut > 0, link.latency_s + nbytes / link.bandwidth_bytes_per_s, 0.0))
    return out


def _costed(plan: Plan, devices: DeviceSet, groups: list[tuple[str, ...]], bounds: list[int],
            pb: Any, cut: np.ndarray, send: list[np.ndarray], source: Any,
            sequence_parallel: bool, notes: dict[str, Any]) -> TwoD:
    """Case 4: each stage re-costed exactly on its own nodes, then case 5's clock."""
    stages = []
    for s in range(len(bounds) - 1):
        i, j = bounds[s], bounds[s + 1]
        g = groups[s]
        tp = tensor_parallel(_sub_plan(plan, i, j, pb), sub_devices(devices, g), source=source,
                             sequence_parallel=sequence_parallel)
        last = s == len(bounds) - 2
        nbytes = 0 if last else int(cut[j] // (len(g) if sequence_parallel else 1))
        secs = 0.0 if last or nbytes == 0 else float(send[s][j])
        stages.append(Stage2D(s, g, i, j, tp, nbytes, secs))
    m, schedule, why = pipeline_rule(_batch(plan), len(stages))
    out = _assemble(devices, groups, stages, pb, notes)
    return replace(out, micro_batches=m, pipeline_schedule=schedule, schedule_why=why,
                   sequence_parallel=sequence_parallel)


def _batch(plan: Plan) -> int | None:
    """The batch size: the first input's leading dim, when the plan records one."""
    ins = plan.model.inputs
    shape = ins[0].shape if ins else None
    return shape[0] if shape and isinstance(shape[0], int) and shape[0] > 0 else None


def pipeline_rule(batch: int | None, stages: int) -> tuple[int, str, str]:
    """Case 6: (micro-batches, schedule, why). The micro-batches are the largest divisor of the
    batch up to ``4 x stages``: GPipe's bubble is ``(p - 1) / (m + p - 1)`` of a batch's time,
    negligible at ``m >= 4p`` (Huang et al. 2019, GPipe, section 2.2), and the schedule splits
    the batch evenly. The schedule is GPipe: graphopt plans inference, a forward pass only, and
    1F1B differs from GPipe only in where the backward passes go (to hold at most ``p``
    micro-batches' activations)."""
    cap = 4 * stages
    m = max((d for d in range(1, min(batch, cap) + 1) if batch % d == 0), default=1) \
        if batch else 1
    size = f"batch {batch}" if batch else "an unknown batch"
    bubble = (stages - 1) / (m + stages - 1)
    why = (f"{m} micro-batch{'es' if m != 1 else ''}: the largest divisor of {size} up to "
           f"4 x {stages} stages (GPipe's bubble (p-1)/(m+p-1) = {bubble:.0%}); GPipe: a "
           "forward pass only (inference), where 1F1B runs the same forwards")
    return m, "GPipe", why


def _segments(live: np.ndarray, cuts: list[int]) -> np.ndarray:
    """seg[k] = the peak live activations over nodes [cuts[k], cuts[k+1])."""
    return np.asarray([live[a:b].max() if b > a else 0.0
                       for a, b in zip(cuts, cuts[1:], strict=False)] + [0.0])


def _memory_bound(pb: Any, blocks: list[Any], t: int, live: np.ndarray, sub: DeviceSet
                  ) -> tuple[np.ndarray, int]:
    """Case 3's memory bound for one group: prefix sums of parameter bytes (each parameter at
    its first reader, 1/t inside a split block) and the group's smallest usable memory less a
    GEMM workspace."""
    inside = {x for b in blocks for x in (*b.nodes, *b.column, *b.row)}
    seen: set[int] = set()
    per = np.zeros(pb.n)
    for v in range(pb.n):
        for p in pb.node_params[v]:
            if p not in seen:
                seen.add(p)
                per[v] += pb.p_bytes[p] / (t if pb.names[v] in inside else 1)
    ws = max(pb.workspace) if any(pb.node_gemm) else 0
    cap = min(d.memory_bytes for d in sub.devices) - ws
    return np.concatenate([[0.0], np.cumsum(per)]), cap


def _assemble(devices: DeviceSet, groups: list[tuple[str, ...]], stages: list[Stage2D],
              pb: Any, extra: dict[str, Any]) -> TwoD:
    """Case 5: the request's clock, the schedule and the stage-boundary transfers."""
    schedule, transfers, t = [], [], 0.0
    for s in stages:
        schedule += [replace(x, start_s=t + x.start_s, finish_s=t + x.finish_s,
                             reason=f"stage {s.index + 1}/{len(stages)} on "
                                    f"{'+'.join(s.group)}: {x.reason}")
                     for x in s.tp.schedule]
        t += s.tp.makespan_s
        if s.send_bytes:
            nxt = stages[s.index + 1].group
            transfers += [Transfer(f"cut after {pb.names[s.end - 1]}", a, b, s.send_bytes, t,
                                   t + s.send_s) for a, b in zip(s.group, nxt, strict=False)]
        t += s.send_s
    bottleneck = max(s.stage_s for s in stages)
    notes = {
        "stage_times_s": [s.stage_s for s in stages],
        "bottleneck_s": bottleneck,
        "throughput_per_s": 1.0 / bottleneck if bottleneck > 0 else None,
        "latency_is": "sum of stage times (compute + collectives) + transfers between stages",
        "throughput_is": "1 / the slowest stage (compute + collectives + its outgoing transfer)",
        "transfer_model": "each rank sends the replicated cut to its counterpart in the next "
                          "group, in parallel, over the link between the groups",
        **extra,
    }
    logger.info("2-D split: %d stages over %s; latency %s, slowest stage %s", len(stages),
                ", ".join("+".join(g) for g in groups), human_s(t), human_s(bottleneck))
    out = TwoD(devices, tuple(groups), tuple(stages), pb.names, t, bottleneck,
               tuple(schedule), tuple(transfers), notes)
    if out.over:
        logger.info("2-D split overflows: %s (%s)", out.overflow_text(),
                    human_bytes(sum(out.over.values())))
    return out
