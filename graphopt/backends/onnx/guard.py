"""The accuracy guard: measure a lossy pass's outputs against the original model in ONNX
Runtime, measure each lowered node's share of the error, and keep the most sensitive nodes in
higher precision until within tolerance (metrics and verdict: :mod:`.numerics`).

Steps:

1. Run the pass; build the probe (:mod:`.probe`): the candidate with a switch beside each node
   it lowered, one session. One run per sample with every node lowered is the candidate's
   check (tensor for tensor the candidate's values); one with every node kept, on the samples
   outside tolerance (else the first), gives each node's local and cumulative error
   (:mod:`.sensitivity`).
2. Within tolerance: done; the nodes keep their measured errors.
3. Else: one probe run per group of nodes gives each node's contribution to the output error;
   nodes ranked by it (overflow first); a bisection over the ranking, on the probe, finds how
   many to keep.
4. Re-run the pass with those nodes excluded. The re-run may keep more (a follow op after a
   kept GEMM stays fp32): the probe runs once more with exactly the nodes it lowered, and
   only a re-run within tolerance there is checked for real, in a session of its own, on
   every sample. Not within: keep half of the rest too and try again (``MAX_TRIES`` re-runs,
   ``MAX_CHECKS`` real checks at most).
5. Still outside, or keeping every measured node is not enough: the pass is reverted, and says
   so. Without a probe (ONNX Runtime cannot load it) the candidate is checked as it is and
   reverted if outside tolerance.

Bounds, with S samples of which S_m are measured and N lowered nodes: ONNX Runtime sessions
1 + ``MAX_CHECKS`` (+1 to measure a reverted pass's model); probe runs S + S_m (step 1),
``GROUPS`` * S_m (step 3), at most ``log2(RESOLUTION) + 2`` * S_m (the bisection) and
``MAX_TRIES`` * S (step 4). Only the bisection grows with N, and that stops at a resolution of
N / ``RESOLUTION``. The guard this replaced built a session per round (37 on the 6,000-node
residual MLP, ~1.9 s each).

Each measured node's numbers go on its decision (field ``sensitivity``) and the most sensitive
ones into the guard's report. A lossy pass is ``pass_(model, ctx, exclude)``: it keeps the
nodes named in ``exclude`` at high precision and records each node it lowers as an applied
decision of its kind (``"precision"``, ``"quantize"``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import onnx

from graphopt.backends.onnx.context import OnnxContext
from graphopt.backends.onnx.numerics import (
    OutputError,
    compare,
    report_number,
    run_samples,
    snr_text,
    within,
)
from graphopt.backends.onnx.ort_runner import OrtModel, emulate_fp16
from graphopt.backends.onnx.precision import FOLLOW_OPS
from graphopt.backends.onnx.probe import HI, LO, Probe, build_probe
from graphopt.backends.onnx.sensitivity import (
    Measured,
    NodeSensitivity,
    contributions,
    errors_of,
    rank,
    smallest_kept,
)
from graphopt.decisions.tolerance import Tolerance
from graphopt.errors import GraphoptError
from graphopt.files.progress import progress
from graphopt.ir.decision_details import Sensitivity
from graphopt.ir.plan import Decision
from graphopt.ir.plan_run import Fallback, OnnxGuard, OnnxSensitivity, OnnxSensitivityRow

__all__ = ["MAX_CHECKS", "MAX_TRIES", "GuardReport", "LossyPass", "OutputError", "compare", "guard",
           "run_samples", "snr_text"]

logger = logging.getLogger(__name__)

#: a lossy pass: (model, ctx, exclude) -> new model or None
LossyPass = Callable[[onnx.ModelProto, OnnxContext, frozenset[str]], "onnx.ModelProto | None"]
#: re-runs of the pass with the probe's pick excluded (the pick, then half of the rest more
#: each time), and of those, real checks (sessions): a re-run whose lowered nodes the probe
#: puts outside tolerance is not checked
MAX_TRIES, MAX_CHECKS = 5, 3
#: nodes listed in the report's sensitivity section (every node has its numbers on its
#: decision)
REPORT_TOP = 25


@dataclass
class GuardReport:
    """What the guard measured for one lossy pass and what it moved back."""

    pass_name: str
    tolerance: Tolerance
    initial: list[OutputError] = field(default_factory=list)
    final: list[OutputError] = field(default_factory=list)
    fallbacks: list[Fallback] = field(default_factory=list)
    rounds: int = 0
    reverted: bool = False
    reason: str = ""
    #: per node, most sensitive first (empty when nothing could be measured)
    sensitivity: list[NodeSensitivity] = field(default_factory=list)
    sessions: int = 0
    runs: int = 0
    samples_measured: int = 0
    not_measured: dict[str, str] = field(default_factory=dict)

    @property
    def within(self) -> bool:
        return within(self.final)

    def record(self) -> OnnxGuard:
        """The report's record (the plan's ``optimization.guard`` entry)."""
        top = tuple(OnnxSensitivityRow(**{k: report_number(v) for k, v in s.to_dict().items()})
                    for s in self.sensitivity[:REPORT_TOP])
        sens = OnnxSensitivity(len(self.sensitivity), sum(s.kept for s in self.sensitivity),
                               self.sessions, self.runs, self.samples_measured,
                               len(self.not_measured), top)
        return OnnxGuard(self.pass_name, self.tolerance.budget(), self.rounds, self.reverted,
                         self.reason, tuple(e.record() for e in self.initial),
                         tuple(e.record() for e in self.final), tuple(self.fallbacks), sens)


def _lowered(ctx: OnnxContext, kind: str, order: dict[str, int]) -> list[str]:
    """The nodes the pass just lowered, in graph order."""
    names = [n for n, d in ctx.decisions.items() if kind in d and d[kind].applied]
    return sorted(names, key=lambda n: order.get(n, len(order)))


def _session(model: onnx.ModelProto, what: str, report: GuardReport) -> OrtModel:
    """A session of the model as written (fp16 emulated, graph optimizations off: numbers of
    the nodes themselves, as the probe computes them)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    report.sessions += 1
    return OrtModel(emulate_fp16(model), what=what, options=opts)


def _measure(probe: Probe, samples: Sequence[dict[str, np.ndarray]],
             reference: list[list[np.ndarray]], names: list[str], tol: Tolerance
             ) -> tuple[list[OutputError], list[Measured]]:
    """Step 1: the candidate's errors over every sample (every node lowered) and the samples
    to measure nodes on: those outside tolerance, else the first."""
    outs = [o for os_ in probe.switched.values() for o in os_]
    lo = [LO + o for o in outs]
    n = len(probe.outputs)
    got, lowered, bad = [], {}, []
    for i, feed in enumerate(samples):
        r = probe.run(feed, (), lo)
        got.append(r[:n])
        if not within(compare([reference[i]], [r[:n]], names, tol)):
            bad.append(i)
        if i == 0 or bad[-1:] == [i]:
            lowered[i] = dict(zip(lo, r[n:], strict=True))
    errors = compare(reference, got, names, tol)
    pick = bad or [0]
    every, both = set(probe.switched), [HI + o for o in outs] + lo
    measured = []
    for i in pick:
        r = probe.run(samples[i], every, both)
        measured.append(Measured(samples[i], reference[i], r[:n],
                                 dict(zip(both, r[n:], strict=True)), lowered.pop(i)))
    return errors, measured


def _sensitivity(probe: Probe, measured: list[Measured], lowered: list[str],
                 contribute: bool) -> list[NodeSensitivity]:
    """Each switched node's numbers, most sensitive first (steps 1 and 3)."""
    errs = errors_of(probe, measured)
    order = [n for n in lowered if n in errs]
    local = {n: errs[n][0] for n in order}
    pinned = {n for n in order if math.isinf(local[n])}
    share = contributions(probe, measured, [n for n in order if n not in pinned], local,
                          pinned) if contribute else {}
    sens = {n: NodeSensitivity(n, *errs[n], contribution=share.get(n)) for n in order}
    return [replace(sens[n], rank=i + 1) for i, n in enumerate(rank(sens, order))]


def _followers(model: onnx.ModelProto, kind: str, switched: set[str]
               ) -> Callable[[set[str]], set[str]]:
    """``keep`` and the lowered nodes the pass then keeps too: for precision, a follow op
    (``precision.FOLLOW_OPS``, its case 4) whose input comes from a kept node runs fp32, and
    so on down the chain. Other passes keep only what they are asked to."""
    if kind != "precision":
        return lambda keep: keep
    producer = {o: n.name for n in model.graph.node for o in n.output if o}
    chain = [(n.name, [producer[t] for t in n.input if t in producer])
             for n in model.graph.node if n.name in switched and n.op_type in FOLLOW_OPS]

    def closure(keep: set[str]) -> set[str]:
        out = set(keep)
        for name, sources in chain:  # graph order: a follower's sources are decided first
            if name not in out and any(s in out for s in sources):
                out.add(name)
        return out

    return closure


def _kept_sets(sens: list[NodeSensitivity], k: int) -> list[list[str]]:
    """Step 4's node sets, fewest first: the overflowing nodes and the ``k`` most sensitive
    others, then half of the rest more each time (at most ``MAX_TRIES``)."""
    pinned = [s.node for s in sens if s.overflow]
    ranked = [s.node for s in sens if not s.overflow]
    sets = [[*pinned, *ranked[:k]]]
    while k < len(ranked) and len(sets) < MAX_TRIES:
        k += math.ceil((len(ranked) - k) / 2)
        sets.append([*pinned, *ranked[:k]])
    return sets

def guard(pass_name: str, run_pass: LossyPass, model: onnx.ModelProto, ctx: OnnxContext, *,
          kind: str, tolerance: Tolerance, original: onnx.ModelProto,
          reference: list[list[np.ndarray]], samples: Sequence[dict[str, np.ndarray]]
          ) -> tuple[onnx.ModelProto | None, GuardReport]:
    """:func:`_guard`, with a progress line when it runs long (its sessions and probe runs)."""
    with progress(f"accuracy guard on the {pass_name} pass"):
        return _guard(pass_name, run_pass, model, ctx, kind=kind, tolerance=tolerance,
                      original=original, reference=reference, samples=samples)


def _guard(pass_name: str, run_pass: LossyPass, model: onnx.ModelProto, ctx: OnnxContext, *,
           kind: str, tolerance: Tolerance, original: onnx.ModelProto,
           reference: list[list[np.ndarray]], samples: Sequence[dict[str, np.ndarray]]
           ) -> tuple[onnx.ModelProto | None, GuardReport]:
    """Run a lossy pass under the guard; returns (model or None if reverted/unchanged, report).

    ``original`` is the model before any lossy pass and ``reference`` its outputs on
    ``samples``: errors are measured against it, so successive passes cannot drift.
    """
    report = GuardReport(pass_name, tolerance)
    names = [o.name for o in original.graph.output]
    saved = {k: dict(v) for k, v in ctx.decisions.items()}
    cand = run_pass(model, ctx, frozenset())
    if cand is None:
        report.reason = "the pass changed nothing"
        ctx.decisions = _reverted(saved, ctx.decisions, kind, report)
        logger.info("guard %s: %s", pass_name, report.reason)
        return None, report
    lowered = _lowered(ctx, kind, {n.name: i for i, n in enumerate(model.graph.node)})
    first = {k: dict(v) for k, v in ctx.decisions.items()}  # every node the pass lowers
    try:
        probe: Probe | None = build_probe(model, cand, lowered)
        report.sessions += 1
        report.not_measured = dict(probe.skipped)
    except GraphoptError as e:
        probe = None
        report.reason = f"no per-node sensitivity ({e.problem})"
    if probe is None or not probe.switched:
        result = _unmeasured(pass_name, cand, report, reference, samples, names, tolerance)
    else:
        result = _measured(pass_name, run_pass, model, ctx, cand, probe, kind, report,
                           saved, reference, samples, names)
    if result is None:
        ctx.decisions = _reverted(saved, first, kind, report)
        report.sensitivity = [replace(x, kept=True) for x in report.sensitivity]
        report.reverted = True
        report.reason = f"reverted: {report.reason}"
        sess = _session(model, "the model", report)
        report.final = compare(reference, run_samples(sess, samples, "the model"), names,
                               tolerance)
    _annotate(ctx, kind, report.sensitivity)
    logger.info("guard %s: %s (%d session(s), %d probe run(s))", pass_name, report.reason,
                report.sessions, report.runs)
    return result, report


def _unmeasured(pass_name: str, cand: onnx.ModelProto, report: GuardReport,
                reference: list[list[np.ndarray]], samples: Sequence[dict[str, np.ndarray]],
                names: list[str], tol: Tolerance) -> onnx.ModelProto | None:
    """Step 5 without a probe: the candidate as it is, or nothing."""
    sess = _session(cand, f"{pass_name} candidate", report)
    report.initial = report.final = compare(
        reference, run_samples(sess, samples, f"{pass_name} candidate"), names, tol)
    report.rounds = 1
    why = report.reason or "no node could be measured"
    if report.within:
        report.reason = f"within tolerance ({why})"
        return cand
    report.reason = f"beyond tolerance and {why}: " + "; ".join(
        e.describe() for e in report.final if not e.within)
    return None


def _measured(pass_name: str, run_pass: LossyPass, model: onnx.ModelProto, ctx: OnnxContext,
              cand: onnx.ModelProto, probe: Probe, kind: str, report: GuardReport,
              saved: dict[str, dict[str, Decision]], reference: list[list[np.ndarray]],
              samples: Sequence[dict[str, np.ndarray]], names: list[str]
              ) -> onnx.ModelProto | None:
    """Steps 1-5 with the probe."""
    tol = report.tolerance
    order = {n.name: i for i, n in enumerate(model.graph.node)}
    errors, measured = _measure(probe, samples, reference, names, tol)
    report.initial = report.final = errors
    report.rounds, report.samples_measured = 1, len(measured)
    ok = within(errors)
    report.sensitivity = _sensitivity(probe, measured, _lowered(ctx, kind, order),
                                      contribute=not ok)
    report.runs = probe.runs
    if ok:
        report.reason = "within tolerance"
        return cand
    worst = "; ".join(e.describe() for e in errors if not e.within)
    sens = report.sensitivity
    k = smallest_kept(probe, measured, [s.node for s in sens if not s.overflow],
                      {s.node for s in sens if s.overflow},
                      lambda refs, outs: within(compare(refs, outs, names, tol)),
                      _followers(model, kind, set(probe.switched)))
    del measured  # the lowered nodes' tensors are not needed any more
    if k is None:
        report.reason = (f"keeping every measured node in higher precision is not within "
                         f"tolerance ({worst})")
        return None
    checks = 0
    for keep in _kept_sets(sens, k):
        ctx.decisions = {key: dict(v) for key, v in saved.items()}
        cand = run_pass(model, ctx, frozenset(keep))
        if cand is None:
            report.reason = f"within tolerance only with every lowered node kept ({worst})"
            return None
        # the probe with exactly the nodes the re-run lowered (it may keep more: a follow op
        # after a kept GEMM): a re-run the probe puts outside tolerance is not checked
        really = set(probe.switched) - set(_lowered(ctx, kind, order))
        outs = [probe.run(f, really) for f in samples]
        report.runs = probe.runs
        fits = within(compare(reference, outs, names, tol))
        logger.info("guard %s: %d node(s) kept, the re-run keeps %d: %s on the probe", pass_name,
                    len(keep), len(really), "within tolerance" if fits else "beyond tolerance")
        if not fits:
            continue
        checks += 1
        if _checked(pass_name, cand, report, reference, samples, names):
            _kept(report, keep, worst)
            report.reason = f"within tolerance after moving {len(keep)} node(s) back"
            return cand
        if checks == MAX_CHECKS:
            break
    report.reason = (f"still beyond tolerance with the most sensitive nodes kept ({checks} "
                     f"real check(s)): {'; '.join(e.describe() for e in report.final)}")
    return None


def _checked(pass_name: str, cand: onnx.ModelProto, report: GuardReport,
             reference: list[list[np.ndarray]], samples: Sequence[dict[str, np.ndarray]],
             names: list[str]) -> bool:
    """Step 4's real check: the re-run's model in a session of its own, every sample."""
    report.rounds += 1
    sess = _session(cand, f"{pass_name} candidate", report)
    report.final = compare(reference, run_samples(sess, samples, f"{pass_name} candidate"),
                           names, report.tolerance)
    logger.info("guard %s check %d: %s", pass_name, report.rounds - 1,
                "within tolerance" if report.within else "beyond tolerance")
    return report.within


def _kept(report: GuardReport, keep: list[str], worst: str) -> None:
    """Mark the kept nodes and list them as fallbacks, most sensitive first."""
    chosen = set(keep)
    report.sensitivity = [replace(s, kept=s.node in chosen) for s in report.sensitivity]
    for s in report.sensitivity:
        if not s.kept:
            continue
        score = "overflow" if s.overflow else s.contribution
        why = ("overflow (inf/NaN) starts here" if s.overflow else
               f"adds relative error {s.local:.3g} by itself, estimated {s.contribution or 0:.3g}"
               " of the output's scale at the output")
        report.fallbacks.append(Fallback(s.node, report.rounds, "sensitivity",
                                         report_number(score), s.rank, f"{why} ({worst})"))


def _annotate(ctx: OnnxContext, kind: str, sens: list[NodeSensitivity]) -> None:
    """Each measured node's numbers on its decision of ``kind``."""
    for s in sens:
        d = ctx.decisions.get(s.node, {}).get(kind)
        if d is not None:
            numbers = {k: v for k, v in s.to_dict().items() if k != "node"}
            ctx.decisions[s.node][kind] = replace(d, detail=replace(
                d.detail, sensitivity=Sensitivity(**numbers)))


def _reverted(saved: dict[str, dict[str, Decision]], now: dict[str, dict[str, Decision]],
              kind: str, report: GuardReport) -> dict[str, dict[str, Decision]]:
    """The decisions before the pass, plus its decisions marked not applied, with why."""
    out = {k: dict(v) for k, v in saved.items()}
    if report.reason == "the pass changed nothing":
        for node, decisions in now.items():
            if kind in decisions:
                out.setdefault(node, {})[kind] = decisions[kind]
        return out
    for node, decisions in now.items():
        d = decisions.get(kind)
        if d is not None and d.applied:
            out.setdefault(node, {})[kind] = replace(
                d, applied=False, reason=f"reverted by the accuracy guard ({d.reason})")
    return out
