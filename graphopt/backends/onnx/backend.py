"""The ONNX backend of the pass driver (:func:`graphopt.backends.driver.run_passes`): how an
ONNX pass is applied (a lossy one under the accuracy guard), checked (the ONNX checker, fp32's
budget or the held-out batches) and timed (in ONNX Runtime, reusing the sessions it has).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx

from graphopt.backends.driver import Pass, PassResult
from graphopt.backends.onnx import measure as onnx_measure
from graphopt.backends.onnx.context import OnnxContext
from graphopt.backends.onnx.guard import compare, guard, run_samples
from graphopt.backends.onnx.holdout import HeldOut
from graphopt.backends.onnx.model_check import check
from graphopt.backends.onnx.ort_runner import OrtModel, emulate_fp16
from graphopt.backends.timing import Measured
from graphopt.decisions.tolerance import Tolerance
from graphopt.errors import GraphoptError
from graphopt.ir.plan import mark_reverted
from graphopt.ir.plan_run import OnnxGuard

__all__ = ["OnnxBackend"]


@dataclass
class OnnxBackend:
    """The driver's ONNX backend: passes are functional, checks run the samples in ORT, and a
    lossy pass runs under the accuracy guard (apply and check in one: each round is checked)."""

    ctx: OnnxContext
    original: onnx.ModelProto
    reference: list[list[np.ndarray]]
    held: HeldOut = field(default_factory=HeldOut)
    guard_reports: list[OnnxGuard] = field(default_factory=list)
    #: the last model the checker passed, and its shapes-inferred copy (:func:`_finish`
    #: takes it instead of checking the same model again)
    checked: tuple[onnx.ModelProto, onnx.ModelProto] | None = None
    #: the original's session (the setup's), and the last timed model with its session:
    #: the timing and the final numbers reuse them instead of loading the model again
    base_session: OrtModel | None = None
    timed: tuple[onnx.ModelProto, OrtModel] | None = None

    def snapshot(self, model: onnx.ModelProto) -> onnx.ModelProto:
        return model  # an ONNX pass returns a new model and never changes its input

    def apply(self, p: Pass, model: onnx.ModelProto, tol: Tolerance
              ) -> PassResult[onnx.ModelProto]:
        """The pass; a lossy one's guard runs its candidates in ONNX Runtime, and when one
        fails to load or run, the pass is reverted alone (its decisions marked so): the
        original model ran, so such a failure is the pass's."""
        saved = {k: dict(v) for k, v in self.ctx.decisions.items()}
        try:
            return self._apply(p, model, tol)
        except GraphoptError as e:
            if not _ort_failure(e):
                raise
            reason = _broke(p, e.problem)
        self.ctx.decisions = mark_reverted(saved, self.ctx.decisions, reason)
        return PassResult(model, False, reason)

    def _apply(self, p: Pass, model: onnx.ModelProto, tol: Tolerance
               ) -> PassResult[onnx.ModelProto]:
        if not p.lossy:
            cand = p.run(model, self.ctx)
            return PassResult(model if cand is None else cand, cand is not None)
        cand, report = guard(p.name, p.run, model, self.ctx, kind=p.name, tolerance=tol,
                             original=self.original, reference=self.reference,
                             samples=self.ctx.samples)
        self.guard_reports.append(report.record())
        if cand is not None:
            return PassResult(cand, True)
        return PassResult(model, False, report.reason if report.reverted else None)

    def check(self, p: Pass, model: onnx.ModelProto, tol: Tolerance) -> str | None:
        """Why the driver reverts ``p``: its model fails the ONNX checker or does not run; an
        exact pass leaves fp32's budget; a lossy one (its guard kept it within ``tol`` on the
        batches it chose with) leaves it on the held-out batches."""
        inferred, problem = check(model)
        if inferred is None:
            return _broke(p, str(problem))
        self.checked = (model, inferred)
        names = [o.name for o in self.original.graph.output]
        try:
            if p.lossy:
                held = self.held.problem(model, names, tol, p.name)
                below = self.held.below_metric(model, p.name)  # its value is reported anyway
                return below if held is None else f"reverted: the {p.name} pass is {held}"
            errs = compare(self.reference, run_samples(model, self.ctx.samples, p.name),
                           names, tol)
        except GraphoptError as e:
            if not _ort_failure(e):
                raise
            return _broke(p, e.problem)
        if all(e.within for e in errs):
            return None
        return f"out of fp32 tolerance: {'; '.join(e.describe() for e in errs if not e.within)}"

    def time(self, before: onnx.ModelProto, after: onnx.ModelProto
             ) -> Measured:
        first = self.base_session if before is self.original and self.base_session else before
        timed = OrtModel(after, what="a timing candidate",
                         options=onnx_measure.timing_options())
        self.timed = (after, timed)
        return onnx_measure.faster_or_equal(first, timed, self.ctx.samples[0])

    def session_of(self, model: onnx.ModelProto) -> onnx.ModelProto | OrtModel:
        """The timed session of ``model`` when it has one and no fp16 tensor to emulate (the
        checks' sessions round fp16 explicitly: ``ort_runner.emulate_fp16``), else itself."""
        if self.timed is not None and self.timed[0] is model and emulate_fp16(model) is model:
            return self.timed[1]
        return model


def _ort_failure(e: GraphoptError) -> bool:
    """A pass's model that ONNX Runtime cannot load or run (``OrtModel``'s errors)."""
    return e.problem.startswith(("ONNX Runtime cannot load", "ONNX Runtime failed"))


def _broke(p: Pass, problem: str) -> str:
    return f"the {p.name} pass made a model that does not run or check: {problem}"
