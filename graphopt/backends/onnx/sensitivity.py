"""Per-node sensitivity of a lossy pass, measured on the guard's probe (:mod:`.probe`) with a
bounded number of runs of one ONNX Runtime session, and the smallest set of the most sensitive
nodes to keep in higher precision.

Measured per lowered node ``n`` (errors are ``max |hi - x| / max |hi|`` over its outputs and the
measured samples, inf where ``x`` is inf/NaN and ``hi`` is finite):

- ``local``: the error ``n`` adds by itself, its lowered output computed from exact inputs
  (the probe with every node kept, which computes both sides of each switch: teacher forcing,
  the pre/post pair ONNX Runtime's ``qdq_loss_debug`` compares for each Q/DQ node);
- ``cumulative``: the error of its output with every node lowered (``qdq_loss_debug``'s
  activation matching: where the divergence is, not who caused it);
- ``contribution``: the output error it causes, estimated as ModelOpt's per-layer sensitivity
  measures it (lower one layer, measure the outputs) at the granularity of groups: the lowered
  nodes in graph order are cut into at most ``GROUPS`` contiguous groups, one run lowers one
  group, and the group's output error (max abs over the outputs / the output's scale) is
  shared among its nodes in proportion to their local errors. A small error late in a network
  and a large one that the next norm absorbs are told apart this way; a node whose error is
  amplified downstream (a deep or chaotic stretch) gets the group's larger share. With at most
  ``GROUPS`` nodes every node is its own group: the contribution is measured, not shared.

Runs per measured sample: one with every node kept, one per group (at most ``GROUPS``), and a
bisection over the ranking that stops at a resolution of ``N / RESOLUTION`` nodes (at most
``log2(RESOLUTION) + 2``). Nodes whose lowered output is inf/NaN from finite inputs (fp16
overflow, a scale of zero) are kept first, and are not part of the groups or the bisection.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphopt.backends.onnx.probe import HI, LO, Probe

__all__ = ["GROUPS", "RESOLUTION", "Measured", "NodeSensitivity", "contributions", "errors_of",
           "output_error", "rank", "smallest_kept"]

#: at most this many group runs per measured sample, each a full forward run. On a numpy model
#: of the 1,500-block residual MLP (one sample, fp16 rounding as emulated), ranking by 4, 8, 16
#: or 32 groups and bisecting kept 700-1,000 blocks for the output to be within tolerance
#: (local error alone: 1,312; cumulative error: 1,489): beyond a few groups it is noise
GROUPS = 8
#: the bisection stops within N / RESOLUTION nodes of the boundary: it keeps at most that many
#: nodes more than needed and saves the last runs on a large model
RESOLUTION = 64


@dataclass
class Measured:
    """One measured sample: its feed, the original model's outputs on it, the probe's outputs
    with every node kept (``model``'s), and the switched nodes' ``HI``/``LO`` tensors with
    every node kept (``kept``) and with every node lowered (``lowered``, ``LO`` names)."""

    feed: dict[str, np.ndarray]
    reference: list[np.ndarray]
    kept_outputs: list[np.ndarray]
    kept: dict[str, np.ndarray]
    lowered: dict[str, np.ndarray]


@dataclass(frozen=True)
class NodeSensitivity:
    """What the guard measured for one lowered node (module doc); ``rank`` 1 is the most
    sensitive; ``kept``: the guard kept it in higher precision."""

    node: str
    local: float
    cumulative: float
    contribution: float | None = None
    rank: int = 0
    kept: bool = False

    @property
    def overflow(self) -> bool:
        return math.isinf(self.local)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: an infinite local error is ``"overflow"`` (it starts there), any other
        infinite error ``"inf"``."""
        def num(v: float | None, inf: str = "inf") -> float | str | None:
            return v if v is None or math.isfinite(v) else inf

        return {"node": self.node, "local": num(self.local, "overflow"),
                "cumulative": num(self.cumulative), "contribution": num(self.contribution),
                "rank": self.rank, "kept": self.kept}


def _rel(ref: np.ndarray, got: np.ndarray) -> float:
    r = np.asarray(ref, dtype=np.float64)
    c = np.asarray(got, dtype=np.float64)
    if r.shape != c.shape or r.size == 0:
        return 0.0
    ok = np.isfinite(r) & np.isfinite(c)
    if bool(np.any(np.isfinite(r) & ~np.isfinite(c))):
        return math.inf
    if not ok.any():
        return 0.0
    return float(np.abs(r[ok] - c[ok]).max()) / max(float(np.abs(r[ok]).max()), 1e-30)


def errors_of(probe: Probe, measured: Sequence[Measured]) -> dict[str, tuple[float, float]]:
    """(local, cumulative) per switched node, the worst over the measured samples."""
    out: dict[str, tuple[float, float]] = {}
    for node, outs in probe.switched.items():
        local = cumulative = 0.0
        for m in measured:
            for o in outs:
                hi = m.kept[HI + o]
                local = max(local, _rel(hi, m.kept[LO + o]))
                cumulative = max(cumulative, _rel(hi, m.lowered[LO + o]))
        out[node] = (local, cumulative)
    return out


def output_error(ref: Sequence[np.ndarray], got: Sequence[np.ndarray]) -> float:
    """Max abs error over the outputs, each relative to its reference's scale."""
    return max((_rel(r, g) for r, g in zip(ref, got, strict=True)), default=0.0)


def contributions(probe: Probe, measured: Sequence[Measured], order: Sequence[str],
                  local: dict[str, float], pinned: set[str]) -> dict[str, float]:
    """Each node's estimated output error (module doc), one probe run per group and sample.
    ``order``: the nodes to measure in graph order; ``pinned`` stay kept in every run."""
    every = set(probe.switched)
    groups = [list(g) for g in np.array_split(np.array(order, dtype=object),
                                              min(GROUPS, len(order))) if len(g)]
    out: dict[str, float] = {}
    for group in groups:
        keep = (every - set(group)) | pinned
        err = max(output_error(m.kept_outputs, probe.run(m.feed, keep)) for m in measured)
        total = sum(local[n] for n in group)
        for n in group:
            out[n] = err * local[n] / total if total > 0 else err / len(group)
    return out


def rank(sens: dict[str, NodeSensitivity], order: Sequence[str]) -> list[str]:
    """Most sensitive first: overflow, then contribution, then local error; graph order last."""
    pos = {n: i for i, n in enumerate(order)}

    def key(n: str) -> tuple[int, float, float, int]:
        s = sens[n]
        return (0 if s.overflow else 1, -(s.contribution or 0.0), -s.local, pos.get(n, 0))

    return sorted(sens, key=key)


def smallest_kept(probe: Probe, measured: Sequence[Measured], ranked: Sequence[str],
                  pinned: set[str], within: Callable[[list[list[np.ndarray]],
                                                       list[list[np.ndarray]]], bool],
                  closure: Callable[[set[str]], set[str]] = lambda keep: keep
                  ) -> int | None:
    """The fewest of ``ranked`` (after ``pinned``) to keep for ``within(references,
    outputs)`` to hold on the measured samples; None when keeping all of them does not do it.
    Bisection (module doc). ``closure(keep)``: the nodes the pass keeps when asked to keep
    ``keep`` (with the nodes that follow their inputs' precision)."""
    refs = [m.reference for m in measured]

    def ok(k: int) -> bool:
        keep = closure(pinned | set(ranked[:k]))
        return within(refs, [probe.run(m.feed, keep) for m in measured])

    n = len(ranked)
    if not within(refs, [m.kept_outputs for m in measured]):
        return None
    if pinned and ok(0):
        return 0
    lo, hi = 0, n  # ok(lo) fails, ok(hi) holds
    step = max(1, n // RESOLUTION)
    while hi - lo > step:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi

