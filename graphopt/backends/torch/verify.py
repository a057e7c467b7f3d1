"""Compare the optimized module's outputs with the original's, per output, against a tolerance.

The budgets (relative to the output's scale, with a cosine floor) are
:func:`graphopt.decisions.tolerance.tolerance_for`'s; this module measures torch outputs
against them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

from graphopt.decisions.tolerance import Tolerance, same_nonfinite
from graphopt.ir.plan_run import OutputNumerics

__all__ = ["Comparison", "compare_batches", "compare_outputs"]


@dataclass(frozen=True)
class Comparison:
    """Error of one output: max abs, max rel (elementwise, guarded), cosine, and the verdict."""

    index: int
    max_abs: float
    max_rel: float
    cosine: float
    scale: float
    tolerance: Tolerance
    same_shape_dtype: bool

    @property
    def within(self) -> bool:
        if not self.same_shape_dtype:
            return False
        limit = self.tolerance.rel_to_scale * max(self.scale, 1e-30)
        return self.max_abs <= limit and (self.cosine >= self.tolerance.min_cosine
                                          or self.max_abs == 0.0)

    def describe(self) -> str:
        if not self.same_shape_dtype:
            return f"output {self.index}: shape or dtype differs"
        return (f"output {self.index}: max abs {self.max_abs:.3g} (limit "
                f"{self.tolerance.rel_to_scale * self.scale:.3g}), cosine {self.cosine:.6f}")

    def to_dict(self) -> dict[str, Any]:
        return {"output": self.index, "max_abs": self.max_abs, "max_rel": self.max_rel,
                "cosine": self.cosine, "scale": self.scale, "within": self.within,
                "tolerance": self.tolerance.to_dict()}

    def record(self) -> OutputNumerics:
        """The report's row (the plan's ``optimization.numerics``)."""
        return OutputNumerics(self.index, self.max_abs, self.max_rel, self.cosine, self.scale,
                              self.within, self.tolerance.budget())


def compare_outputs(reference: Any, candidate: Any, tol: Tolerance) -> list[Comparison]:
    """Compare every tensor leaf of two output pytrees; an inf or NaN in the reference must be
    the same inf or NaN in the candidate, and the finite values are compared."""
    ref_leaves, ref_spec = pytree.tree_flatten(reference)
    out_leaves, out_spec = pytree.tree_flatten(candidate)
    if ref_spec != out_spec:
        return [Comparison(0, math.inf, math.inf, 0.0, 0.0, tol, False)]
    result = []
    for i, (r, o) in enumerate(zip(ref_leaves, out_leaves, strict=True)):
        if not isinstance(r, torch.Tensor):
            same = r == o
            result.append(Comparison(i, 0.0 if same else math.inf, 0.0 if same else math.inf,
                                     1.0 if same else 0.0, 0.0, tol, bool(same)))
            continue
        same = isinstance(o, torch.Tensor) and r.shape == o.shape and r.dtype == o.dtype
        if not same:
            result.append(Comparison(i, math.inf, math.inf, 0.0, 0.0, tol, False))
            continue
        rf, of = r.detach().double().flatten(), o.detach().double().flatten()
        if not same_nonfinite(rf.cpu().numpy(), of.cpu().numpy()):  # not the reference's inf/NaN
            result.append(Comparison(i, math.inf, math.inf, 0.0, 0.0, tol, True))
            continue
        finite = torch.isfinite(rf)
        rf, of = rf[finite], of[finite]  # the reference's own inf/NaN, matched, count as equal
        if rf.numel() == 0:
            result.append(Comparison(i, 0.0, 0.0, 1.0, 0.0, tol, True))
            continue
        diff = (rf - of).abs()
        scale = float(rf.abs().max())
        denom = rf.abs().clamp_min(max(scale, 1e-30) * 1e-3)  # no blow-up near zero
        norms = float(rf.norm() * of.norm())
        cosine = float(rf @ of) / norms if norms > 0 else (1.0 if float(diff.max()) == 0 else 0.0)
        result.append(Comparison(i, float(diff.max()), float((diff / denom).max()), cosine,
                                 scale, tol, True))
    return result



def compare_batches(references: Sequence[Any], candidates: Sequence[Any], tol: Tolerance
                    ) -> list[Comparison]:
    """:func:`compare_outputs` over several batches: each output's values of every batch taken
    together (the ONNX guard's ``compare``), so the error stated is the worst over them and
    the scale is the largest; a batch whose outputs differ in structure, shape or dtype is
    that batch's own verdict."""
    per_batch = [compare_outputs(r, c, tol) for r, c in zip(references, candidates, strict=True)]
    broken = next((b for b in per_batch if not all(c.same_shape_dtype for c in b)), None)
    if broken is not None or len(per_batch) == 1:
        return broken if broken is not None else per_batch[0]
    joined_ref, joined_out = [], []
    for ref_leaves, out_leaves in zip(zip(*(pytree.tree_leaves(r) for r in references),
                                          strict=True),
                                      zip(*(pytree.tree_leaves(c) for c in candidates),
                                          strict=True), strict=True):
        if not isinstance(ref_leaves[0], torch.Tensor):
            joined_ref.append(ref_leaves[0])
            joined_out.append(out_leaves[0])
            continue
        joined_ref.append(torch.cat([t.detach().flatten() for t in ref_leaves]))
        joined_out.append(torch.cat([t.detach().flatten() for t in out_leaves]))
    return compare_outputs(joined_ref, joined_out, tol)
