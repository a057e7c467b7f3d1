"""The paired timing (``backends/timing.compare_paired``) times a slow call once per round after
the first, and a fast one ``runs`` times: the calls are counted on a fake clock that each call
advances by its own duration (no real timing in the test)."""

from __future__ import annotations

import pytest

from graphopt.backends import timing


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(("before_s", "per_round"), [(0.05, 1), (0.001, 3)])
def test_calls_per_round(monkeypatch, before_s: float, per_round: int) -> None:
    clock = FakeClock()
    monkeypatch.setattr(timing.time, "perf_counter", clock)
    calls = {"before": 0, "after": 0}

    def call(name: str, seconds: float):
        def run() -> None:
            calls[name] += 1
            clock.now += seconds
        return run

    got = timing.compare_paired(call("before", before_s), call("after", before_s / 1.25),
                                min_rounds=5, max_rounds=15, budget_s=100.0, runs=3)
    assert got.verdict == "faster" and got.rounds == 5  # a constant 1.25x settles at once
    assert got.before_s == pytest.approx(before_s)
    # one warm-up call, three in the first round, then per_round in each of the other four
    assert calls == {"before": 1 + 3 + 4 * per_round, "after": 1 + 3 + 4 * per_round}
