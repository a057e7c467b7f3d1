"""Predicted against measured: per-node ratios, rank correlation, and the plan that carries them.

The numbers (``summary.prediction``):

1. ``spearman``: rank correlation of predicted and measured time over the nodes with both
   numbers positive. It asks whether the cost model orders the nodes right, which is what the
   planner's decisions rest on, whatever the absolute scale.
2. ``median_ratio``: the median of predicted / measured over the same nodes (1 is exact;
   below 1 the model is too fast).
3. ``model_ratio``: the plan's estimated latency (the sum of its nodes) over the measured
   time of one whole run of the planned graph, as graphopt emits it (torch: the traced
   graph as a module; ONNX: the session), timed without the profiler.
4. ``module_ratio`` (torch): the same estimate over the user's own module as called. The
   difference is the Python the module runs around its graph (a framework's argument
   handling, mask building, output classes): real time, but in no graph, so no plan sees it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from graphopt.ir.plan import Plan
from graphopt.ir.plan_summary import Prediction

__all__ = ["Measured", "prediction_summary", "spearman", "with_measurements"]


@dataclass(frozen=True)
class Measured:
    """What one profile run found: per-node median seconds and the whole model's."""

    per_node: Mapping[str, float]
    model_s: float
    runs: int
    warmup: int
    method: str
    #: intra-op threads the runtime used (None: its default)
    threads: int | None = None
    notes: tuple[str, ...] = field(default=())
    #: the user's own module, timed as called (torch only; ``model_s`` is the graph's)
    module_s: float | None = None


def _ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, ties get their average rank (as Spearman's rho needs)."""
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), dtype=float)
    ranks[order] = np.arange(1, len(x) + 1, dtype=float)
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    return sums[inverse] / counts[inverse]


def spearman(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Spearman's rank correlation; None with fewer than 3 pairs or a constant side."""
    if len(a) != len(b) or len(a) < 3:
        return None
    ra, rb = _ranks(np.asarray(a, float)), _ranks(np.asarray(b, float))
    if np.ptp(ra) == 0 or np.ptp(rb) == 0:
        return None
    return float(np.corrcoef(ra, rb)[0, 1])


def prediction_summary(pairs: Sequence[tuple[float, float]], est_latency_s: float,
                       measured: Measured) -> Prediction:
    """``summary.prediction`` from (predicted, measured) per node; see the module doc."""
    both = [(p, m) for p, m in pairs if p > 0 and m > 0]
    ratios = [p / m for p, m in both]
    rho = spearman([p for p, _ in both], [m for _, m in both])
    module = measured.module_s
    return Prediction(
        spearman=None if rho is None else round(rho, 6),
        median_ratio=float(np.median(ratios)) if ratios else None,
        model_ratio=est_latency_s / measured.model_s if measured.model_s > 0 else None,
        nodes_measured=len(both),
        measured_model_s=measured.model_s,
        module_ratio=None if module is None else est_latency_s / module if module > 0 else None,
        measured_module_s=module,
        measured_nodes_s=sum(m for _, m in pairs if m > 0),
        runs=measured.runs, warmup=measured.warmup, threads=measured.threads,
        method=measured.method)


def with_measurements(plan: Plan, measured: Measured) -> Plan:
    """``plan`` with each measured node's ``measured_s`` and ``summary.prediction``."""
    nodes = tuple(replace(n, measured_s=measured.per_node[n.name])
                  if n.name in measured.per_node else n for n in plan.nodes)
    pairs = [(n.cost.est_time_s, n.measured_s) for n in nodes if n.measured_s is not None]
    summary = replace(plan.summary, prediction=prediction_summary(pairs, plan.est_latency_s,
                                                                  measured))
    missing = sum(1 for n in nodes if n.measured_s is None)
    notes = list(measured.notes)
    if missing:
        notes.append(f"{missing} of {len(nodes)} plan nodes were not seen by the profiler "
                     "(e.g. inside a subgraph the runtime runs as one op); they have no "
                     "measured_s")
    return replace(plan, nodes=nodes, summary=summary, warnings=(*plan.warnings, *notes))

