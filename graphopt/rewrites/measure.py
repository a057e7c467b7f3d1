"""Measured profitability: when the target is this machine, time a pass's result and keep it
only if it is not slower (Inductor benchmarks its pad_mm choices the same way).

The cost model decides first; this guard catches where its constants are wrong for the CPU at
hand (e.g. dynamic INT8 on small GEMMs, whose per-call activation quantization the roofline
under-counts). Passes the user forced (``pad="always"``...) are never measured away.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["faster_or_equal", "time_module"]

_BUDGET_S = 1.0  # per candidate: keeps optimize() fast for big models
_MIN_RUNS, _MAX_RUNS = 3, 25
_NOISE = 0.03  # a candidate must not be more than 3% slower (timer and scheduler noise)


def time_module(fn: Callable[..., Any], args: tuple[Any, ...], budget_s: float = _BUDGET_S
                ) -> float:
    """Best-of-n seconds of ``fn(*args)`` (min is the least noisy estimate on a busy host)."""
    best = float("inf")
    spent = 0.0
    with torch.no_grad():
        fn(*args)  # warm-up: oneDNN primitive caches, allocator
        for i in range(_MAX_RUNS):
            t = time.perf_counter()
            fn(*args)
            dt = time.perf_counter() - t
            best, spent = min(best, dt), spent + dt
            if i + 1 >= _MIN_RUNS and spent > budget_s:
                break
    return best


def faster_or_equal(before: Callable[..., Any], after: Callable[..., Any],
                    args: tuple[Any, ...]) -> tuple[bool, float, float]:
    """(keep, t_before, t_after): interleaved best-of timing of both modules."""
    tb = ta = float("inf")
    for _ in range(2):  # interleave so drift hits both
        tb = min(tb, time_module(before, args))
        ta = min(ta, time_module(after, args))
    return ta <= tb * (1 + _NOISE), tb, ta
