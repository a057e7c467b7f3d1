"""Split a planned model across devices: HEFT list scheduling or contiguous pipeline stages.

Strategies (both measured on :func:`graphopt.partition.simulate.simulate`'s clock):

1. ``"heft"`` -- for a general DAG and one batch: the fastest schedule. Candidates are HEFT
   (:mod:`.heft`), the seed's greedy per-op split, every device alone and the pipeline split,
   simulated in plan order (HEFT's also in its rank order); the fastest that fits memory wins,
   and single-node moves refine it (small graphs). So the result is never slower than the greedy
   reference or any single device, whichever memory allows.
2. ``"pipeline"`` -- for pipeline deployment (``torch.distributed.pipelining``): contiguous
   stages minimizing the slowest stage (:mod:`.pipeline_dp`); the makespan reported is one
   batch through all stages, the notes carry the stage times and the bottleneck.

Legality first: a node whose own parameters and tensors exceed every device, or a model no
strategy can fit, raises a :class:`GraphoptError` saying how much memory is missing where.
"""

from __future__ import annotations

import logging
from typing import Any

from graphopt.errors import GraphoptError
from graphopt.ir.graph import Graph
from graphopt.ir.plan import Plan
from graphopt.partition.assemble import human_bytes, human_s, to_partition
from graphopt.partition.devices import DeviceSet
from graphopt.partition.greedy import greedy_split
from graphopt.partition.heft import REFINE_BUDGET, heft, rank_order, refine
from graphopt.partition.parse import parse_devices
from graphopt.partition.pipeline_dp import pipeline_split
from graphopt.partition.problem import Problem, build_problem, live_profile
from graphopt.partition.result import Partition
from graphopt.partition.simulate import Sim, simulate

__all__ = ["STRATEGIES", "split"]

logger = logging.getLogger(__name__)

STRATEGIES = ("heft", "pipeline")
_FIX = ("add devices or raise their memory caps, or quantize the weights (`graphopt plan` shows "
        "the recommended format)")


def split(plan: Plan | Graph, devices: DeviceSet | str, strategy: str = "heft", *,
          refine_moves: bool = True) -> Partition:
    """Assign every node of ``plan`` to one of ``devices`` (a DeviceSet or a ``--devices``
    string); a Graph is planned on the first device first."""
    if not isinstance(devices, DeviceSet):  # a --devices string, or a list of items

        devices = parse_devices(devices)
    if strategy not in STRATEGIES:
        raise GraphoptError(f"unknown split strategy {strategy!r}",
                            f"use one of: {', '.join(STRATEGIES)}")
    pb = build_problem(plan, devices)
    if pb.n == 0:
        return to_partition(pb, simulate(pb, ()), strategy, [], {"empty": True})
    _check_each_node_fits(pb)
    if strategy == "pipeline":
        return _split_pipeline(pb)
    return _split_heft(pb, refine_moves)


def _split_heft(pb: Problem, refine_moves: bool) -> Partition:
    n, names = pb.n, [d.name for d in pb.devices.devices]
    order = rank_order(pb)
    h = heft(pb, order)
    greedy = greedy_split(pb)
    pipe = pipeline_split(pb)
    cands: list[tuple[str, tuple[int, ...]]] = []
    cands.append(("heft", h.assign))
    cands.append(("greedy", greedy.assign))
    if pipe is not None:
        cands.append(("pipeline", pipe.assign(n)))
    cands += [(f"single:{name}", (d,) * n) for d, name in enumerate(names)]
    tried: dict[str, float | None] = {}
    starts: list[tuple[Sim, str]] = []
    for label, assign in cands:
        # HEFT's assignment is also tried in its own rank order; the rest in plan order
        sims = [simulate(pb, assign, o) for o in ((order, None) if label == "heft" else (None,))]
        sim = min(sims, key=lambda s: (sum(s.over().values()), s.makespan))
        tried[label] = sim.makespan if sim.feasible else None
        starts.append((sim, label))
    # stable: HEFT first among equals; memory-overflowing starts last (the search repairs them)
    starts.sort(key=lambda x: (not x[0].feasible, x[0].makespan))
    if refine_moves:
        final, i = refine(pb, [s for s, _ in starts])
    else:
        final, i = starts[0][0], 0
    if not final.feasible:
        raise _infeasible(pb, [final])
    chosen, label = starts[i]
    moved = {v: final.makespan for v in range(n) if final.assign[v] != chosen.assign[v]}
    greedy_sim = simulate(pb, greedy.assign)
    singles = {k[len("single:"):]: v for k, v in tried.items() if k.startswith("single:")}
    notes: dict[str, Any] = {
        "chosen": label,
        "candidates_s": tried,
        "refined_moves": len(moved),
        "refinement": ("iterated local search" if refine_moves and 1 < pb.k and n * (pb.k - 1) * n
                       <= REFINE_BUDGET else "skipped: graph too large for the search budget"),
        "greedy_makespan_s": greedy_sim.makespan,
        "greedy_naive_total_s": greedy.naive_total_s,
        "greedy_fits_memory": greedy_sim.feasible,
        "best_single_device_s": min((v for v in singles.values() if v is not None),
                                    default=None),
        "link_model": "one FIFO per ordered device pair; copies overlap compute",
    }
    reasons = [_heft_reason(pb, v, label, final, chosen, h.eft, moved, tried) for v in range(n)]
    logger.info("split %d nodes over %d devices (heft, chose %s, %d refinement moves): "
                "makespan %s (greedy %s)", n, pb.k, label, len(moved), human_s(final.makespan),
                human_s(greedy_sim.makespan))
    return to_partition(pb, final, "heft", reasons, notes)


def _heft_reason(pb: Problem, v: int, label: str, final: Sim, chosen: Sim,
                 eft: tuple[tuple[float | None, ...], ...], moved: dict[int, float],
                 tried: dict[str, float | None]) -> str:
    d = final.assign[v]
    here = pb.device_label(d)
    if v in moved:
        why = ("to fit memory" if not chosen.feasible else
               f"makespan {human_s(chosen.makespan)} -> {human_s(moved[v])} "
               f"({moved[v] / chosen.makespan - 1:+.2%})")
        return (f"refinement moved it to {here} from {pb.device_label(chosen.assign[v])}: "
                f"{why}")
    if label == "heft":
        others = ", ".join(
            f"{pb.devices.devices[e].name} {'memory full' if f is None else human_s(f)}"
            for e, f in enumerate(eft[v]) if e != d)
        mine = eft[v][d]
        if mine is None:
            return f"HEFT: no device had room; {here} overflowed least ({others})"
        return (f"HEFT: earliest finish on {here} ({human_s(mine)}"
                f"{'; ' + others if others else ''})")
    heft_s = tried.get("heft")
    versus = f"HEFT's split {human_s(heft_s)}" if heft_s is not None else "HEFT's overflowed"
    if label.startswith("single:") and not moved:
        return (f"one device beats every split found: all on {here}, "
                f"{human_s(final.makespan)} ({versus})")
    return (f"kept on {here} from the {label} split{' the refinement improved' if moved else ''}"
            f" (makespan {human_s(final.makespan)}; {versus})")


def _split_pipeline(pb: Problem) -> Partition:
    res = pipeline_split(pb)
    if res is None:
        raise _infeasible(pb, [], pipeline=True)
    n = pb.n
    sim = simulate(pb, res.assign(n))
    if not sim.feasible:  # the stage bound is sound; this would be a bug, not a user error
        raise AssertionError(f"pipeline stages overflow memory: {sim.over()}")
    names = [d.name for d in pb.devices.devices]
    reasons = [""] * n
    for s, d in enumerate(res.devices):
        i, j = res.cuts[s], res.cuts[s + 1]
        t = res.stage_times[s]
        role = ("the bottleneck" if t >= res.bottleneck * (1 - 1e-12)
                else f"bottleneck {human_s(res.bottleneck)}")
        text = (f"pipeline stage {s + 1}/{len(res.devices)} on {pb.device_label(d)}: nodes "
                f"{pb.names[i]}..{pb.names[j - 1]}, stage time {human_s(t)} ({role})")
        for v in range(i, j):
            reasons[v] = text
    stages = tuple(tuple(pb.names[res.cuts[s]:res.cuts[s + 1]]) for s in range(len(res.devices)))
    notes = {
        "stage_times_s": list(res.stage_times),
        "bottleneck_s": res.bottleneck,
        "throughput_per_s": 1.0 / res.bottleneck if res.bottleneck > 0 else None,
        "makespan_is": "one batch through every stage, no micro-batch overlap",
        "stage_memory_model": "parameters + GEMM workspace + peak live activations",
    }
    logger.info("pipeline split of %d nodes: %s; bottleneck %s", n,
                ", ".join(f"{names[d]}:{len(st)}" for d, st in zip(res.devices, stages,
                                                                    strict=True)),
                human_s(res.bottleneck))
    return to_partition(pb, sim, "pipeline", reasons, notes, stages,
                        tuple(names[d] for d in res.devices))


def _devices_text(pb: Problem, needs: list[int]) -> str:
    parts = []
    for d, cap in enumerate(pb.caps):
        miss = needs[d] - cap
        parts.append(f"{pb.device_label(d)} {human_bytes(cap)} usable"
                     + (f", {human_bytes(miss)} missing" if miss > 0 else ""))
    return "; ".join(parts)


def _check_each_node_fits(pb: Problem) -> None:
    """A node must fit whole on some device: its parameters, workspace, inputs and outputs."""
    for v in range(pb.n):
        acts = (sum(pb.t_bytes[t] for t in pb.node_inputs[v])
                + sum(pb.t_bytes[t] for t in pb.node_outputs[v]))
        params = sum(pb.p_bytes[p] for p in pb.node_params[v])
        ws = [pb.workspace[d] if pb.node_gemm[v] else 0 for d in range(pb.k)]
        needs = [params + acts + w for w in ws]
        if all(need > cap for need, cap in zip(needs, pb.caps, strict=True)):
            work = f" + GEMM workspace up to {human_bytes(max(ws))}" if any(ws) else ""
            raise GraphoptError(
                f"node {pb.names[v]} needs {human_bytes(min(needs))} or more (parameters "
                f"{human_bytes(params)} + activations {human_bytes(acts)}{work}) and fits on "
                f"no device: {_devices_text(pb, needs)}", _FIX)


def _infeasible(pb: Problem, failed: list[Sim], pipeline: bool = False) -> GraphoptError:
    """What is missing where, when no split fits."""
    params = sum(pb.p_bytes)
    acts = max(live_profile(pb), default=0)
    need = params + acts
    total = sum(pb.caps)
    big = max(range(pb.k), key=lambda d: (pb.caps[d], -d))
    text = (f"the model needs {human_bytes(params)} of parameters + {human_bytes(acts)} of peak "
            f"activations = {human_bytes(need)}; the largest device, "
            f"{pb.device_label(big)}, has {human_bytes(pb.caps[big])} usable: "
            f"{human_bytes(max(0, need - pb.caps[big]))} missing there")
    if params > total:
        text += (f"; all {pb.k} devices together have {human_bytes(total)} usable: "
                 f"{human_bytes(params - total)} short for the parameters alone")
    elif need > total:
        text += (f"; all {pb.k} devices together have {human_bytes(total)} usable: "
                 f"{human_bytes(need - total)} short")
    else:
        how = "contiguous pipeline stages" if pipeline else "split"
        worst = min(failed, key=lambda s: sum(s.over().values()), default=None)
        over = "" if worst is None else "; the closest attempt overflows " + ", ".join(
            f"{pb.devices.devices[d].name} by {human_bytes(b)}" for d, b in worst.over().items())
        text += (f"; together the devices have {human_bytes(total)} usable, but no {how} "
                 f"found keeps each device within its memory{over}")
    return GraphoptError(text, _FIX)

