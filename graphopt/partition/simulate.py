"""The one clock every split is measured on: list-schedule an assignment over the DAG.

Given a device per node and a topological priority order, nodes run one at a time per device
(one stream, appended in order: a node starts when its device is free and all its inputs have
arrived). Cases (comments refer back to them):

1. A tensor crossing devices is copied once per (tensor, destination device), starting when its
   producer finishes and the directed link (src, dst) is free: each ordered pair is one FIFO
   resource held for the whole transfer (latency + bytes / bandwidth). Links of different pairs
   do not contend, even where two PCIe paths share the host (an optimistic simplification);
   copies overlap compute on every device.
2. Memory per device = its parameters (each tensor once) + one GEMM workspace if it runs a GEMM
   + the peak over time of live activations. An activation instance lives on a device over
   ``[alloc, free)``: a node's output from the node's start until its last consumer on that
   device and its outgoing copies have finished (graph outputs: to the end); a received copy
   from its transfer's start (the receive buffer) until its last consumer there finishes; a
   graph input from 0 until its last consumer on that device.
3. The makespan is the latest finish of any node.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from graphopt.partition.problem import Problem

__all__ = ["Sim", "simulate"]


@dataclass(frozen=True, slots=True)
class Sim:
    """A simulated schedule: times per node, copies made, memory and busy time per device."""

    assign: tuple[int, ...]
    order: tuple[int, ...]
    start: tuple[float, ...]
    finish: tuple[float, ...]
    transfers: tuple[tuple[int, int, int, float, float], ...]  # (tensor, src, dst, start, end)
    makespan: float
    memory: tuple[int, ...]  # peak bytes per device (case 2)
    params: tuple[int, ...]  # parameter bytes per device
    busy: tuple[float, ...]
    caps: tuple[int, ...]

    @property
    def feasible(self) -> bool:
        return all(m <= c for m, c in zip(self.memory, self.caps, strict=True))

    def over(self) -> dict[int, int]:
        """Device index -> bytes over its usable memory (only devices that overflow)."""
        return {d: m - c for d, (m, c) in enumerate(zip(self.memory, self.caps, strict=True))
                if m > c}


def simulate(pb: Problem, assign: Sequence[int], order: Sequence[int] | None = None, *,
             memory: bool = True) -> Sim:
    """Schedule ``assign`` (device index per node) in ``order`` (topological; default: plan
    order) and measure makespan and memory (``memory=False``: not measured, reported as 0;
    for searches on a problem where every assignment fits, ``Problem.always_fits``)."""
    n, k = pb.n, pb.k
    order = tuple(range(n)) if order is None else tuple(order)
    assign = tuple(assign)
    cost, lat, inv = pb.cost, pb.latency, pb.inv_bw
    t_prod, t_bytes, node_inputs = pb.t_producer, pb.t_bytes, pb.node_inputs
    dev_free = [0.0] * k
    link_free = [[0.0] * k for _ in range(k)]
    start = [0.0] * n
    finish = [0.0] * n
    copies: dict[int, tuple[float, float]] = {}  # tensor * k + dst -> (start, end)
    transfers: list[tuple[int, int, int, float, float]] = []
    for v in order:
        d = assign[v]
        ready = 0.0
        for t in node_inputs[v]:
            p = t_prod[t]
            if p < 0:
                continue
            src = assign[p]
            if src == d:
                r = finish[p]
            else:
                key = t * k + d
                c = copies.get(key)
                if c is None:  # case 1
                    lf = link_free[src]
                    ts = finish[p] if finish[p] > lf[d] else lf[d]
                    te = ts + lat[src][d] + t_bytes[t] * inv[src][d]
                    lf[d] = te
                    copies[key] = c = (ts, te)
                    transfers.append((t, src, d, ts, te))
                r = c[1]
            if r > ready:
                ready = r
        s = dev_free[d] if dev_free[d] > ready else ready
        start[v] = s
        finish[v] = dev_free[d] = s + cost[d][v]
    busy = [0.0] * k
    for v in range(n):
        busy[assign[v]] += cost[assign[v]][v]
    if memory:
        params, act = _memory(pb, assign, start, finish, copies)
    else:
        params, act = [0] * k, [0] * k
    peaks = tuple(params[d] + act[d] for d in range(k))
    return Sim(assign, order, tuple(start), tuple(finish), tuple(transfers),
               max(finish, default=0.0), peaks, tuple(params), tuple(busy), pb.caps)


def _memory(pb: Problem, assign: tuple[int, ...], start: list[float], finish: list[float],
            copies: dict[int, tuple[float, float]]) -> tuple[list[int], list[int]]:
    """(parameter + workspace bytes, activation peak bytes) per device -- case 2."""
    k = pb.k
    seen: list[set[int]] = [set() for _ in range(k)]
    params = [0] * k
    gemm = [False] * k
    for v, d in enumerate(assign):
        gemm[d] = gemm[d] or pb.node_gemm[v]
        for p in pb.node_params[v]:
            if p not in seen[d]:
                seen[d].add(p)
                params[d] += pb.p_bytes[p]
    for d in range(k):
        params[d] += pb.workspace[d] if gemm[d] else 0
    events: list[list[tuple[float, int]]] = [[] for _ in range(k)]
    copies_of: dict[int, list[tuple[int, float, float]]] = {}
    for key, (ts, te) in copies.items():
        copies_of.setdefault(key // k, []).append((key % k, ts, te))
    t_cons, t_prod, t_output = pb.t_consumers, pb.t_producer, pb.t_output
    for t, nbytes in enumerate(pb.t_bytes):
        if not nbytes:
            continue
        p = t_prod[t]
        cp = copies_of.get(t)
        if p >= 0 and cp is None:  # the common case: every reader on the producer's device
            end = finish[p]
            for c in t_cons[t]:
                if finish[c] > end:
                    end = finish[c]
            ev = events[assign[p]]
            ev.append((start[p], nbytes))
            ev.append((math.inf if t_output[t] else end, -nbytes))
            continue
        last: dict[int, float] = {}
        for c in t_cons[t]:
            dc = assign[c]
            if finish[c] > last.get(dc, -1.0):
                last[dc] = finish[c]
        if p < 0:
            for d, end in last.items():
                events[d].append((0.0, nbytes))
                events[d].append((end, -nbytes))
            continue
        src = assign[p]
        end_src = max(finish[p], last.get(src, 0.0))
        for d, ts, te in cp or ():
            end_src = max(end_src, te)
            events[d].append((ts, nbytes))
            events[d].append((last[d], -nbytes))
        events[src].append((start[p], nbytes))
        events[src].append((math.inf if t_output[t] else end_src, -nbytes))
    peaks = []
    for evs in events:
        evs.sort()  # at one instant frees (negative) come first: [alloc, free) intervals
        peak = live = 0
        for i, (time, delta) in enumerate(evs):
            live += delta
            if (i + 1 == len(evs) or evs[i + 1][0] != time) and live > peak:
                peak = live
        peaks.append(peak)
    return params, peaks
