"""Time several runnables of one model against each other, interleaved, for the deploy choice
(``decisions/deploy/artifact.py``, case 2).

Each round runs every candidate best-of-n (:func:`graphopt.backends.timing.best_time`, after a
warm-up) in an order rotated by one each round, so drift from other jobs on a shared host hits
every candidate alike. Each candidate's best of each round is kept, paired by round with the
others' (``decisions/confidence`` reads their ratios). Sequential timings on the 2-core hosts
here swing by 15%; the ratios within a round far less.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from graphopt.backends.timing import best_time

__all__ = ["ROUNDS", "interleaved_rounds"]

ROUNDS = 7  # paired rounds: enough for a 95% interval (decisions/confidence)
_BUDGET_S = 0.15  # per candidate and round
_MIN_RUNS, _MAX_RUNS = 3, 100


def interleaved_rounds(calls: Mapping[str, Callable[[], Any]], *, rounds: int = ROUNDS,
                       budget_s: float = _BUDGET_S) -> dict[str, list[float]]:
    """name -> its best seconds of one call in each of ``rounds`` interleaved rounds (paired
    by round: ``decisions/confidence`` reads their ratios)."""
    names = list(calls)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(best_time(calls[name], budget_s=budget_s, min_runs=_MIN_RUNS,
                                         max_runs=_MAX_RUNS))
    return times

