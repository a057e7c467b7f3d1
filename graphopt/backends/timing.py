"""Paired, interleaved timing with a stated confidence, shared by the torch and ONNX
measured-profitability guards.

Why paired: on a machine busy with other jobs, two best-of-n timings taken one after the other
differ by 15% or more, and a keep/revert decided on them flipped between runs of one command
(auto INT8 reverted in 2 of 6 runs, "0.86x", where an interleaved timing showed it 1.22-1.37x
faster). So each round times both candidates back to back, in alternating order (ABBA), and
the decision reads the rounds' speedups (before / after) as a sample: the mean log speedup
with a 95% Student-t interval. Rounds continue while the interval straddles ``1 + margin`` and
the time budget lasts; a busy machine widens the interval instead of tipping the answer. (They
went on while it straddled 1 too, which decides only between "tie" and "slower", the same
revert: ResNet-50's tied layout pass took its whole 4 s budget.)

The verdict: ``faster`` when the whole interval is above ``1 + margin``, ``slower`` when it
is below 1, else ``tie``. A tie keeps the simpler choice (the caller's default: fewer passes),
and says so with the interval.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from graphopt.decisions.deploy.confidence import clears, speedup_interval

__all__ = ["NOISE", "SLOW_CALL_S", "Measured", "best_time", "call_seconds", "compare_paired",
           "not_slower"]

#: a call this long (a warm-up's, an overestimate) is timed once per round until the minimum
#: rounds are in: ResNet-50's 90 ms calls spent 3 s on each paired timing at best of 3, and a
#: clear verdict needs no more. An unsettled one goes on at best of n. (One call a round once
#: left BERT's and the Llama's ONNX INT8 pass a tie: ORT's spinning threads, since turned off
#: for the timed sessions, ``backends/onnx/measure``)
SLOW_CALL_S = 0.03
#: a candidate's speedup must clear this margin with 95% confidence to change a default, and
#: the deploy choice's margin between artifacts (a timer's and scheduler's noise on a host)
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


@dataclass(frozen=True)
class Measured:
    """One paired comparison: the verdict, each candidate's best time, and the 95% interval
    of the speedup (before / after). Unpacks as ``(keep, before_s, after_s)``."""

    keep: bool
    before_s: float
    after_s: float
    low: float
    high: float
    rounds: int
    verdict: str  # "faster" | "tie" | "slower"

    def __iter__(self) -> Iterator[Any]:
        yield from (self.keep, self.before_s, self.after_s)

    def interval(self) -> str:
        return f"{self.low:.2f}-{self.high:.2f}x at 95% over {self.rounds} rounds"

    def to_dict(self) -> dict[str, Any]:
        return {"before_s": self.before_s, "after_s": self.after_s, "kept": self.keep,
                "verdict": self.verdict, "speedup_low": self.low, "speedup_high": self.high,
                "rounds": self.rounds}


def compare_paired(before: Callable[[], Any], after: Callable[[], Any], *,
                   margin: float = NOISE, min_rounds: int = 5, max_rounds: int = 15,
                   budget_s: float = 2.0, runs: int = 3) -> Measured:
    """Paired rounds (module doc) until the interval clears ``1 + margin`` or 1, or the
    rounds or ``budget_s`` run out; ``keep`` is the verdict ``faster``. ``runs`` calls per
    candidate and round (best of them); where a call takes :data:`SLOW_CALL_S` or more, one
    in each of the first ``min_rounds``, and ``runs`` only once those leave it unsettled."""
    # warm-up: caches, allocator, prepacked weights, thread pool; its time sizes the rounds
    slow = min(call_seconds(before), call_seconds(after)) >= SLOW_CALL_S
    pairs: tuple[list[float], list[float]] = ([], [])
    start = time.perf_counter()
    low, high = 0.0, math.inf
    for i in range(max_rounds):
        order = ((0, before), (1, after)) if i % 2 == 0 else ((1, after), (0, before))
        got = [math.inf, math.inf]
        for k, call in order:
            for _ in range(1 if slow and i < min_rounds else runs):
                t = time.perf_counter()
                call()
                got[k] = min(got[k], time.perf_counter() - t)
        pairs[0].append(got[0])
        pairs[1].append(got[1])
        low, high = speedup_interval(*pairs)
        # the keep decision is settled once the interval is wholly above 1 + margin, or wholly
        # below it (a tie or slower: more rounds would only say which)
        settled = clears((low, high), margin) or high < 1 + margin
        if i + 1 >= min_rounds and (settled or time.perf_counter() - start > budget_s):
            break
    verdict = "faster" if clears((low, high), margin) else "slower" if high < 1 else "tie"
    return Measured(verdict == "faster", min(pairs[0]), min(pairs[1]), low, high,
                    len(pairs[0]), verdict)


def call_seconds(call: Callable[[], Any]) -> float:
    """Seconds of one ``call()`` (a warm-up that also sizes what follows)."""
    t = time.perf_counter()
    call()
    return time.perf_counter() - t


def not_slower(before: Callable[[], Any], after: Callable[[], Any], *, rounds: int,
               budget_s: float, min_runs: int) -> Measured:
    """:func:`compare_paired` with a pass guard's knobs: ``rounds`` at least, ``budget_s`` per
    candidate and round, ``min_runs`` timed calls per candidate per round."""
    return compare_paired(before, after, min_rounds=max(rounds, 5),
                          max_rounds=max(3 * rounds, 15), budget_s=2 * rounds * budget_s,
                          runs=max(1, min(min_runs, 3)))
