"""Measured profitability: when the target is this machine, time a pass's result and keep it
only if it is not slower (Inductor benchmarks its pad_mm choices the same way).

The cost model decides first; this guard catches where its constants are wrong for the CPU at
hand (e.g. dynamic INT8 on small GEMMs, whose per-call activation quantization the roofline
under-counts). Passes the user forced (``pad="always"``...) are never measured away.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from graphopt.backends.timing import Measured, not_slower

__all__ = ["faster_or_equal"]

_BUDGET_S = 1.0  # per candidate: keeps optimize() fast for big models
_MIN_RUNS = 3
_ROUNDS = 2


def faster_or_equal(before: Callable[..., Any], after: Callable[..., Any],
                    args: tuple[Any, ...]) -> Measured:
    """(keep, t_before, t_after) and the speedup's interval: paired, interleaved rounds of
    both modules (``backends/timing``)."""
    with torch.no_grad():
        return not_slower(lambda: before(*args), lambda: after(*args), rounds=_ROUNDS,
                          budget_s=_BUDGET_S, min_runs=_MIN_RUNS)
