"""Time several runnables of one model against each other, interleaved, for the deploy choice
(``decisions/deploy/artifact.py``, case 2), within a time budget.

Each round runs every candidate best-of-n (:func:`graphopt.backends.timing.best_time`, after a
warm-up) in an order rotated by one each round, so drift from other jobs on a shared host hits
every candidate alike. Each candidate's best of each round is kept, paired by round with the
others' (``decisions/confidence`` reads their ratios). Sequential timings on the 2-core hosts
here swing by 15%; the ratios within a round far less.

Why a budget (issue 34, item 3: ``optimize`` within 20 s): rounds of a fixed 0.15 s per
candidate took 14 s of BERT's 34 s. Now rounds are fitted into :data:`TIMING_BUDGET_S` for
:data:`ROUNDS` of them from one probe call per candidate (a slow model gets fewer calls per
round, never fewer rounds). From :data:`MIN_ROUNDS` on, the timing stops as soon as the choice
is settled (``decisions/deploy/artifact.unsettled``: a tie between two losers does not count;
candidates 2x apart settle in 4 rounds), and goes on while it could still change, up to
:data:`MAX_ROUNDS`, and only where the next round would end within :data:`MAX_TIMING_S`. The
user's original model is timed in the first :data:`ROUNDS` rounds at most: it is the report's
point of comparison, never a choice.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from graphopt.backends.timing import best_time, call_seconds
from graphopt.decisions.deploy.artifact import ArtifactTiming, unsettled

__all__ = ["MAX_ROUNDS", "MAX_TIMING_S", "MIN_ROUNDS", "ORIGINAL", "ROUNDS", "TIMING_BUDGET_S",
           "Settled", "settled_rounds"]

ROUNDS = 7  # paired rounds the budget is shared over (decisions/confidence: a 95% interval)
#: the fewest rounds a settled choice stops after: t = 3.18 at 3 degrees of freedom, so only
#: candidates far apart with steady rounds settle this early
MIN_ROUNDS = 4
#: the most interleaved rounds the deploy timing takes before it says the machine is too busy
MAX_ROUNDS = 28
#: the first ROUNDS rounds of every candidate together aim at this many seconds
TIMING_BUDGET_S = 3.0
#: rounds past ROUNDS (an unsettled choice) only where they end within this many seconds
MAX_TIMING_S = 8.0
#: the key of the user's original model among the calls (timed in the first rounds only)
ORIGINAL = "original"
_BUDGET_S = 0.15  # per candidate and round, at most
_MIN_BUDGET_S = 0.01
_MIN_RUNS, _MAX_RUNS = 3, 100


@dataclass(frozen=True)
class Settled:
    """What :func:`settled_rounds` measured: each call's best seconds per round (the original
    has only the first rounds'), the rows with their times, and how it went."""

    per_round: dict[str, list[float]]
    rows: tuple[ArtifactTiming, ...]
    seconds: float
    runs_per_round: int

    @property
    def rounds(self) -> int:
        return max((len(t) for t in self.per_round.values()), default=0)

    @property
    def original_s(self) -> float | None:
        times = self.per_round.get(ORIGINAL)
        return min(times) if times else None


def settled_rounds(calls: Mapping[str, Callable[[], Any]], rows: Mapping[str, ArtifactTiming],
                   *, budget_s: float = TIMING_BUDGET_S, max_s: float = MAX_TIMING_S,
                   max_rounds: int = MAX_ROUNDS) -> Settled:
    """Interleaved rounds of ``calls`` (module doc) until the choice is settled (the noise
    decides how many); ``rows`` (artifact -> its row) get the times of the call of the same
    name."""
    start = time.perf_counter()
    probe = max(call_seconds(call) for call in calls.values())  # also each one's first warm-up
    each = min(_BUDGET_S, max(_MIN_BUDGET_S, budget_s / (ROUNDS * len(calls))))
    # a call longer than its share of the round is timed once after its warm-up, whatever
    # the share (best_time would go on while its budget lasts)
    runs = _MIN_RUNS if probe * _MIN_RUNS <= each else 1
    each = each if runs > 1 else 0.0
    per_round: dict[str, list[float]] = {name: [] for name in calls}
    done = 0
    while True:
        round_start = time.perf_counter()
        # the original is the report's point of comparison: the first rounds do
        active = [n for n in calls if n != ORIGINAL or done < ROUNDS]
        for name in active[done % len(active):] + active[:done % len(active)]:
            per_round[name].append(best_time(calls[name], budget_s=each, min_runs=runs,
                                             max_runs=_MAX_RUNS))
        done += 1
        timed = tuple(replace(r, seconds=min(per_round[a]), rounds=tuple(per_round[a]))
                      if per_round.get(a) else r for a, r in rows.items())
        now = time.perf_counter()
        spent, last = now - start, now - round_start
        if done >= max_rounds or (done >= MIN_ROUNDS and not unsettled(timed)) or \
                (done >= ROUNDS and spent + last > max_s):  # the next round would end late
            return Settled(per_round, timed, spent, runs)
