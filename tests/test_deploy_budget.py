"""The deploy choice within its time (issue 34, item 3): timing rounds fitted to a budget,
torch.compile built only where it could win, and an ONNX input's measured choice between
ONNX Runtime and OpenVINO.

Timings are never asserted beyond being positive: which artifact wins depends on the machine.
Where a test needs one verdict (compile built or not), it pins ``compile_reach.COMPILE_REACH``.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

import graphopt
from graphopt.api import compile_reach, deploy
from graphopt.api.deploy import NO_DEPLOY_MEASURE_ENV
from graphopt.backends.onnx.result import OnnxResult
from graphopt.decisions.deploy.artifact import Artifact, ArtifactTiming, unsettled
from graphopt.files import progress as prog
from graphopt.frontends.onnx_export import export_torch
from graphopt.measure import deploy_runs
from graphopt.measure.deploy_runs import ORIGINAL, ROUNDS, settled_rounds
from tests import test_progress

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning",
                                        "ignore::DeprecationWarning")

HAS_OPENVINO = importlib.util.find_spec("openvino") is not None
terminal = test_progress.terminal  # the fixture: a terminal as graphopt's stderr


def mlp() -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 32))
    return m.eval(), (torch.randn(8, 64),)


def sleeper(seconds: float, counter: dict[str, int], name: str):
    def call() -> None:
        counter[name] = counter.get(name, 0) + 1
        time.sleep(seconds)
    return call


def rows(*names: str) -> dict[str, ArtifactTiming]:
    return {n: ArtifactTiming(Artifact(n), None, True) for n in names}


# --- the timing rounds --------------------------------------------------------------------

def test_a_slow_model_is_timed_once_per_round_and_the_original_in_the_first_rounds_only(
        monkeypatch):
    monkeypatch.setattr(deploy_runs, "unsettled", lambda rows: True)  # never settles early
    counts: dict[str, int] = {}
    calls = {ORIGINAL: sleeper(0.02, counts, ORIGINAL),
             "torch": sleeper(0.02, counts, "torch"),
             "onnxruntime": sleeper(0.02, counts, "onnxruntime")}
    got = settled_rounds(calls, rows("torch", "onnxruntime"), budget_s=0.1, max_s=0.5)
    assert got.runs_per_round == 1  # 20 ms is more than its share of a 0.1 s budget
    assert len(got.per_round[ORIGINAL]) == ROUNDS  # the report's comparison, then dropped
    assert got.rounds >= ROUNDS and len(got.per_round["torch"]) == got.rounds
    # a probe call, then a warm-up and one timed call per round
    assert counts["torch"] == 1 + 2 * got.rounds and counts[ORIGINAL] == 1 + 2 * ROUNDS
    assert got.original_s is not None and got.original_s >= 0.02
    assert all(r.seconds and r.seconds >= 0.02 and len(r.rounds) == got.rounds
               for r in got.rows)


def test_a_settled_choice_stops_after_the_fewest_rounds():
    """Candidates 3x apart in steady rounds: the choice is settled at :data:`MIN_ROUNDS`,
    the original timed as often, and no later round is run."""
    counts: dict[str, int] = {}
    calls = {ORIGINAL: sleeper(0.03, counts, ORIGINAL), "torch": sleeper(0.03, counts, "torch"),
             "onnxruntime": sleeper(0.01, counts, "onnxruntime")}
    got = settled_rounds(calls, rows("torch", "onnxruntime"), budget_s=0.1, max_s=5.0)
    assert got.rounds == deploy_runs.MIN_ROUNDS < ROUNDS
    assert len(got.per_round[ORIGINAL]) == got.rounds
    assert not unsettled(got.rows)


def test_an_unsettled_choice_stops_before_the_time_limit(monkeypatch):
    """A choice that never settles (pinned: real timings settle at random) takes more rounds
    only while the next one would end within ``max_s``, not up to the round limit."""
    monkeypatch.setattr(deploy_runs, "unsettled", lambda rows: True)
    counts: dict[str, int] = {}
    calls = {"torch": sleeper(0.005, counts, "torch"),
             "onnxruntime": sleeper(0.005, counts, "onnxruntime")}
    got = settled_rounds(calls, rows("torch", "onnxruntime"), budget_s=0.05, max_s=0.6,
                         max_rounds=10_000)
    one_round = 2 * 2 * 0.005  # two candidates, a warm-up and a call each
    assert got.rounds > ROUNDS
    assert 0.6 - 2 * one_round <= got.seconds <= 0.6 + one_round, got.seconds


def timing(artifact: str, rounds: list[float]) -> ArtifactTiming:
    return ArtifactTiming(Artifact(artifact), min(rounds), True, rounds=tuple(rounds))


def test_a_tie_between_two_losers_does_not_keep_the_timing_going():
    """torch and torch.compile tie, ONNX Runtime beats both clearly: the choice is settled."""
    noisy = [1.0, 1.05, 0.97, 1.02, 1.0, 0.99, 1.04]
    got = (timing("torch", [0.010] * 7), timing("torch.compile", [0.010 * f for f in noisy]),
           timing("onnxruntime", [0.005 * f for f in noisy[::-1]]))
    assert not unsettled(got)


def test_a_pick_within_noise_of_another_keeps_the_timing_going():
    noisy = [1.0, 1.08, 0.95, 1.06, 0.97, 1.02, 1.01]
    # ONNX Runtime 3% faster than torch, within the rounds' noise: more rounds may separate
    close = (timing("torch", [0.010] * 7), timing("onnxruntime", [0.0097 * f for f in noisy]))
    assert unsettled(close)
    # OpenVINO within noise of the pick (ONNX Runtime, clearly ahead of torch)
    later = (timing("torch", [0.010] * 7), timing("onnxruntime", [0.005] * 7),
             timing("openvino", [0.0049 * f for f in noisy]))
    assert unsettled(later)


def test_a_fast_model_gets_best_of_several_calls_per_round():
    counts: dict[str, int] = {}
    calls = {"torch": sleeper(0.0, counts, "torch"), "onnxruntime": sleeper(0.0, counts, "x")}
    got = settled_rounds(calls, rows("torch", "onnxruntime"), budget_s=0.2, max_s=1.0)
    assert got.runs_per_round == 3


# --- torch.compile, built where it could win ----------------------------------------------

@pytest.fixture
def measured(monkeypatch):
    monkeypatch.setenv(NO_DEPLOY_MEASURE_ENV, "0")
    monkeypatch.setattr(deploy_runs, "TIMING_BUDGET_S", 0.3)


def test_torch_compile_out_of_reach_is_never_built(monkeypatch, measured):
    def never(*_):
        raise AssertionError("torch.compile was built, or its module profiled")

    monkeypatch.setattr(deploy, "_compile", never)
    monkeypatch.setattr(compile_reach, "COMPILE_REACH", 1e-9)  # nothing is ever in reach
    monkeypatch.setattr(compile_reach, "opaque_op_seconds", never)  # nor profiled then
    m, x = mlp()
    opt = graphopt.optimize(m, x, target="cpu", precision="fp32")
    row = next(r for r in opt.deploy.candidates if r.artifact == "torch.compile")
    assert row.error.startswith("not built:") and "fusion estimate" in row.error, row
    assert opt.deploy.artifact != "torch.compile" and "torch.compile" not in opt.deployed_runners
    with torch.no_grad():
        ref = m(*x)
    torch.testing.assert_close(torch.as_tensor(np.asarray(_first(opt.deployed()(*x)))), ref,
                               rtol=1e-4, atol=1e-5)


def test_torch_compile_in_reach_is_built_checked_and_timed(monkeypatch, measured):
    monkeypatch.setattr(compile_reach, "COMPILE_REACH", 1e9)  # always in reach
    built: list[bool] = []
    real = deploy._compile

    def spy(opt):
        built.append(True)
        return real(opt)

    monkeypatch.setattr(deploy, "_compile", spy)
    m, x = mlp()
    opt = graphopt.optimize(m, x, target="cpu", precision="fp32")
    row = next(r for r in opt.deploy.candidates if r.artifact == "torch.compile")
    assert built == [True]
    if row.error is None:  # Inductor needs a C++ compiler; its failure is reported instead
        assert row.within is True and row.seconds and row.seconds > 0


def test_the_users_model_as_torch_artifact_is_timed_once(monkeypatch, measured):
    """When no pass changed the model, the torch artifact is a copy of it: the deploy timing
    times it once, and its times are the original's."""
    timed: list[list[str]] = []
    real = deploy.settled_rounds

    def spy(calls, rows, **kw):
        timed.append(list(calls))
        return real(calls, rows, **kw)

    monkeypatch.setattr(deploy, "settled_rounds", spy)
    m = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Tanh()).eval()
    opt = graphopt.optimize(m, torch.randn(4, 8), target="cpu")
    assert any(r.name == "all" for r in opt.info.passes_reverted)
    assert len(timed) == 1 and ORIGINAL not in timed[0] and "torch" in timed[0]
    torch_row = next(r for r in opt.deploy.candidates if r.artifact == "torch")
    assert opt.deploy.original_s == torch_row.seconds > 0


def _first(out):
    return out[0] if isinstance(out, (list, tuple)) else out


# --- an ONNX input: ONNX Runtime or OpenVINO, measured ------------------------------------

@pytest.mark.skipif(not HAS_OPENVINO, reason="openvino is not installed")
def test_an_onnx_input_measures_onnxruntime_against_openvino(measured, tmp_path: Path):
    m, x = mlp()
    path = tmp_path / "m.onnx"
    onnx.save(export_torch(m, x).model, str(path))
    before = path.read_bytes()
    opt = graphopt.optimize(str(path), target="cpu")
    d = opt.deploy
    assert d.measured and d.original_s and d.original_s > 0
    assert [r.artifact for r in d.candidates] == ["onnxruntime", "openvino"]
    assert all(r.within is True and r.seconds and r.seconds > 0 for r in d.candidates), \
        d.candidates
    ov = d.candidates[1]
    assert "OpenVINO" in ov.note and "cosine" in ov.note
    assert "against the original model in a default ONNX Runtime session" in d.method
    # the original and the guard's data are not kept
    assert not any(isinstance(v, OnnxResult) for v in vars(opt).values())
    with torch.no_grad():
        ref = m(*x)
    for runner in opt.deployed_runners.values():  # both candidates give the original's numbers
        out = runner.session.run(None, {runner.session.get_inputs()[0].name: x[0].numpy()})
        np.testing.assert_allclose(out[0], ref.numpy(), rtol=1e-4, atol=1e-5)
    opt.save_deploy(tmp_path / "out")
    loaded = graphopt.load(tmp_path / "out")
    got = _first(loaded(x[0].numpy())) if d.artifact == "openvino" else \
        loaded.run(None, {loaded.get_inputs()[0].name: x[0].numpy()})[0]
    np.testing.assert_allclose(got, ref.numpy(), rtol=1e-4, atol=1e-5)
    assert path.read_bytes() == before  # the user's file is never changed


def test_an_onnx_input_without_openvino_says_why_and_deploys_onnxruntime(monkeypatch, measured,
                                                                         tmp_path: Path):
    from graphopt.backends.openvino import runner as ov_runner

    def missing():
        raise graphopt.GraphoptError("openvino is not installed",
                                     "pip install openvino (or graphopt[cpu])")

    monkeypatch.setattr(ov_runner, "_core", missing)
    m, x = mlp()
    path = tmp_path / "m.onnx"
    onnx.save(export_torch(m, x).model, str(path))
    opt = graphopt.optimize(str(path), target="cpu")
    ov = next(r for r in opt.deploy.candidates if r.artifact == "openvino")
    assert opt.deploy.artifact == "onnxruntime" and "openvino is not installed" in ov.error


# --- progress from the Python API ---------------------------------------------------------

def test_the_deploy_steps_show_progress_on_a_terminal(monkeypatch, measured, terminal):
    """``optimize`` from Python says which candidate it builds and that it times them (issue
    35, item 4): the steps that took most of its time without a word."""
    monkeypatch.setattr(prog, "DELAY_S", 0.0)
    monkeypatch.setattr(compile_reach, "COMPILE_REACH", 1e-9)  # no compile: the test stays short
    m, x = mlp()
    graphopt.optimize(m, x, target="cpu", precision="fp32")
    shown = terminal.getvalue()
    assert "graphopt: building the onnxruntime candidate" in shown
    assert "graphopt: timing" in shown and "candidate(s)" in shown
    prog.set_quiet(True)
    try:
        terminal.seek(0)
        terminal.truncate()
        graphopt.optimize(m, x, target="cpu", precision="fp32")
        assert terminal.getvalue() == ""  # quiet: nothing
    finally:
        prog.set_quiet(False)


# --- torch.compile's best case: ops it cannot make faster -----------------------------------

def test_the_ops_compile_leaves_as_they_are_are_measured():
    """A dynamically quantized Linear (``quantized::linear_dynamic``, as graphopt's torch INT8
    pass emits) is most of this module's time; a float one counts nothing."""
    from graphopt.api.compile_reach import opaque_op_seconds

    torch.manual_seed(0)
    lin = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU()).eval()
    quant = torch.ao.quantization.quantize_dynamic(lin, {torch.nn.Linear}, dtype=torch.qint8)
    x = torch.randn(64, 1024)
    with torch.inference_mode():
        quant(x)
        start = time.perf_counter()
        quant(x)
        whole = time.perf_counter() - start
    assert 0.3 * whole < opaque_op_seconds(quant, (x,)) < 3 * whole
    assert opaque_op_seconds(lin, (x,)) == 0.0


def _opt_with_fusion(ratio: float):
    from types import SimpleNamespace

    fusion = SimpleNamespace(est_latency_fused_s=ratio, est_latency_unfused_s=1.0)
    return SimpleNamespace(plan=SimpleNamespace(fusion=fusion), module=None)


@pytest.mark.parametrize(("opaque_share", "built"), [(0.0, True), (0.8, False)])
def test_compile_is_out_of_reach_when_its_opaque_ops_alone_lose(monkeypatch, opaque_share,
                                                                built):
    """torch 30 ms, ONNX Runtime 27 ms, the plan's fusion estimate 0.95: compile's best case is
    0.95 / 1.25 of the module's time (23 ms, in reach), unless 80% of it runs in ops compile
    leaves as they are (24 ms of them + 6 ms x 0.95 / 1.25 = 28.6 ms: out of reach)."""
    from graphopt.api import compile_reach

    monkeypatch.setattr(compile_reach, "opaque_op_seconds", lambda m, a: 0.030 * opaque_share)
    counts: dict[str, int] = {}
    calls = {"torch": sleeper(0.030, counts, "torch"),
             "onnxruntime": sleeper(0.027, counts, "onnxruntime")}
    why = compile_reach.compile_out_of_reach(_opt_with_fusion(0.95), calls, ())
    assert (why is None) == built, why
    if not built:
        assert "ops Inductor leaves as they are" in why
