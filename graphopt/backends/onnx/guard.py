"""The accuracy guard: measure a lossy pass's outputs against the original model in ONNX
Runtime, and move the most sensitive nodes back to higher precision until within tolerance.

Metrics per output, over every sample (calibration data, else seeded sample inputs): max abs,
max rel (elementwise, denominators floored at 1e-3 of the output's scale), cosine similarity,
SNR in dB (``10 log10(sum ref^2 / sum (ref - out)^2)``). The verdict is ``verify.Tolerance``'s:
``max abs <= rel_to_scale * max |ref|`` and ``cosine >= min_cosine``, all values finite.

Fallback loop (per-node sensitivity, bisection when it cannot tell):

1. Run the pass with the nodes blocked so far kept at high precision (``exclude``); measure.
2. Within tolerance: done. Else run the original and the candidate once more with every
   intermediate float tensor as an output, and score each node the pass lowered: the error it
   adds, ``err(out) - max err(in)`` with ``err = max|ref - out| / max|ref|``; a node whose output
   is inf/NaN while its inputs are finite is where fp16 overflowed (score inf).
3. Block every overflow origin plus the top ``2^round`` scored nodes; if no node scores above
   zero (renamed tensors: nothing to compare), block the first half of what is still lowered
   (bisection). Re-run the pass from 1.
4. Nothing left to block and still beyond tolerance: the pass is reverted, and says so.

A lossy pass is ``pass_(model, ctx, exclude)``: it keeps the nodes named in ``exclude`` at high
precision and records each node it lowers as an applied decision of its kind (``"precision"``,
``"quantize"``).
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import onnx
from tqdm import tqdm

from graphopt.backends.onnx.context import OnnxContext
from graphopt.backends.onnx.ort_runner import (
    OrtModel,
    emulate_fp16,
    float_tensors,
    tensor_types,
    with_outputs,
)
from graphopt.decisions.tolerance import Tolerance
from graphopt.ir.plan import Decision

__all__ = ["GuardReport", "LossyPass", "OutputError", "compare", "guard", "run_samples",
           "snr_text"]

logger = logging.getLogger(__name__)

#: a lossy pass: (model, ctx, exclude) -> new model or None
LossyPass = Callable[[onnx.ModelProto, OnnxContext, frozenset[str]], "onnx.ModelProto | None"]
#: more rounds than this never help: 2^12 nodes blocked in the last one
_MAX_ROUNDS = 12


def snr_text(snr_db: float) -> str:
    """"SNR 43.2 dB", or "no error" where the outputs are equal (the SNR is infinite)."""
    return "no error" if math.isinf(snr_db) and snr_db > 0 else f"SNR {snr_db:.1f} dB"


@dataclass(frozen=True)
class OutputError:
    """Error of one model output over all samples, and the verdict."""

    name: str
    max_abs: float
    max_rel: float
    cosine: float
    snr_db: float
    scale: float
    finite: bool
    tolerance: Tolerance
    #: values that are inf/NaN in the candidate but finite in the reference
    nonfinite: int = 0

    @property
    def within(self) -> bool:
        if not self.finite:
            return False
        return (self.max_abs <= self.tolerance.rel_to_scale * max(self.scale, 1e-30)
                and (self.cosine >= self.tolerance.min_cosine or self.max_abs == 0.0))

    def describe(self) -> str:
        bad = f"{self.nonfinite} inf/NaN value(s); finite ones: " if self.nonfinite else ""
        return (f"{self.name}: {bad}max abs {self.max_abs:.3g} (limit "
                f"{self.tolerance.rel_to_scale * self.scale:.3g}), max rel {self.max_rel:.3g}, "
                f"cosine {self.cosine:.6f}, {snr_text(self.snr_db)}")

    def to_dict(self) -> dict[str, Any]:
        return {"output": self.name, "max_abs": self.max_abs, "max_rel": self.max_rel,
                "cosine": self.cosine, "snr_db": self.snr_db, "scale": self.scale,
                "finite": self.finite, "nonfinite": self.nonfinite, "within": self.within,
                "tolerance": self.tolerance.to_dict()}


@dataclass
class GuardReport:
    """What the guard measured for one lossy pass and what it moved back."""

    pass_name: str
    tolerance: Tolerance
    initial: list[OutputError] = field(default_factory=list)
    final: list[OutputError] = field(default_factory=list)
    fallbacks: list[dict[str, Any]] = field(default_factory=list)
    rounds: int = 0
    reverted: bool = False
    reason: str = ""

    @property
    def within(self) -> bool:
        return all(e.within for e in self.final)

    def to_dict(self) -> dict[str, Any]:
        return {"pass": self.pass_name, "tolerance": self.tolerance.to_dict(),
                "rounds": self.rounds, "reverted": self.reverted, "reason": self.reason,
                "initial": [e.to_dict() for e in self.initial],
                "final": [e.to_dict() for e in self.final], "fallbacks": list(self.fallbacks)}


def _bar(total: int, desc: str) -> tqdm:
    # progress on stderr; tqdm hides it when stderr is not a terminal (disable=None)
    return tqdm(total=total, desc=desc, file=sys.stderr, disable=None, leave=False)


def run_samples(model: onnx.ModelProto | OrtModel, samples: Sequence[dict[str, np.ndarray]],
                what: str = "the model", outputs: Sequence[str] | None = None
                ) -> list[list[np.ndarray]]:
    """Outputs of ``model`` for each sample, with a progress bar; fp16 tensors are rounded
    explicitly (``ort_runner.emulate_fp16``: ORT's CPU EP would run most of them in fp32)."""
    sess = model if isinstance(model, OrtModel) else OrtModel(emulate_fp16(model), what=what)
    with _bar(len(samples), f"running {what}") as bar:
        result = []
        for feed in samples:
            result.append(sess.run(feed, outputs))
            bar.update()
    return result


def compare(reference: list[list[np.ndarray]], candidate: list[list[np.ndarray]],
            names: Sequence[str], tol: Tolerance) -> list[OutputError]:
    """Per-output metrics over all samples (``reference[sample][output]``)."""
    errors = []
    for k, name in enumerate(names):
        r = np.concatenate([np.asarray(s[k], dtype=np.float64).ravel() for s in reference])
        c = np.concatenate([np.asarray(s[k], dtype=np.float64).ravel() for s in candidate])
        if r.shape != c.shape:
            errors.append(OutputError(name, math.inf, math.inf, 0.0, -math.inf, 0.0, False, tol))
            continue
        bad = int(np.count_nonzero(np.isfinite(r) & ~np.isfinite(c)))
        finite = bad == 0 and bool(np.array_equal(np.isfinite(c), np.isfinite(r)))
        ok = np.isfinite(r) & np.isfinite(c)
        r, c = r[ok], c[ok]
        if r.size == 0:
            errors.append(OutputError(name, 0.0, 0.0, 1.0, math.inf, 0.0, finite, tol, bad))
            continue
        diff = np.abs(r - c)
        scale = float(np.abs(r).max())
        rel = float((diff / np.maximum(np.abs(r), max(scale, 1e-30) * 1e-3)).max())
        norms = float(np.linalg.norm(r) * np.linalg.norm(c))
        cosine = float(r @ c) / norms if norms > 0 else (1.0 if diff.max() == 0 else 0.0)
        noise = float((diff ** 2).sum())
        snr = math.inf if noise == 0 else 10 * math.log10(max(float((r ** 2).sum()), 1e-300)
                                                           / noise)
        errors.append(OutputError(name, float(diff.max()), rel, cosine, snr, scale, finite, tol,
                                  bad))
    return errors


def _rel_err(r: np.ndarray, c: np.ndarray) -> float:
    r64, c64 = np.asarray(r, dtype=np.float64), np.asarray(c, dtype=np.float64)
    if r64.shape != c64.shape or r64.size == 0:
        return 0.0
    if not np.all(np.isfinite(c64)) and np.all(np.isfinite(r64)):
        return math.inf
    ok = np.isfinite(r64) & np.isfinite(c64)
    scale = float(np.abs(r64[ok]).max()) if ok.any() else 0.0
    return float(np.abs(r64[ok] - c64[ok]).max()) / max(scale, 1e-30) if ok.any() else 0.0


def sensitivity(original: onnx.ModelProto, candidate: onnx.ModelProto, lowered: Sequence[str],
                sample: dict[str, np.ndarray]) -> dict[str, float]:
    """Score of each lowered node: the relative error it adds (inf: it overflowed)."""
    t_ref, t_cand = tensor_types(original), tensor_types(candidate)
    names = [t for t in float_tensors(original, t_ref) if t in t_cand]
    ref = dict(zip(names, OrtModel(with_outputs(original, names, t_ref), what="the original")
                   .run(sample, names), strict=True))
    probe = emulate_fp16(with_outputs(candidate, names, t_cand))
    got = dict(zip(names, OrtModel(probe, what="the candidate").run(sample, names), strict=True))
    err = {t: _rel_err(ref[t], got[t]) for t in names}
    by_name = {n.name: n for n in original.graph.node}
    scores = {}
    for name in lowered:
        node = by_name.get(name)
        if node is None:
            continue
        outs = [err[o] for o in node.output if o in err]
        if not outs:
            continue
        e_in = max((err.get(t, 0.0) for t in node.input), default=0.0)
        e_out = max(outs)
        scores[name] = (0.0 if math.isinf(e_in) else math.inf) if math.isinf(e_out) else max(
            e_out - e_in, 0.0)
    return scores


def _lowered(ctx: OnnxContext, kind: str, blocked: set[str]) -> list[str]:
    return [n for n, d in ctx.decisions.items()
            if kind in d and d[kind].applied and n not in blocked]


def guard(pass_name: str, run_pass: LossyPass, model: onnx.ModelProto, ctx: OnnxContext, *,
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
    blocked: set[str] = set()
    order = {n.name: i for i, n in enumerate(model.graph.node)}
    result: onnx.ModelProto | None = None
    with _bar(_MAX_ROUNDS, f"guard {pass_name}") as bar:
        for rnd in range(_MAX_ROUNDS):
            ctx.decisions = {k: dict(v) for k, v in saved.items()}
            cand = run_pass(model, ctx, frozenset(blocked))
            if cand is None:
                report.reason = "the pass changed nothing" if rnd == 0 else (
                    "every lowered node was moved back")
                break
            errors = compare(reference, run_samples(cand, samples, f"{pass_name} candidate"),
                             names, tolerance)
            report.rounds = rnd + 1
            report.initial = report.initial or errors
            report.final = errors
            bar.update()
            if all(e.within for e in errors):
                result = cand
                report.reason = "within tolerance" + (
                    f" after moving {len(report.fallbacks)} node(s) back" if report.fallbacks
                    else "")
                break
            lowered = sorted(_lowered(ctx, kind, blocked), key=lambda n: order.get(n, 0))
            if not lowered:
                report.reason = "still beyond tolerance with nothing left to move back"
                break
            if rnd == _MAX_ROUNDS - 1:
                report.reason = f"still beyond tolerance after {_MAX_ROUNDS} rounds"
                break
            scores = sensitivity(original, cand, lowered, samples[0])
            ranked = sorted((s, n) for n, s in scores.items() if s > 0)[::-1]
            pick = [n for s, n in ranked if math.isinf(s)]
            pick += [n for s, n in ranked if not math.isinf(s)][:2 ** rnd]
            how = "sensitivity"
            if not pick:
                pick, how = lowered[:max(1, len(lowered) // 2)], "bisection"
            worst = "; ".join(e.describe() for e in errors if not e.within)
            for n in pick:
                s = scores.get(n)
                report.fallbacks.append({
                    "node": n, "round": rnd + 1, "how": how,
                    "score": None if s is None else (s if math.isfinite(s) else "overflow"),
                    "reason": ("overflow (inf/NaN) starts here" if s is not None and math.isinf(s)
                               else f"adds relative error {s:.3g}" if s
                               else "bisection over the lowered nodes") + f" ({worst})"})
            blocked |= set(pick)
            logger.info("guard %s round %d: %s; moving %d node(s) back by %s", pass_name,
                        rnd + 1, worst, len(pick), how)
    if result is None:
        ctx.decisions = _reverted(saved, ctx.decisions, kind, report)
        report.reverted = report.rounds > 0 and report.reason != "the pass changed nothing"
        if report.reverted:
            report.reason = f"reverted: {report.reason}"
            report.final = compare(reference, run_samples(model, samples, "the model"), names,
                                   tolerance)
    logger.info("guard %s: %s", pass_name, report.reason)
    return result, report


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
