"""Best-of-n wall-clock timing, shared by the torch and ONNX measured-profitability guards."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["NOISE", "best_time", "not_slower"]

#: a candidate may be at most this much slower and still count as not slower (timer and
#: scheduler noise on a shared host)
NOISE = 0.03


def best_time(call: Callable[[], Any], *, budget_s: float, min_runs: int, max_runs: int
              ) -> float:
    """Best-of-n seconds of ``call()`` after one warm-up call (the minimum is the least noisy
    estimate on a busy host); stops after ``min_runs`` once ``budget_s`` is spent."""
    call()  # warm-up: primitive caches, allocator, prepacked weights, thread pool
    best, spent = float("inf"), 0.0
    for i in range(max_runs):
        t = time.perf_counter()
        call()
        dt = time.perf_counter() - t
        best, spent = min(best, dt), spent + dt
        if i + 1 >= min_runs and spent > budget_s:
            break
    return best


def not_slower(before: Callable[[], Any], after: Callable[[], Any], *, rounds: int,
               budget_s: float, min_runs: int, max_runs: int) -> tuple[bool, float, float]:
    """(keep, t_before, t_after): interleaved rounds, so drift from other jobs hits both."""
    tb = ta = float("inf")
    for _ in range(rounds):
        tb = min(tb, best_time(before, budget_s=budget_s, min_runs=min_runs,
                               max_runs=max_runs))
        ta = min(ta, best_time(after, budget_s=budget_s, min_runs=min_runs,
                               max_runs=max_runs))
    return ta <= tb * (1 + NOISE), tb, ta
