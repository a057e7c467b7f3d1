"""``optimize_onnx``: load, plan, rewrite pass by pass at the ONNX level, guard the lossy
passes, check, and say how to run the result.

Order: padding (exact), precision (lossy: fp16 islands), quantize (lossy), then the session
decision (layout as ORT provider options, graph optimization level, threads). The original
model runs once in ONNX Runtime on the samples (calibration batches, else seeded inputs). The
loop is :func:`graphopt.backends.driver.run_passes` with the ONNX backend (:mod:`.backend`): an
exact pass must stay within fp32's budget of the original (1e-5 of each output's scale) or is
reverted; a lossy pass runs under :func:`guard.guard`, which moves nodes back to higher
precision until the user's tolerance holds. The result passes
``onnx.checker.check_model(full_check=True)`` with shapes inferred.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import onnx
import onnx.checker
import onnx.shape_inference

from graphopt.backends.driver import Pass, ToleranceKind, measure_here, run_passes
from graphopt.backends.held_out import split
from graphopt.backends.metric import NOT_HELD_OUT, MetricGoal
from graphopt.backends.onnx.backend import OnnxBackend
from graphopt.backends.onnx.calibration import GUARD_SAMPLES, load_calibration
from graphopt.backends.onnx.context import OnnxContext
from graphopt.backends.onnx.fitting import Fit, fit_for, fit_from_feed
from graphopt.backends.onnx.guard import compare, run_samples
from graphopt.backends.onnx.holdout import ONE_BATCH, HeldOut
from graphopt.backends.onnx.measure import timing_options
from graphopt.backends.onnx.model_check import finalize
from graphopt.backends.onnx.ort_runner import OrtModel, sample_feeds
from graphopt.backends.onnx.padding import pad_channels
from graphopt.backends.onnx.precision import reduce_precision
from graphopt.backends.onnx.quantize import quantize
from graphopt.backends.onnx.result import OnnxResult
from graphopt.backends.onnx.save import save_onnx
from graphopt.backends.onnx.session import decide_session
from graphopt.decisions.planner import build_plan
from graphopt.decisions.precision.format import onnx_precision
from graphopt.decisions.range_plan import at_opt
from graphopt.errors import GraphoptError
from graphopt.frontends.onnx_frontend import load_onnx
from graphopt.frontends.onnx_range import onnx_range
from graphopt.hardware.profile import HardwareProfile
from graphopt.hardware.registry import resolve_targets
from graphopt.ir.options import Options
from graphopt.ir.plan import Plan
from graphopt.ir.plan_run import OnnxOptimization, PrecisionChoice

__all__ = ["default_passes", "optimize_onnx", "save_onnx"]

logger = logging.getLogger(__name__)

_SEED_SAMPLES = 2  # seeded sample batches when no calibration data is given


def default_passes() -> list[Pass]:
    """Padding (exact), precision and quantize (lossy, guarded), in that order."""
    return [Pass("padding", pad_channels, ToleranceKind.FP32, option="pad"),
            Pass("precision", reduce_precision, "fp16", option="precision"),
            Pass("quantize", quantize, "int8", option="quantize")]


def _generated_inputs_failed(e: GraphoptError, feeds: list[dict[str, np.ndarray]],
                             rng: Any, fit: Fit) -> GraphoptError:
    """The original model fails on graphopt's made-up inputs: say which inputs are made up
    (integer ones most often carry values a model needs: shapes, sizes, indices), at which
    sizes, and how to give real ones or other sizes."""
    feed = feeds[0]
    ints = [n for n, a in feed.items() if not np.issubdtype(a.dtype, np.floating)]
    hint = (f"; its integer input(s) {', '.join(ints)} got 0/1 values" if ints else "")
    sizes = ""
    if rng:
        shapes = sorted({str(tuple(a.shape)) for f in feeds for a in f.values()})
        sizes = (f"; symbolic dims at {', '.join(f'{d.name}={d.opt}' for d in rng.dims)} "
                 f"(opt) and the range's ends, shapes {', '.join(shapes)}")
    tried = f"; {fit.note}" if fit.note else ""
    return GraphoptError(
        f"{e.problem} (on inputs graphopt generated: standard normal floats, 0/1 integers"
        f"{hint}{sizes}{tried})",
        "pass real inputs for the accuracy guard: calibration=[{input: array}] in the API, or "
        "--calibration inputs.npz on the CLI"
        + ("; or sizes the model takes: dynamic_shapes={'dim': (min, opt, max)}, or "
           "--dynamic dim=min:opt:max" if rng else ""))


def _range_feeds(feed: dict[str, np.ndarray], rng: Any) -> list[dict[str, np.ndarray]]:
    """``feed`` tiled or cropped to the range's min and max (where they differ from opt):
    every check then covers the range's ends too."""
    if not rng:
        return []
    return [{k: np.ascontiguousarray(v) for k, v in rng.sized_inputs(values, feed, np.tile).items()}
            for _, values in rng.end_points()]


def _resolve(target: str | HardwareProfile) -> HardwareProfile:
    return resolve_targets(target)[0] if not isinstance(target, HardwareProfile) else target


def _plain(obj: Any) -> Any:
    """JSON-ready copy of pass notes and metrics: sets become sorted lists, numpy scalars
    numbers, and inf/NaN (an exact output has SNR inf) the strings "inf"/"-inf"/"nan"."""
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, (set, frozenset)):
        return sorted(_plain(v) for v in obj)
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    return str(obj)


def _declined_requests(opts: Options, applied: list[str], ctx: OnnxContext) -> list[str]:
    """A warning for an explicit quantize request that changed nothing: the user asked for it,
    so silence would read as success."""
    if opts.quantize in ("auto", "none") or "quantize" in applied:
        return []
    why = Counter(d.reason for per_node in ctx.decisions.values()
                  for kind, d in per_node.items() if kind == "quantize" and not d.applied)
    detail = "; ".join(f"{n} node(s): {r}" for r, n in why.most_common(3)) or \
        "the model has no Conv/MatMul/Gemm with a constant weight"
    return [f"quantize={opts.quantize!r} was requested but no node was quantized ({detail})"]


def optimize_onnx(model: str | os.PathLike[str] | onnx.ModelProto,
                  target: str | HardwareProfile = "h100", options: Options | None = None,
                  calibration: str | os.PathLike[str] | Sequence[dict[str, Any]] | None = None,
                  *, samples: Sequence[dict[str, np.ndarray]] | None = None,
                  passes: Sequence[Pass] | None = None, dynamic_shapes: Any = None,
                  metric: MetricGoal | None = None) -> OnnxResult:
    """Optimize an ONNX model for ``target``; returns the model, the plan with its decisions
    and the run report.

    Args:
        model: an ``.onnx`` path or a ``ModelProto`` (never modified).
        calibration: batches for static quantization and the guard (see
            :mod:`.calibration` for the file format).
        samples: inputs the guard measures on when no calibration is given (e.g. the torch
            example inputs); else seeded random inputs.
        dynamic_shapes: symbolic dim name -> opt size or ``(min, opt, max)``
            (:mod:`graphopt.frontends.onnx_range`); the plan and the seeded inputs use the opt
            sizes, and every check also runs at min and max.
        metric: the user's task metric goal (``graphopt.backends.metric``), checked on each
            lossy pass over the held-out batches (else the guard's samples, with a warning).

    Passes are timed per ``options.measure`` (:func:`graphopt.backends.driver.measure_here`).
    """
    start = time.perf_counter()
    opts = (options or Options()).check_backend("onnx")
    profile = _resolve(target)
    setup = _setup(model, profile, opts, calibration, samples, dynamic_shapes, start)
    _metric_batches(setup, metric)
    compute, why = onnx_precision(profile, opts.precision)
    ctx = OnnxContext(plan=setup.plan, target=profile, options=opts, samples=setup.runs,
                      calibration=setup.calib, compute_dtype=compute, graph=setup.graph,
                      dim_values=setup.rng.values("opt") if setup.rng else {})
    ctx.notes["precision_choice"] = {"requested": opts.precision, "chosen": compute,
                                     "reason": why}
    backend = OnnxBackend(ctx, setup.base, setup.reference, setup.held,
                           base_session=setup.session)
    done = run_passes(backend, setup.base, default_passes() if passes is None else passes,
                      measure=measure_here(opts, profile))
    setup.timings.update({f"{name}_s": s for name, s in done.seconds.items()})
    return _finish(setup, ctx, done, backend, start)


@dataclass
class _Setup:
    """The model loaded and planned, the inputs every check runs on and the reference outputs
    the original model gives on them."""

    graph: Any  # the IR at the opt point (range_plan.at_opt)
    plan: Plan
    base: onnx.ModelProto
    rng: Any
    calib: list[dict[str, np.ndarray]] | None
    runs: list[dict[str, np.ndarray]]
    at_ends: list[dict[str, np.ndarray]]
    reference: list[list[np.ndarray]]
    timings: dict[str, float] = field(default_factory=dict)
    #: integer scalar input -> the value the made-up samples hold (:mod:`.fitting`)
    values: dict[str, int] = field(default_factory=dict)
    #: calibration batches the passes never choose with (:mod:`.holdout`)
    held: HeldOut = field(default_factory=HeldOut)
    #: the original's session, which made ``reference``
    session: OrtModel | None = None
    #: what the plan's warnings add about the checks (the metric's batches)
    warnings: list[str] = field(default_factory=list)


def _setup(model: Any, profile: HardwareProfile, opts: Options, calibration: Any,
           samples: Sequence[dict[str, np.ndarray]] | None, dynamic_shapes: Any,
           start: float) -> _Setup:
    graph = load_onnx(model)
    base = graph.source_model
    if base is None:  # pragma: no cover - the ONNX frontend always sets it
        raise GraphoptError("the ONNX frontend kept no model to rewrite")
    # the pass timing's "before" too (OnnxBackend.time): timing options
    original = OrtModel(base, what="the original model", options=timing_options())
    calib = load_calibration(calibration, base) if calibration is not None else None
    held = HeldOut()
    if calib and not samples:  # one part chooses, the other checks (holdout.py)
        calib, held.samples = split(calib, GUARD_SAMPLES)
        if not held.samples:
            graph.warnings.append(ONE_BATCH)
    given = list(samples or calib or [])
    # the free dims at the data's sizes, else made-up inputs that fit the model
    fit = fit_from_feed(graph, dynamic_shapes, given[0]) if given else \
        fit_for(original, graph, dynamic_shapes)
    graph = onnx_range(graph, fit.spec_with(dynamic_shapes))
    graph.shape_range = rng = fit.marked(graph.shape_range)
    if fit.note:
        graph.warnings.append(fit.note)
    plan = build_plan(graph, profile)
    timings = {"load_and_plan_s": time.perf_counter() - start}
    if opts.quantize == "int8_static" and not calib:
        raise GraphoptError("quantize='int8_static' needs calibration data and none was given",
                            "pass --calibration F (an .npz with one array per model input, "
                            "batches along axis 0), or use --quantize int8_dynamic")
    runs = list(samples) if samples else (
        calib[:GUARD_SAMPLES] if calib else
        sample_feeds(base, _SEED_SAMPLES, dims=rng.values("opt") if rng else None,
                     values=fit.values))
    at_ends = _range_feeds(runs[0], rng) if runs else []
    runs += at_ends
    try:
        reference = run_samples(original, runs, "the original")
    except GraphoptError as e:
        if samples or calib:
            raise
        raise _generated_inputs_failed(e, runs, rng, fit) from None
    held.reference = run_samples(original, held.samples, "the original") if held.samples else []
    return _Setup(at_opt(graph), plan, base, rng, calib, runs, at_ends, reference, timings,
                  fit.values, held, original)


def _metric_batches(setup: _Setup, goal: MetricGoal | None) -> None:
    """The metric's batches: the held-out ones, else the guard's samples (not the range's
    ends, which are made-up sizes), with a warning that they are not held out."""
    held = setup.held
    held.goal = goal
    if goal is None:
        return
    if held.samples:
        held.metric_on, goal.on = list(zip(held.samples, held.reference, strict=True)), \
            "held-out calibration batches"
        return
    own = len(setup.runs) - len(setup.at_ends)
    held.metric_on = list(zip(setup.runs[:own], setup.reference[:own], strict=True))
    goal.on = "the calibration batches the guard chose with" if setup.calib else \
        "the guard's sample inputs (made up or the example)"
    setup.warnings.append(NOT_HELD_OUT.format(what=goal.on))


def _finish(setup: _Setup, ctx: OnnxContext, done: Any, backend: OnnxBackend,
            start: float) -> OnnxResult:
    """The session settings, the checked model, its numbers against the original's and the
    run report."""
    opts, applied, timings = ctx.options, done.applied, setup.timings
    session = decide_session(done.model, ctx)
    t0 = time.perf_counter()
    prior = backend.checked
    current = finalize(done.model, prior[1] if prior and prior[0] is done.model else None)
    reports = backend.guard_reports
    names = [o.name for o in setup.base.graph.output]
    runner = backend.session_of(done.model)  # the same graph as ``current``
    runner = current if runner is done.model else runner
    final = setup.held.errors(runner, names, done.tolerance, "the optimized model") \
        if setup.held.samples else \
        compare(setup.reference, run_samples(runner, setup.runs, "the optimized model"),
                names, done.tolerance)  # the stated error: the held-out batches' when held
    timings["check_s"] = time.perf_counter() - t0
    timings["total_s"] = time.perf_counter() - start
    warnings = [*setup.warnings, *_declined_requests(opts, applied, ctx)]
    for w in warnings:
        logger.info("%s", w)  # the CLI prints them; the report lists them
    rng, calib, runs, goal = setup.rng, setup.calib, setup.runs, setup.held.goal
    info = OnnxOptimization(
        source="onnx", target=ctx.target.name, passes_applied=tuple(applied),
        warnings=tuple(warnings), passes_reverted=tuple(done.reverted),
        compute_dtype=ctx.compute_dtype if "precision" in applied else "fp32",
        precision_choice=PrecisionChoice(**ctx.notes["precision_choice"]),
        tolerance=done.tolerance.budget(), numerics=tuple(e.record() for e in final),
        guard=tuple(reports), fallbacks=tuple(f for r in reports for f in r.fallbacks),
        session=_plain(session.to_dict()), samples=len(runs),
        sample_shapes=tuple({k: tuple(np.shape(v)) for k, v in r.items()} for r in runs),
        sample_values={k: int(v) for k, v in setup.values.items()},
        shape_range=rng or None, range_samples=len(setup.at_ends) if rng else None,
        calibration_batches=len(calib) if calib else 0,
        held_out_batches=len(setup.held.samples),
        metric=goal.record() if goal is not None else None,
        notes=_plain({k: v for k, v in ctx.notes.items() if k != "precision_choice"}),
        timings=dict(timings))
    plan = replace(setup.plan.with_decisions(ctx.decisions),
                   warnings=(*setup.plan.warnings, *warnings), optimization=info)
    logger.info("optimize_onnx: %s applied, %d fallback(s), %.2fs", applied or "nothing",
                len(info.fallbacks), timings["total_s"])
    return OnnxResult(current, plan, info, session, tuple(warnings), tuple(runs),
                      tuple(setup.reference), setup.base)
