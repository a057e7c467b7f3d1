"""One pass driver for both backends: apply, check the numbers, time, keep or revert, record.

Modelled on onnx-ir's ``PassResult(model, modified)`` / ``Sequential`` and torch.fx's
``PassManager``: a pass is a typed record (:class:`Pass`), the loop (:func:`run_passes`) is
written once, and what differs between torch and ONNX sits behind a small :class:`Backend`
(copy, run a pass, compare with the reference, time before vs after). For each pass, in order:

1. Snapshot the model and the decisions; apply the pass. Unchanged: nothing to record.
2. Check: the candidate's outputs against the original's, within the pass's tolerance (the
   loosest already applied, if looser: the reference is the original, so a later exact pass
   inherits an earlier lossy pass's error). Out of tolerance: revert with the reason.
3. Measure, only a pass its option left on "auto" and only where ``measure`` says timing
   means something: slower on this machine, revert with the timings. A pass the user forced
   is never measured away.
4. Keep it (applied) or revert it (model and decisions back, its decisions marked not applied
   with the reason).

A pass that checks itself (the ONNX accuracy guard re-runs a lossy pass with more nodes kept at
high precision) returns ``PassResult.declined`` when it backs out; it has already put its
decisions back. An exception inside a pass says which passes ran before it. Torch-free: the
ONNX path imports this module.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Generic, Protocol, TypeVar

from graphopt.backends.timing import Measured
from graphopt.decisions.tolerance import Tolerance, tolerance_for
from graphopt.hardware import is_this_machine
from graphopt.hardware.profile import HardwareProfile
from graphopt.ir.options import Options
from graphopt.ir.plan import Decision, mark_reverted
from graphopt.ir.plan_run import PassReverted

__all__ = ["Backend", "DriverResult", "Pass", "PassContext", "PassResult", "ToleranceKind",
           "measure_here", "run_passes"]

logger = logging.getLogger(__name__)

M = TypeVar("M")


class ToleranceKind(Enum):
    """The two budgets a pass names without naming a format of ``decisions.tolerance``."""

    #: an exact rewrite (folding, padding, layout): fp32's budget, never loosened by the user
    FP32 = "fp32"
    #: a precision pass: the budget of the context's ``compute_dtype`` (fp32 again if reverted)
    COMPUTE = "compute"


#: what a pass is checked against: a kind, or a lossy format ("int8", "fp16", "int4")
PassTolerance = ToleranceKind | str


@dataclass(frozen=True)
class Pass:
    """One rewrite pass and how the driver treats it.

    ``name``: also the decision kind a lossy ONNX pass records (the guard finds the nodes it
    lowered by it). ``run``: the backend's pass function (``TorchPass``, ``OnnxPass`` or, for
    a lossy ONNX pass, the guard's ``LossyPass``). ``tolerance``: :class:`ToleranceKind`
    (``FP32`` for exact rewrites, ``COMPUTE`` for the context's ``compute_dtype``), else a
    format of ``decisions.tolerance`` ("int8", "fp16"), or a function of the context that names
    one; a lossy pass (anything but ``FP32``) gets the user's ``tolerance`` option as its
    budget. ``option``: the ``Options`` field that decides
    the pass; only its "auto" is timed, so a pass the user forced is never measured away.
    """

    name: str
    run: Callable[..., Any]
    #: or a function of the context, for a pass whose formats are decided per run
    tolerance: PassTolerance | Callable[[Any], PassTolerance] = ToleranceKind.FP32
    option: str | None = None

    def __post_init__(self) -> None:  # the kinds are not formats: one spelling each
        if isinstance(self.tolerance, str) and self.tolerance in {k.value for k in ToleranceKind}:
            raise TypeError(f"pass {self.name!r}: tolerance {self.tolerance!r} is "
                            f"{ToleranceKind(self.tolerance)}, not a format name")

    @property
    def lossy(self) -> bool:
        return self.tolerance is not ToleranceKind.FP32


@dataclass(frozen=True)
class PassResult(Generic[M]):
    """What one pass did (onnx-ir's ``PassResult``), plus why a self-checking pass backed out."""

    model: M
    modified: bool
    declined: str | None = None


class PassContext(Protocol):
    """What the driver reads and writes on a backend's context."""

    options: Options
    compute_dtype: str
    decisions: dict[str, dict[str, Decision]]
    notes: dict[str, Any]


class Backend(Protocol[M]):
    """The few things the loop needs from torch or ONNX."""

    ctx: PassContext

    def snapshot(self, model: M) -> M:
        """A copy the pass cannot change (ONNX passes are functional: the model itself)."""

    def apply(self, p: Pass, model: M, tol: Tolerance) -> PassResult[M]:
        """Run ``p`` on ``model``."""

    def check(self, p: Pass, model: M, tol: Tolerance) -> str | None:
        """Why ``model`` must be reverted (outputs out of ``tol``), or None."""

    def time(self, before: M, after: M) -> Measured:
        """The paired comparison on this machine (unpacks as keep, seconds before, after)."""


@dataclass
class DriverResult(Generic[M]):
    """The loop's record: the model, what applied, what was reverted and why."""

    model: M
    applied: list[str] = field(default_factory=list)
    reverted: list[PassReverted] = field(default_factory=list)
    #: the loosest tolerance of the passes that applied: the final model's budget
    tolerance: Tolerance = field(default_factory=lambda: tolerance_for("fp32"))
    #: wall time of each pass (apply, check, measure)
    seconds: dict[str, float] = field(default_factory=dict)


def measure_here(options: Options, target: HardwareProfile) -> bool:
    """Timing decides only where it means something: by default, when the target is this CPU."""
    return is_this_machine(target) if options.measure is None else options.measure


def _tolerance(p: Pass, ctx: PassContext, loosest: Tolerance) -> Tolerance:
    fmt = p.tolerance(ctx) if callable(p.tolerance) else p.tolerance
    if fmt is ToleranceKind.COMPUTE:
        fmt = ctx.compute_dtype
    tol = tolerance_for(fmt.value if isinstance(fmt, ToleranceKind) else fmt)
    if p.lossy:
        tol = ctx.options.lossy_budget(tol)
    return loosest if loosest.rel_to_scale > tol.rel_to_scale else tol


def _slower(p: Pass, backend: Backend[M], before: M, after: M) -> str | None:
    """Why to revert ``p`` unless it measured faster on this machine with confidence (a tie
    keeps the simpler model, without the pass: ``backends/timing``), else None."""
    result = backend.time(before, after)
    keep, tb, ta = result
    note = result.to_dict() if hasattr(result, "to_dict") else {
        "before_s": tb, "after_s": ta, "kept": keep}
    backend.ctx.notes.setdefault("measured", {})[p.name] = note
    if keep:
        return None
    times = f"{ta * 1e3:.3g} ms after vs {tb * 1e3:.3g} ms before"
    if getattr(result, "verdict", "slower") == "tie":
        return (f"reverted, a tie on this machine ({times}; speedup {result.interval()}): "
                "without the pass is the simpler model")
    return f"reverted, measured slower on this machine: {times} ({tb / ta:.2f}x)"


def _step(p: Pass, backend: Backend[M], model: M, measure: bool, out: DriverResult[M]) -> M:
    """One pass: apply, check, measure, keep or revert; returns the model to go on with."""
    ctx = backend.ctx
    before = backend.snapshot(model)
    saved = {k: dict(v) for k, v in ctx.decisions.items()}
    tol = _tolerance(p, ctx, out.tolerance)
    result = backend.apply(p, model, tol)
    if result.declined is not None:  # it checked itself and backed out, decisions restored
        out.reverted.append(PassReverted(p.name, result.declined))
        return before
    if not result.modified:
        logger.debug("pass %s changed nothing", p.name)
        return result.model
    reason = backend.check(p, result.model, tol)
    if reason is None and measure and p.option is not None and \
            getattr(ctx.options, p.option) == "auto":
        reason = _slower(p, backend, before, result.model)
    if reason is not None:
        logger.info("pass %s reverted: %s", p.name, reason)
        out.reverted.append(PassReverted(p.name, reason))
        ctx.decisions = mark_reverted(saved, ctx.decisions, reason)
        if p.tolerance is ToleranceKind.COMPUTE:  # the model computes in fp32 again
            ctx.compute_dtype = "fp32"
        return before
    logger.info("pass %s applied", p.name)
    out.applied.append(p.name)
    out.tolerance = tol
    return result.model


def run_passes(backend: Backend[M], model: M, passes: Sequence[Pass], *,
               measure: bool) -> DriverResult[M]:
    """Run ``passes`` in order on ``model`` (see the module docstring for the steps)."""
    out: DriverResult[M] = DriverResult(model)
    ran: list[str] = []
    for p in passes:
        t0 = time.perf_counter()
        try:
            out.model = _step(p, backend, out.model, measure, out)
        except Exception as e:
            e.add_note(f"in graphopt pass {p.name!r}, after the passes: "
                       f"{', '.join(ran) or 'none (it ran first)'}")
            raise
        ran.append(p.name)
        out.seconds[p.name] = time.perf_counter() - t0
    return out
