"""The paired timing (``backends/timing.compare_paired``) stops once its keep decision is
settled: on a fake clock that each call advances by its own duration (no real timing here),
a constant 1.01x speedup (a tie at the 3% margin) stops after the minimum rounds, a constant
1.25x likewise (faster), and a noisy one goes on to the round limit; a slow call is timed once
per round."""

from __future__ import annotations

import itertools

import pytest

from graphopt.backends import timing


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run(monkeypatch, before_s, after_s, calls: list[int] | None = None) -> timing.Measured:
    clock = FakeClock()
    monkeypatch.setattr(timing.time, "perf_counter", clock)

    def call(seconds):
        def once() -> None:
            clock.now += next(seconds)
            if calls is not None:
                calls.append(1)
        return once

    return timing.compare_paired(call(before_s), call(after_s), min_rounds=5, max_rounds=15,
                                 budget_s=100.0, runs=3)


@pytest.mark.parametrize(("speedup", "verdict"), [(1.01, "tie"), (1.25, "faster"),
                                                  (0.8, "slower")])
def test_a_settled_decision_stops_at_the_minimum_rounds(monkeypatch, speedup, verdict) -> None:
    got = run(monkeypatch, itertools.repeat(0.01 * speedup), itertools.repeat(0.01))
    assert (got.verdict, got.rounds) == (verdict, 5)
    assert got.keep == (verdict == "faster")


def test_an_unsettled_one_goes_on_to_the_round_limit(monkeypatch) -> None:
    """Speedups alternating 0.9x and 1.2x round by round: the interval straddles 1.03."""
    before = itertools.cycle([0.009] * 4 + [0.012] * 4)  # warm-up, 3 runs, then per round
    got = run(monkeypatch, before, itertools.repeat(0.01))
    assert got.rounds == 15 and got.verdict == "tie" and not got.keep


def test_a_slow_call_is_timed_once_per_round(monkeypatch) -> None:
    """Calls of 50 ms: a warm-up each, then one call per candidate and round (best of 3 for
    short calls, above); past the minimum rounds, best of 3 again."""
    calls: list[int] = []
    got = run(monkeypatch, itertools.repeat(0.05 * 1.25), itertools.repeat(0.05), calls)
    assert (got.verdict, got.rounds) == ("faster", 5)
    assert len(calls) == 2 + 2 * 5
    short: list[int] = []
    run(monkeypatch, itertools.repeat(0.0125), itertools.repeat(0.01), short)
    assert len(short) == 2 + 2 * 3 * 5
    noisy: list[int] = []
    before = itertools.cycle([0.045, 0.06])  # 0.9x and 1.2x by turns: unsettled at 5 rounds
    got = run(monkeypatch, before, itertools.repeat(0.05), noisy)
    assert got.rounds > 5 and len(noisy) == 2 + 2 * 5 + 2 * 3 * (got.rounds - 5)


def test_the_onnx_pass_timing_sessions_do_not_spin(monkeypatch) -> None:
    """Both sessions the ONNX pass timing runs by turns are made with ORT's spinning off
    (``backends/onnx/measure``: one's spinning threads slowed the other's next run): the
    setup's session of the original (the timing's "before") and the pass's candidate."""
    from types import SimpleNamespace

    import numpy as np
    import torch

    from graphopt.backends.onnx import backend as onnx_backend
    from graphopt.backends.onnx import ort_runner
    from graphopt.backends.onnx.backend import OnnxBackend
    from graphopt.backends.onnx.pipeline import optimize_onnx
    from graphopt.frontends.onnx_export import export_torch

    made: list[str] = []
    real = ort_runner.OrtModel.__init__

    def init(self, model, providers=None, what="the model", options=None) -> None:
        try:
            spin = options.get_session_config_entry("session.intra_op.allow_spinning")
        except (AttributeError, RuntimeError):  # no options, or the entry is not set
            spin = None
        made.append(f"{what}: {spin}")
        real(self, model, providers, what, options)

    monkeypatch.setattr(ort_runner.OrtModel, "__init__", init)
    monkeypatch.setattr(onnx_backend.onnx_measure, "not_slower", lambda *a, **k: None)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU()).eval()
    proto = export_torch(model, torch.randn(4, 16)).model
    optimize_onnx(proto, "cpu", samples=[{proto.graph.input[0].name:
                                          np.ones((4, 16), np.float32)}])
    assert "the original model: 0" in made, made
    backend = OnnxBackend(SimpleNamespace(samples=[{}]), proto, [])
    del made[:]
    backend.time(proto, proto)  # the candidate's session, and one of "before" (none given)
    assert made == ["a timing candidate: 0"] * 2
