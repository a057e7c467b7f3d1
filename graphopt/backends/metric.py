"""A task metric as an accuracy goal (``optimize(..., metric=f, min_metric=m)``), for both
backends: a lossy pass is kept only if ``f(reference, candidate) >= m`` on the held-out batches.

An output distance (``tolerance``) says how far the numbers moved; a user who knows the task
can say what matters instead (top-1 agreement, a detection score), as Olive's accuracy goals
do. The metric is called once per check batch with the original model's outputs and the
candidate's, in the backend's own form (torch: the outputs as ``forward`` returns them; ONNX:
the list of output arrays in graph order), and its value is the mean over the batches. It is a
goal on top of the output budget: a pass must also stay within ``tolerance`` (loosen it to let
the metric decide). Torch-free: the ONNX path imports this module.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from graphopt.errors import GraphoptError
from graphopt.ir.plan_run import MetricPass, MetricReport

__all__ = ["NOT_HELD_OUT", "MetricGoal", "metric_goal"]

#: why the metric's batches are not held out, for the plan's warnings
NOT_HELD_OUT = ("metric= is measured on {what}, not on held-out batches: its value does not "
                "show how the model does on unseen inputs; give calibration= two or more real "
                "batches")


@dataclass
class MetricGoal:
    """The user's metric, its floor, and each lossy pass's measured value (for the report)."""

    fn: Callable[[Any, Any], Any]
    min_metric: float
    #: pass name -> its value, in the order the passes were checked
    passes: dict[str, MetricPass] = field(default_factory=dict)
    #: which batches the metric ran on ("held-out calibration batches", "the example inputs")
    on: str = ""

    @property
    def name(self) -> str:
        return getattr(self.fn, "__qualname__", None) or type(self.fn).__name__

    def value(self, pairs: Sequence[tuple[Any, Any]]) -> float:
        """The mean of ``fn(reference, candidate)`` over ``pairs``; a metric that raises or
        gives no finite number is a GraphoptError naming it."""
        values = []
        for i, (reference, candidate) in enumerate(pairs):
            try:
                got = self.fn(reference, candidate)
            except Exception as e:
                raise GraphoptError(f"metric {self.name} raised on check batch {i}: "
                                    f"{type(e).__name__}: {e}", _FIX) from e
            if _one_element(got):
                got = got.item()
            if isinstance(got, bool) or not isinstance(got, numbers.Real) or \
                    not math.isfinite(float(got)):
                raise GraphoptError(f"metric {self.name} returned {got!r} on check batch {i}, "
                                    "not a finite number", _FIX)
            values.append(float(got))
        return sum(values) / len(values)

    def check(self, pass_name: str, pairs: Sequence[tuple[Any, Any]]) -> str | None:
        """Record ``pass_name``'s value; why to revert it (below the floor), else None."""
        value = self.value(pairs)
        kept = value >= self.min_metric
        self.passes[pass_name] = MetricPass(value, kept, len(pairs))
        if kept:
            return None
        return (f"reverted: metric {self.name} is {value:.6g} on {self.on or 'the check batches'}"
                f" ({len(pairs)} batch(es)), below min_metric {self.min_metric:g}")

    def record(self) -> MetricReport:
        """The report's record (the plan's ``optimization.metric``)."""
        return MetricReport(self.name, self.min_metric, self.on, dict(self.passes))


_FIX = ("give metric=f(reference_outputs, outputs) -> float that returns a finite number for "
        "every batch (e.g. the share of rows whose argmax agrees)")


def _one_element(got: Any) -> bool:
    """A one-element numpy array or torch tensor (``np.float64(1.0)``, ``tensor(0.9)``)."""
    numel = getattr(got, "numel", None)
    if callable(numel):
        return numel() == 1
    return getattr(got, "size", None) == 1 and hasattr(got, "item")


def metric_goal(metric: Any, min_metric: Any) -> MetricGoal | None:
    """The goal from ``optimize``'s arguments: both or neither, a callable and a finite
    number; anything else is a GraphoptError saying which."""
    if metric is None and min_metric is None:
        return None
    if metric is None or min_metric is None:
        given, missing = ("metric", "min_metric") if min_metric is None else \
            ("min_metric", "metric")
        raise GraphoptError(f"{given}= was given without {missing}=: a task metric needs its "
                            "floor, and a floor needs its metric",
                            "give both, e.g. metric=top1_agreement, min_metric=0.99, or neither")
    if not callable(metric):
        raise GraphoptError(f"metric= must be a function (reference_outputs, outputs) -> float,"
                            f" got {type(metric).__name__}", _FIX)
    if isinstance(min_metric, bool) or not isinstance(min_metric, numbers.Real) or \
            not math.isfinite(float(min_metric)):
        raise GraphoptError(f"min_metric= must be a finite number, got {min_metric!r}",
                            "give the lowest metric value a pass may reach, e.g. 0.99")
    return MetricGoal(metric, float(min_metric))
