"""HEFT list scheduling under per-device memory limits, and a local refinement pass.

HEFT (Topcuoglu, Hariri and Wu, "Performance-effective and low-complexity task scheduling for
heterogeneous computing", IEEE TPDS 13(3), 2002):

1. Upward rank of a node = its mean cost over the devices + the largest (mean transfer time of
   an output + rank of a consumer). Nodes are scheduled by decreasing rank, ties in plan order;
   a producer's rank is never below its consumer's, so this order is topological.
2. Each node goes to the device with the earliest finish time, including the copies of its
   inputs (a copy is made once per tensor and destination; links are FIFO per ordered pair),
   appended to the device's stream (no insertion into idle gaps: the schedule is exactly what
   :func:`graphopt.partition.simulate.simulate` computes for the same assignment and order).
3. Legality before profitability: a device is eligible only if its memory stays within its
   usable bytes; if none is, the node goes where the overflow is least and the refinement
   search repairs the split. The check is a sound upper bound of the simulator's exact peak:
   parameters (once per device) + workspace + max(the largest bound accepted so far on that
   device, every activation instance still open there + the new ones + closed instances freed
   after the earliest new allocation). Instances close when their tensor's last consumer is
   placed.
4. Refinement (iterated local search): from every candidate split and every relabeling of
   its devices (a chain HEFT put on the fast device may belong on the slow one), move a node
   or a producer-consumer pair (moving one alone would add two transfers) to another device,
   or on graphs up to ~36 nodes swap two nodes' devices (under tight memory a move rarely
   fits, an exchange does); first improvement, accepted when the bytes over the memory caps
   drop, or stay at zero and the simulated makespan drops (so starts that overflow memory get
   repaired). Then relabel the best, kick it (3 nodes to random devices, seeded) and descend
   again, until 40 tries in a row find nothing or the work budget is spent (a fixed count of
   simulated node-steps, so results do not depend on machine speed). Skipped when not even
   one pass of single moves fits the budget (about 220 nodes on 3 devices): large graphs keep
   the best candidate. When every split fits memory the search skips measuring memory.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from graphopt.partition.problem import Problem
from graphopt.partition.simulate import Sim, simulate

__all__ = ["HeftResult", "heft", "rank_order", "refine", "upward_ranks"]

logger = logging.getLogger(__name__)

#: refinement budget in simulated node-steps (one simulation of n nodes costs n): 0.2-0.5 s
#: of pure-Python simulation on the development VM
REFINE_BUDGET = 100_000
_KICK = 3  # nodes given a random device per kick
_STALL = 40  # kicks without improvement before giving up
_GAIN = 1e-6  # smallest relative makespan gain a move must bring (below: rounding noise)


@dataclass(frozen=True, slots=True)
class HeftResult:
    """HEFT's assignment, the finish time each node would have had on each device when it was
    placed (None: memory would overflow), and the first node that fitted nowhere (then placed
    where it overflowed least: the assignment may not fit)."""

    assign: tuple[int, ...]
    eft: tuple[tuple[float | None, ...], ...]
    failed_node: int | None = None


def rank_order(pb: Problem) -> tuple[int, ...]:
    """Nodes by decreasing upward rank with mean costs (case 1)."""
    rank = upward_ranks(pb)
    return tuple(sorted(range(pb.n), key=lambda v: (-rank[v], v)))


def upward_ranks(pb: Problem) -> list[float]:
    """Each node's upward rank: its mean cost plus the longest mean-cost path (transfers
    included) to an exit; the largest is the critical path's length."""
    n, k = pb.n, pb.k
    wbar = [sum(pb.cost[d][v] for d in range(k)) / k for v in range(n)]
    pairs = [(a, b) for a in range(k) for b in range(k) if a != b]
    mlat = sum(pb.latency[a][b] for a, b in pairs) / len(pairs) if pairs else 0.0
    minv = sum(pb.inv_bw[a][b] for a, b in pairs) / len(pairs) if pairs else 0.0
    rank = [0.0] * n
    for v in range(n - 1, -1, -1):
        best = 0.0
        for t in pb.node_outputs[v]:
            comm = (mlat + pb.t_bytes[t] * minv) if pairs else 0.0
            for c in pb.t_consumers[t]:
                if comm + rank[c] > best:
                    best = comm + rank[c]
        rank[v] = wbar[v] + best
    return rank


#: node ``v`` tried on one device: (bytes over the cap, finish, start, the copies of its inputs
#: it would make as (tensor, source device, start, end), the parameter bytes it would add, the
#: activation bound); a plain tuple, as HEFT makes one per node and device
_Option = tuple[int, float, float, list[tuple[int, int, float, float]], int, int]


class _Placer:
    """HEFT's state as it places nodes (cases 2 and 3): where and when each node runs, the
    copies made and the links' queues, and each device's open and closed activation
    instances, parameters and memory bound."""

    def __init__(self, pb: Problem) -> None:
        n, k = pb.n, pb.k
        self.pb = pb
        self.assign = [-1] * n
        self.start = [0.0] * n
        self.finish = [0.0] * n
        self.dev_free = [0.0] * k
        self.link_free = [[0.0] * k for _ in range(k)]
        self.copies: dict[int, tuple[float, float]] = {}
        self.remaining = [len(c) for c in pb.t_consumers]
        # per tensor, the devices holding an open instance of it
        self.inst_devs: list[list[int]] = [[] for _ in pb.t_bytes]
        self.open_bytes = [0] * k
        # per device, the sorted free times of closed instances, and their bytes
        self.closed_free: list[list[float]] = [[] for _ in range(k)]
        self.closed_bytes: list[list[int]] = [[] for _ in range(k)]
        self.act_peak = [0] * k
        self.params_on: list[set[int]] = [set() for _ in range(k)]
        self.param_bytes = [0] * k
        self.gemm_on = [False] * k

    def close(self, t: int) -> None:
        """Tensor ``t``'s last consumer is placed: its instances become closed, freed when
        their last reader (or copy out) finishes."""
        pb, k, assign, finish = self.pb, self.pb.k, self.assign, self.finish
        p = pb.t_producer[t]
        for e in self.inst_devs[t]:
            free = 0.0
            for c in pb.t_consumers[t]:
                if assign[c] == e and finish[c] > free:
                    free = finish[c]
            if p >= 0 and assign[p] == e:
                free = max(free, finish[p], *(self.copies[t * k + d][1] for d in range(k)
                                              if t * k + d in self.copies))
            self.open_bytes[e] -= pb.t_bytes[t]
            i = bisect.bisect_right(self.closed_free[e], free)
            self.closed_free[e].insert(i, free)
            self.closed_bytes[e].insert(i, pb.t_bytes[t])
        self.inst_devs[t] = []

    def options(self, v: int) -> list[_Option]:
        """Node ``v`` on each device: when its inputs arrive there (copying the missing ones
        over FIFO links), when it finishes, and the memory bound it leaves there."""
        pb = self.pb
        k, cost, caps = pb.k, pb.cost, pb.caps
        t_prod, t_bytes, lat, inv = pb.t_producer, pb.t_bytes, pb.latency, pb.inv_bw
        assign, finish, copies, inst_devs = self.assign, self.finish, self.copies, self.inst_devs
        link_free, dev_free, params_on, gemm_on = (self.link_free, self.dev_free, self.params_on,
                                                   self.gemm_on)
        open_bytes, closed_free, closed_bytes = self.open_bytes, self.closed_free, self.closed_bytes
        act_peak, param_bytes = self.act_peak, self.param_bytes
        out = []
        for d in range(k):
            ready, new_bytes, a_min = 0.0, 0, math.inf
            tentative: dict[int, float] = {}
            new_copies: list[tuple[int, int, float, float]] = []
            for t in pb.node_inputs[v]:
                p = t_prod[t]
                if p < 0:
                    if d not in inst_devs[t] and t_bytes[t]:
                        new_bytes += t_bytes[t]
                        a_min = 0.0
                    continue
                src = assign[p]
                if src == d:
                    r = finish[p]
                else:
                    c = copies.get(t * k + d)
                    if c is None:
                        free_at = tentative.get(src, link_free[src][d])
                        ts = finish[p] if finish[p] > free_at else free_at
                        r = ts + lat[src][d] + t_bytes[t] * inv[src][d]
                        tentative[src] = r
                        new_copies.append((t, src, ts, r))
                        new_bytes += t_bytes[t]
                        a_min = min(a_min, ts)
                    else:
                        r = c[1]
                if r > ready:
                    ready = r
            s = dev_free[d] if dev_free[d] > ready else ready
            f = s + cost[d][v]
            out_bytes = sum(t_bytes[t] for t in pb.node_outputs[v])
            if out_bytes:
                new_bytes += out_bytes
                a_min = min(a_min, s)
            new_params = sum(pb.p_bytes[p] for p in pb.node_params[v] if p not in params_on[d])
            if pb.node_gemm[v] and not gemm_on[d]:
                new_params += pb.workspace[d]
            bound = open_bytes[d] + new_bytes
            if a_min < math.inf:
                i = bisect.bisect_right(closed_free[d], a_min)
                bound += sum(closed_bytes[d][i:])
            peak = max(act_peak[d], bound)
            over = param_bytes[d] + new_params + peak - caps[d]
            out.append((over, f, s, new_copies, new_params, peak))
        return out

    def place(self, v: int, d: int, o: _Option) -> None:
        """Commit ``v`` to ``d`` as :meth:`options` tried it; close the tensors it ends."""
        pb, t_bytes = self.pb, self.pb.t_bytes
        _, finish, start, new_copies, new_params, peak = o
        for t, src, ts, te in new_copies:
            self.copies[t * pb.k + d] = (ts, te)
            self.link_free[src][d] = te
            self.inst_devs[t].append(d)
            self.open_bytes[d] += t_bytes[t]
        for t in pb.node_inputs[v]:
            if pb.t_producer[t] < 0 and d not in self.inst_devs[t] and t_bytes[t]:
                self.inst_devs[t].append(d)
                self.open_bytes[d] += t_bytes[t]
        self.assign[v], self.start[v], self.finish[v], self.dev_free[d] = d, start, finish, finish
        for p in pb.node_params[v]:
            self.params_on[d].add(p)
        self.param_bytes[d] += new_params
        self.gemm_on[d] = self.gemm_on[d] or pb.node_gemm[v]
        self.act_peak[d] = peak
        for t in pb.node_outputs[v]:
            if t_bytes[t]:
                self.inst_devs[t].append(d)
                self.open_bytes[d] += t_bytes[t]
            if self.remaining[t] == 0 and not pb.t_output[t]:
                self.close(t)  # a dead output: freed when its producer finishes
        for t in pb.node_inputs[v]:
            self.remaining[t] -= 1
            if self.remaining[t] == 0 and not pb.t_output[t]:
                self.close(t)


def heft(pb: Problem, order: tuple[int, ...]) -> HeftResult:
    """Cases 2 and 3: place the nodes in ``order`` on the device of earliest finish."""
    placer = _Placer(pb)
    eft_table: list[tuple[float | None, ...]] = [()] * pb.n
    failed: int | None = None
    for v in order:
        best: tuple[tuple[int, float], int, _Option] | None = None
        efts: list[float | None] = []
        for d, o in enumerate(placer.options(v)):
            over, f = o[0], o[1]
            efts.append(f if over <= 0 else None)
            # case 3: legal devices by finish time; if none is, the least overflow (the
            # search repairs it later)
            rank = (max(over, 0), f)
            if best is None or rank < best[0]:
                best = (rank, d, o)
        eft_table[v] = tuple(efts)
        assert best is not None
        (over, _), d, o = best
        if over > 0 and failed is None:
            failed = v
            logger.info("HEFT: node %s fits on no device within the bound", pb.names[v])
        placer.place(v, d, o)
    return HeftResult(tuple(placer.assign), tuple(eft_table), failed)


def _key(sim: Sim) -> tuple[int, float]:
    """Search objective: bytes over the memory caps first (legality), then the makespan."""
    return sum(sim.over().values()), sim.makespan


def _better(a: Sim, b: Sim) -> bool:
    (oa, ma), (ob, mb) = _key(a), _key(b)
    return oa < ob or (oa == ob and ma < mb * (1 - _GAIN))


def refine(pb: Problem, starts: Sequence[Sim], budget: int = REFINE_BUDGET
           ) -> tuple[Sim, int]:
    """Case 4 from each start (best first; starts may overflow memory: the search repairs
    them) and each start with its devices relabeled, then kicks; returns the best schedule
    found (check ``feasible``) and the index of the start it grew from."""
    n, k = pb.n, pb.k
    first = min(range(len(starts)), key=lambda i: _key(starts[i]))
    if k == 1 or n * (k - 1) * n > budget:  # not even one pass fits: keep the best start
        logger.info("refinement skipped: one pass over %d nodes exceeds the budget", n)
        return starts[first], first
    search = _Search(pb, budget)
    seen: set[tuple[int, ...]] = set()
    pool: list[tuple[Sim, int]] = []
    for i, s in enumerate(starts):
        for perm in itertools.permutations(range(k)) if k <= 4 else [tuple(range(k))]:
            assign = tuple(perm[d] for d in s.assign)
            if assign not in seen:
                seen.add(assign)
                pool.append((search.sim(assign, s.order), i))
    pool.sort(key=lambda x: _key(x[0]))
    best: tuple[Sim, int] = (starts[first], first)
    for s, i in pool:
        found = search.descend(s)
        if _better(found, best[0]):
            best = (found, i)
    rng = random.Random(0)  # kicks: deterministic
    stall, relabeled = 0, False
    while search.left() and stall < _STALL:
        stall += 1
        if not relabeled and k <= 4:  # the best so far with its devices permuted
            relabeled = True
            tries = [[perm[d] for d in best[0].assign]
                     for perm in itertools.permutations(range(k))][1:]
        else:
            kicked = list(best[0].assign)
            for v in rng.sample(range(n), min(n, _KICK)):
                kicked[v] = rng.randrange(k)
            tries = [kicked]
        for assign in tries:
            found = search.descend(search.sim(assign, best[0].order))
            if _better(found, best[0]):
                best, stall, relabeled = (found, best[1]), 0, False
    if search.fast:  # measure the winner's memory for the report
        best = (simulate(pb, best[0].assign, best[0].order), best[1])
    return best


class _Search:
    """Simulations under a budget of node-steps; memory is skipped when any split fits."""

    def __init__(self, pb: Problem, budget: int) -> None:
        self.pb, self.budget, self.spent = pb, budget, 0
        self.fast = pb.always_fits
        self.swaps = pb.n**3 <= budget // 2  # one pass of swaps is n^2/2 simulations of n
        self.edges = [(p, c) for t, p in enumerate(pb.t_producer) if p >= 0
                      for c in pb.t_consumers[t]]

    def left(self) -> bool:
        return self.spent + self.pb.n <= self.budget

    def sim(self, assign: Sequence[int], order: tuple[int, ...]) -> Sim:
        self.spent += self.pb.n
        return simulate(self.pb, assign, order, memory=not self.fast)

    def descend(self, sim: Sim) -> Sim:
        """First improvement: move a node or a producer-consumer pair, or (small graphs) swap
        two nodes' devices, until no move helps or the budget is spent."""
        n, k = self.pb.n, self.pb.k
        best = sim
        improved = True
        while improved:
            improved = False
            moves: list[tuple[tuple[int, ...], tuple[int, ...]]] = [
                ((v,), (d,)) for v in best.order for d in range(k)]
            moves += [((u, v), (d, d)) for u, v in self.edges for d in range(k)]
            if self.swaps:  # small graphs: exchange two nodes' devices (memory stays balanced)
                a = best.assign
                moves += [((u, v), (a[v], a[u])) for u in range(n) for v in range(u + 1, n)
                          if a[u] != a[v]]
            for nodes, devs in moves:
                if all(best.assign[v] == d for v, d in zip(nodes, devs, strict=True)):
                    continue
                if not self.left():
                    return best
                cand = list(best.assign)
                for v, d in zip(nodes, devs, strict=True):
                    cand[v] = d
                trial = self.sim(cand, best.order)
                if _better(trial, best):
                    best, improved = trial, True
        return best
