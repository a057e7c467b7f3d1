"""Comparing a candidate's outputs with the original model's, as the accuracy guard and the
pipeline's checks do: per-output metrics over all samples and the tolerance verdict.

Metrics per output, over every sample (calibration data, else seeded sample inputs): max abs,
max rel (elementwise, denominators floored at 1e-3 of the output's scale), cosine similarity,
SNR in dB (``10 log10(sum ref^2 / sum (ref - out)^2)``). The verdict is ``verify.Tolerance``'s:
``max abs <= rel_to_scale * max |ref|`` and ``cosine >= min_cosine``, all values finite.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from tqdm import tqdm

from graphopt.backends.onnx.ort_runner import OrtModel, emulate_fp16
from graphopt.decisions.tolerance import Tolerance, same_nonfinite
from graphopt.ir.plan_run import OutputNumerics

__all__ = ["OutputError", "compare", "report_number", "run_samples", "snr_text", "within"]


def report_number(v: Any) -> Any:
    """A number as the ONNX report writes it: a numpy scalar as Python's, a non-finite float
    as "inf", "-inf" or "nan" (an exact output's SNR is infinite; JSON holds no inf)."""
    if isinstance(v, np.generic):
        v = v.item()
    return str(v) if isinstance(v, float) and not math.isfinite(v) else v


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

    def record(self) -> OutputNumerics:
        """The report's row (the plan's ``optimization.numerics``), numbers as
        :func:`report_number` writes them."""
        n = report_number
        return OutputNumerics(self.name, n(self.max_abs), n(self.max_rel), n(self.cosine),
                              n(self.scale), n(self.within), self.tolerance.budget(),
                              snr_db=n(self.snr_db), finite=n(self.finite),
                              nonfinite=n(self.nonfinite))


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
        # the reference's own inf/NaN count as equal where the candidate has the same one
        finite = bad == 0 and same_nonfinite(r, c)
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


def within(errors: Sequence[OutputError]) -> bool:
    return all(e.within for e in errors)
