"""Accuracy held out: the user's calibration batches split in two, one part to choose with,
the other to check.

The guard picks which nodes stay in float by measuring on its samples, and the static
quantizer fits its activation ranges to the calibration data; checked on those same batches,
the result passes by construction. On other real inputs of the same models the error reached
0.076-0.224 of the output's scale against a 0.05 budget (a captcha OCR, a VAD LSTM, a
detector). So with two or more batches the first half chooses (the quantizer's ranges, the
guard's sensitivity and bisection) and the second half checks: a lossy pass that leaves the
budget on the held-out batches is reverted with both numbers, and the error the report states
is the held-out one. With one batch nothing can be held out, and a warning says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx

from graphopt.backends.metric import MetricGoal
from graphopt.backends.onnx.guard import compare, run_samples
from graphopt.backends.onnx.numerics import OutputError
from graphopt.backends.onnx.ort_runner import OrtModel
from graphopt.decisions.tolerance import Tolerance

__all__ = ["HeldOut", "ONE_BATCH"]

ONE_BATCH = ("one calibration batch: the accuracy guard checks on the data it chose with, so "
             "its error is not measured on unseen inputs; give two or more batches (half are "
             "held out for the check)")


@dataclass
class HeldOut:
    """The held-out batches and the original model's outputs on them."""

    samples: list[dict[str, np.ndarray]] = field(default_factory=list)
    reference: list[list[np.ndarray]] = field(default_factory=list)
    #: the user's task metric (``graphopt.backends.metric``), and the (feed, reference
    #: outputs) it runs on: the held-out batches, else the guard's own samples
    goal: MetricGoal | None = None
    metric_on: list[tuple[dict[str, np.ndarray], list[np.ndarray]]] = field(
        default_factory=list)

    def below_metric(self, model: onnx.ModelProto, pass_name: str) -> str | None:
        """Why a lossy pass's model is reverted on the metric (below ``min_metric``), None
        when it holds or no metric was given; the value is recorded either way."""
        if self.goal is None:
            return None
        outputs = run_samples(model, [f for f, _ in self.metric_on], f"{pass_name} (metric)")
        return self.goal.check(pass_name, [(ref, list(out)) for (_, ref), out
                                           in zip(self.metric_on, outputs, strict=True)])

    def errors(self, model: onnx.ModelProto | OrtModel, names: Sequence[str], tol: Tolerance,
               what: str) -> list[OutputError]:
        return compare(self.reference, run_samples(model, self.samples, what), names, tol)

    def problem(self, model: onnx.ModelProto, names: Sequence[str], tol: Tolerance,
                pass_name: str) -> str | None:
        """Why ``model`` fails the held-out check, None when it passes (or nothing is held)."""
        if not self.samples:
            return None
        bad = [e for e in self.errors(model, names, tol, f"{pass_name} (held out)")
               if not e.within]
        if not bad:
            return None
        return (f"within budget on the calibration batches it chose with, not on the "
                f"{len(self.samples)} held-out batch(es): "
                + "; ".join(e.describe() for e in bad))
