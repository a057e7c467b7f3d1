"""What the ONNX backend hands the face: one typed record, not a dict to take apart."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import onnx

from graphopt.decisions.memory_runtime.ort_session import SessionConfig
from graphopt.ir.plan import Plan
from graphopt.ir.plan_run import OnnxOptimization

__all__ = ["OnnxResult"]


@dataclass(frozen=True)
class OnnxResult:
    """The ONNX backend's output for :func:`graphopt.optimize` and ``graphopt optimize``.

    Attributes:
        model: the optimized model, checked and shape-inferred.
        plan: the plan with every decision the passes applied or declined; its
            ``optimization`` section is ``report``.
        report: the run report (passes, guard rounds and fallbacks, numerics per output, the
            session settings, timings): the plan's ``optimization`` record, what
            ``Optimized.info`` holds.
        session: the ONNX Runtime session settings written beside the model.
        warnings: what the user asked for and did not get (an explicit quantize that
            quantized nothing), also in the plan's warnings.
        feeds: the inputs the guard ran ({input: array} each; the example's, made-up, or
            calibration batches) and ``reference``: the original model's outputs on them
            (a list per feed), for the deploy choice to check other runtimes against;
            ``original``: the model as loaded, which gave them.
    """

    model: onnx.ModelProto
    plan: Plan
    report: OnnxOptimization
    session: SessionConfig
    warnings: tuple[str, ...] = ()
    feeds: tuple[dict[str, Any], ...] = ()
    reference: tuple[list[Any], ...] = ()
    original: onnx.ModelProto | None = None

    @property
    def within_tolerance(self) -> bool:
        """Every output of the optimized model within the stated tolerance of the original's."""
        return all(n.within for n in self.report.numerics)
