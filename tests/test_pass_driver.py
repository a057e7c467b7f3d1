"""The one pass driver on its own, with a fake backend whose model is one output value and a
run time: apply, check against the reference, measure, keep or revert with the reason."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import pytest

from graphopt.backends.driver import Pass, PassResult, ToleranceKind, run_passes
from graphopt.decisions.tolerance import Tolerance, tolerance_for
from graphopt.ir.decision_details import DropDetail, QuantizeDetail
from graphopt.ir.options import Options
from graphopt.ir.plan import Decision
from graphopt.ir.plan_run import PassReverted

REFERENCE = 2.0  # the original model's one output


@dataclass(frozen=True)
class Model:
    y: float  # its output
    t: float = 1.0  # its run time, seconds


@dataclass
class Ctx:
    options: Options = field(default_factory=Options)
    compute_dtype: str = "fp32"
    decisions: dict[str, dict[str, Decision]] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)


@dataclass
class FakeBackend:
    """Functional passes ``(model, ctx) -> Model | None``; a pass may also return a
    PassResult (a self-checking pass)."""

    ctx: Ctx = field(default_factory=Ctx)
    timed: list[tuple[float, float]] = field(default_factory=list)
    tolerances: dict[str, Tolerance] = field(default_factory=dict)

    def snapshot(self, model: Model) -> Model:
        return model

    def apply(self, p: Pass, model: Model, tol: Tolerance) -> PassResult[Model]:
        out = p.run(model, self.ctx)
        if isinstance(out, PassResult):
            return out
        return PassResult(model if out is None else out, out is not None)

    def check(self, p: Pass, model: Model, tol: Tolerance) -> str | None:
        self.tolerances[p.name] = tol
        err = abs(model.y - REFERENCE)
        limit = tol.rel_to_scale * abs(REFERENCE)
        return None if err <= limit else f"out of tolerance: {err:.3g} > {limit:.3g}"

    def time(self, before: Model, after: Model) -> tuple[bool, float, float]:
        self.timed.append((before.t, after.t))
        return after.t <= before.t, before.t, after.t


def _pass(name: str, dy: float = 0.0, dt: float = 0.0, *, fires: bool = True,
          tolerance: ToleranceKind | str = ToleranceKind.FP32, option: str | None = None
          ) -> Pass:
    """A pass that moves the output by ``dy`` (relative) and the run time by ``dt``, and records
    a decision on node "n" either way."""
    def run(model: Model, ctx: Ctx) -> Model | None:
        ctx.decisions.setdefault("n", {})[name] = Decision(  # the driver reads no detail
            reason=f"{name} here", detail=DropDetail(), applied=fires)
        return Model(model.y * (1 + dy), model.t + dt) if fires else None
    return Pass(name, run, tolerance, option)


def test_a_pass_that_fires_is_applied() -> None:
    backend = FakeBackend()
    out = run_passes(backend, Model(REFERENCE), [_pass("fold", 1e-7)], measure=False)
    assert out.applied == ["fold"] and out.reverted == []
    assert out.model == Model(REFERENCE * (1 + 1e-7))
    assert backend.ctx.decisions["n"]["fold"].applied
    assert out.tolerance == tolerance_for("fp32")


def test_a_pass_that_does_not_fire_is_neither_applied_nor_checked() -> None:
    backend = FakeBackend()
    out = run_passes(backend, Model(REFERENCE), [_pass("pad", fires=False, option="pad")],
                     measure=True)
    assert out.applied == [] and out.reverted == [] and out.model == Model(REFERENCE)
    assert backend.tolerances == {} and backend.timed == []
    d = backend.ctx.decisions["n"]["pad"]  # its "not applied" reason stays for the report
    assert not d.applied and d.reason == "pad here"


def test_out_of_tolerance_is_reverted_with_its_reason() -> None:
    backend = FakeBackend()
    out = run_passes(backend, Model(REFERENCE), [_pass("fold", 1e-7), _pass("bad", 1e-3)],
                     measure=False)
    assert out.applied == ["fold"] and out.model == Model(REFERENCE * (1 + 1e-7))
    assert out.reverted == [PassReverted("bad", "out of tolerance: 0.002 > 2e-05")]
    d = backend.ctx.decisions["n"]["bad"]
    assert not d.applied and d.reason == "out of tolerance: 0.002 > 2e-05 (bad here)"
    assert backend.ctx.decisions["n"]["fold"].applied


def test_measured_slower_is_reverted_and_the_timing_noted() -> None:
    backend = FakeBackend()
    passes = [_pass("layout", 1e-7, -0.5, option="layout"),
              _pass("pad", 1e-7, +0.25, option="pad")]
    out = run_passes(backend, Model(REFERENCE), passes, measure=True)
    assert out.applied == ["layout"] and out.model.t == 0.5
    assert out.reverted == [PassReverted("pad", "reverted, measured slower on this "
                                         "machine: 750 ms after vs 500 ms before (0.67x)")]
    assert backend.ctx.notes["measured"] == {
        "layout": {"before_s": 1.0, "after_s": 0.5, "kept": True},
        "pad": {"before_s": 0.5, "after_s": 0.75, "kept": False}}
    assert not backend.ctx.decisions["n"]["pad"].applied


def test_a_forced_pass_or_one_without_option_is_never_measured_away() -> None:
    backend = FakeBackend(Ctx(options=Options(pad="always")))
    passes = [_pass("pad", 1e-7, +1.0, option="pad"), _pass("cleanup", 1e-7, +1.0)]
    out = run_passes(backend, Model(REFERENCE), passes, measure=True)
    assert out.applied == ["pad", "cleanup"] and backend.timed == []


def test_measure_off_times_nothing() -> None:
    backend = FakeBackend()
    out = run_passes(backend, Model(REFERENCE), [_pass("pad", 1e-7, +1.0, option="pad")],
                     measure=False)
    assert out.applied == ["pad"] and backend.timed == []


def test_a_lossy_pass_gets_its_budget_and_loosens_the_later_checks() -> None:
    backend = FakeBackend(Ctx(compute_dtype="bf16"))
    passes = [_pass("precision", 1e-2, tolerance=ToleranceKind.COMPUTE), _pass("exact", 1e-4)]
    out = run_passes(backend, Model(REFERENCE), passes, measure=False)
    assert out.applied == ["precision", "exact"]  # 1e-4 after bf16: within bf16's budget
    assert backend.tolerances == {"precision": tolerance_for("bf16"),
                                  "exact": tolerance_for("bf16")}
    assert out.tolerance == tolerance_for("bf16")
    tight = FakeBackend(Ctx(options=Options(tolerance=1e-3), compute_dtype="bf16"))
    out = run_passes(tight, Model(REFERENCE), passes[:1], measure=False)
    assert out.applied == [] and out.reverted[0].name == "precision"
    assert tight.tolerances["precision"] == dataclasses.replace(tolerance_for("bf16"),
                                                                rel_to_scale=1e-3)
    assert tight.ctx.compute_dtype == "fp32"  # reverted: the model computes in fp32 again


def test_the_budget_kinds_have_one_spelling() -> None:
    """"fp32" and "compute" are kinds, not formats: as strings they would be read as lossy."""
    for magic in ("fp32", "compute"):
        with pytest.raises(TypeError, match="not a format name"):
            Pass("p", lambda m, c: m, magic)
    assert not Pass("p", lambda m, c: m).lossy
    assert Pass("p", lambda m, c: m, ToleranceKind.COMPUTE).lossy
    assert Pass("p", lambda m, c: m, "int8").lossy


def test_a_self_checking_pass_that_backs_out_keeps_its_own_decisions() -> None:
    def guarded(model: Model, ctx: Ctx) -> PassResult[Model]:
        ctx.decisions["n"] = {"quantize": Decision(reason="moved back by the guard",
                                                   detail=QuantizeDetail(), applied=False)}
        return PassResult(model, False, "reverted: beyond tolerance")
    backend = FakeBackend()
    out = run_passes(backend, Model(REFERENCE), [Pass("quantize", guarded, "int8")],
                     measure=True)
    assert out.reverted == [PassReverted("quantize", "reverted: beyond tolerance")]
    assert out.applied == [] and backend.tolerances == {} and backend.timed == []
    assert backend.ctx.decisions["n"]["quantize"].reason == "moved back by the guard"


def test_an_error_in_a_pass_names_the_passes_before_it() -> None:
    def broken(model: Model, ctx: Ctx) -> Model:
        raise ValueError("no such node")
    passes = [_pass("cleanup", 1e-7), _pass("pad", fires=False), Pass("layout", broken)]
    with pytest.raises(ValueError, match="no such node") as err:
        run_passes(FakeBackend(), Model(REFERENCE), passes, measure=False)
    assert err.value.__notes__ == ["in graphopt pass 'layout', after the passes: cleanup, pad"]
    with pytest.raises(ValueError) as first:
        run_passes(FakeBackend(), Model(REFERENCE), passes[2:], measure=False)
    assert "none (it ran first)" in first.value.__notes__[0]


def test_the_pipelines_load_every_pass_by_plain_import() -> None:
    from graphopt.backends.onnx.pipeline import default_passes as onnx_passes
    from graphopt.backends.torch.pipeline import default_passes as torch_passes

    assert [(p.name, p.tolerance, p.option) for p in onnx_passes()] == [
        ("padding", ToleranceKind.FP32, "pad"), ("precision", "fp16", "precision"),
        ("quantize", "int8", "quantize")]
    # the torch quantize pass's budget is its formats' (FP8, INT4...): decided per run
    assert [(p.name, "per run" if callable(p.tolerance) else p.tolerance, p.option)
            for p in torch_passes()] == [
        ("cleanup", ToleranceKind.FP32, None), ("padding", ToleranceKind.FP32, "pad"),
        ("layout", ToleranceKind.FP32, "layout"),
        ("precision", ToleranceKind.COMPUTE, "precision"), ("quantize", "per run", "quantize"),
        ("quantize_without_ends", "int8", "quantize")]
