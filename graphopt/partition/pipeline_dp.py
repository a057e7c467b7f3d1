"""Contiguous pipeline stages: minimize the slowest stage (min-max), one stage per device.

Stages cut the plan's execution order (topological) into contiguous runs of nodes. Cases:

1. Stage time of nodes ``[i, j)`` on device d followed by device d' = the summed node costs on
   d (prefix sums) + sending the cut: every activation produced before j and read at or after
   j crosses cut j (a pass-through tensor is forwarded stage by stage, as
   ``torch.distributed.pipelining`` does). The last stage sends nothing.
2. Stage memory = its parameters (each once) + a GEMM workspace if it has a GEMM + the largest
   single-order live-activation count over its steps (:func:`problem.live_profile`); this
   bounds the simulator's exact peak on that device (every instance live on the device at any
   moment is live at the step then running, or at the stage's last step).
3. Both terms fall as a stage's start i moves right, so for a fixed bottleneck T the ends
   reachable after s stages follow from the starts reachable after s-1 by one vectorized
   sweep: end j is reachable iff some reachable start lies in [lo(j), j-1], with lo(j) the
   largest of the compute bound (a binary search on the prefix sums) and the memory bound
   (two pointers, computed once per device). Bisection on T (to a relative 1e-9) gives the
   optimal bottleneck; O(n k log(1/eps)) per device sequence.
4. Device order: every ordered selection of distinct devices for up to 4 devices (stages may
   skip a slow device); beyond 4, the given order, and each device alone.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from dataclasses import dataclass

import numpy as np

from graphopt.partition.problem import Problem, live_profile

__all__ = ["PipelineResult", "cut_bytes", "pipeline_split", "stage_memory", "stage_time"]

logger = logging.getLogger(__name__)

_REL_TOL = 1e-9
_MAX_PERMUTED = 4  # 64 device sequences for 4 devices; 5 would be 325


@dataclass(frozen=True, slots=True)
class PipelineResult:
    """Stage bounds ``cuts`` (stage s = nodes cuts[s]..cuts[s+1]-1) on ``devices``."""

    devices: tuple[int, ...]
    cuts: tuple[int, ...]
    stage_times: tuple[float, ...]
    bottleneck: float

    def assign(self, n: int) -> tuple[int, ...]:
        out = [0] * n
        for s, d in enumerate(self.devices):
            for v in range(self.cuts[s], self.cuts[s + 1]):
                out[v] = d
        return tuple(out)


def cut_bytes(pb: Problem) -> np.ndarray:
    """C[j] = bytes of activations produced before j and read at or after j (case 1)."""
    diff = np.zeros(pb.n + 2, dtype=np.float64)
    for t, nbytes in enumerate(pb.t_bytes):
        p, cons = pb.t_producer[t], pb.t_consumers[t]
        if p >= 0 and cons and cons[-1] > p:
            diff[p + 1] += nbytes
            diff[cons[-1] + 1] -= nbytes
    return np.cumsum(diff)[: pb.n + 1]


def stage_time(pb: Problem, d: int, nxt: int | None, i: int, j: int, cut: np.ndarray) -> float:
    """Case 1 for one stage, computed directly (also what the tests brute-force)."""
    comp = sum(pb.cost[d][i:j])
    if nxt is None or j >= pb.n:
        return comp
    return comp + (pb.transfer_s(int(cut[j]), d, nxt) if cut[j] > 0 else 0.0)


def stage_memory(pb: Problem, d: int, i: int, j: int, live: list[int]) -> int:
    """Case 2 for one stage, computed directly (also what the tests brute-force)."""
    params = {p for v in range(i, j) for p in pb.node_params[v]}
    gemm = any(pb.node_gemm[v] for v in range(i, j))
    return (sum(pb.p_bytes[p] for p in params) + (pb.workspace[d] if gemm else 0)
            + max(live[i:j], default=0))


def _mem_lo(pb: Problem, d: int, live: list[int]) -> np.ndarray:
    """lo[j] = smallest i < j with stage [i, j) fitting device d, else j (case 2)."""
    n, cap = pb.n, pb.caps[d]
    lo = np.zeros(n + 1, dtype=np.int64)
    count: dict[int, int] = {}
    pbytes = gemms = i = 0
    window: deque[int] = deque()  # indices of decreasing live bytes in [i, j)
    for j in range(1, n + 1):
        v = j - 1
        for p in pb.node_params[v]:
            count[p] = count.get(p, 0) + 1
            pbytes += pb.p_bytes[p] if count[p] == 1 else 0
        gemms += pb.node_gemm[v]
        while window and live[window[-1]] <= live[v]:
            window.pop()
        window.append(v)
        while i < j and pbytes + (pb.workspace[d] if gemms else 0) + live[window[0]] > cap:
            u = i
            for p in pb.node_params[u]:
                count[p] -= 1
                pbytes -= pb.p_bytes[p] if count[p] == 0 else 0
            gemms -= pb.node_gemm[u]
            i += 1
            if window and window[0] < i:
                window.popleft()
        lo[j] = i if i < j else j
    return lo


class _Sweeper:
    """Case 3 for one problem: reachability of stage ends for a bottleneck T."""

    def __init__(self, pb: Problem) -> None:
        self.pb = pb
        self.n = pb.n
        self.pre = [np.concatenate([[0.0], np.cumsum(np.asarray(c, dtype=np.float64))])
                    for c in pb.cost]
        self.cut = cut_bytes(pb)
        live = live_profile(pb)
        self.lo_mem = [_mem_lo(pb, d, live) for d in range(pb.k)]
        self._send: dict[tuple[int, int], np.ndarray] = {}

    def send(self, d: int, nxt: int | None) -> np.ndarray:
        """Seconds to send cut j from d to nxt, for j = 1..n."""
        if nxt is None:
            return np.zeros(self.n)
        key = (d, nxt)
        if key not in self._send:
            c = self.cut[1:]
            self._send[key] = np.where(c > 0, self.pb.latency[d][nxt] + c * self.pb.inv_bw[d][nxt],
                                       0.0)
        return self._send[key]

    def reach(self, seq: tuple[int, ...], T: float, keep: bool = False
              ) -> tuple[bool, list[tuple[np.ndarray, np.ndarray]]]:
        n = self.n
        starts = np.zeros(n + 1, dtype=bool)
        starts[0] = True
        kept = []
        for s, d in enumerate(seq):
            nxt = seq[s + 1] if s + 1 < len(seq) else None
            budget = T - self.send(d, nxt)
            pre = self.pre[d]
            lo = np.searchsorted(pre, pre[1:] - budget, side="left")
            lo = np.maximum(lo, self.lo_mem[d][1:])
            lo[budget < 0] = n + 1
            cnt = np.concatenate([[0], np.cumsum(starts)])
            ends = np.zeros(n + 1, dtype=bool)
            ends[1:] = cnt[1 : n + 1] - cnt[np.minimum(lo, n)] > 0
            ends[1:] &= lo <= np.arange(0, n)
            if keep:
                kept.append((starts, lo))
            starts = ends
            if not starts.any():
                return False, kept
        return bool(starts[n]), kept

    def solve(self, seq: tuple[int, ...], T: float) -> PipelineResult:
        ok, kept = self.reach(seq, T, keep=True)
        assert ok
        cuts = [self.n]
        j = self.n
        for starts, lo in reversed(kept):
            lo_j = int(lo[j - 1])
            i = lo_j + int(np.flatnonzero(starts[lo_j:j])[-1])
            cuts.append(i)
            j = i
        cuts.reverse()
        times = tuple(stage_time(self.pb, d, seq[s + 1] if s + 1 < len(seq) else None,
                                 cuts[s], cuts[s + 1], self.cut) for s, d in enumerate(seq))
        return PipelineResult(seq, tuple(cuts), times, max(times))


def _sequences(k: int, n: int) -> list[tuple[int, ...]]:
    if k <= _MAX_PERMUTED:
        return [seq for m in range(1, min(k, n) + 1)
                for seq in itertools.permutations(range(k), m)]
    return [*((d,) for d in range(k)), tuple(range(min(k, n)))]


def pipeline_split(pb: Problem) -> PipelineResult | None:
    """The min-max contiguous split over the device sequences of case 4 (None: nothing fits)."""
    if pb.n == 0:
        return None
    sw = _Sweeper(pb)
    best: PipelineResult | None = None
    for seq in _sequences(pb.k, pb.n):
        # hi is always a bottleneck the sweep has accepted (prefix sums round differently
        # from the direct stage sums, so a solution's own bottleneck may miss by an ulp)
        if best is not None:
            hi = best.bottleneck * (1 - _REL_TOL)
            if not sw.reach(seq, hi)[0]:
                continue
        else:
            if not sw.reach(seq, np.inf)[0]:
                continue
            hi = sw.solve(seq, np.inf).bottleneck * (1 + _REL_TOL)
            if not sw.reach(seq, hi)[0]:
                hi = np.inf
        lo = 0.0
        while np.isfinite(hi) and hi - lo > _REL_TOL * hi:
            mid = (lo + hi) / 2
            if sw.reach(seq, mid)[0]:
                hi = mid
            else:
                lo = mid
        cand = sw.solve(seq, hi)
        if best is None or cand.bottleneck < best.bottleneck:
            best = cand
    if best is not None:
        logger.info("pipeline: %d stages, bottleneck %.3g s", len(best.devices), best.bottleneck)
    return best
