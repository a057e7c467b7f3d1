"""How far an optimized model's outputs may move from the original's, per compute precision.

Tolerances are relative to the output's scale (its largest magnitude): fp32 rewrites must stay
within 1e-5 of it; reduced precision within the budget below, and with a cosine similarity
floor so a small max error cannot hide a wrong direction. Both backends check against these
(the torch pass verifier and the ONNX accuracy guard), so the budget lives here, torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from graphopt.ir.plan_run import ToleranceBudget

__all__ = ["Tolerance", "loosest", "same_nonfinite", "tolerance_for"]


@dataclass(frozen=True)
class Tolerance:
    rel_to_scale: float  # max |ref - out| <= rel_to_scale * max |ref|
    min_cosine: float

    def to_dict(self) -> dict[str, float]:
        return {"rel_to_scale": self.rel_to_scale, "min_cosine": self.min_cosine}

    def budget(self) -> ToleranceBudget:
        """The report's record of it (the plan's ``optimization.tolerance``)."""
        return ToleranceBudget(self.rel_to_scale, self.min_cosine)

    @classmethod
    def of(cls, budget: ToleranceBudget) -> Tolerance:
        """The tolerance a report's record holds."""
        return cls(budget.rel_to_scale, budget.min_cosine)


# fp32 rewrites (folding, padding, layout) reorder float sums at most: 1e-5 of scale.
# TF32 keeps 10 mantissa bits, fp16 10, bf16 7 (unit roundoff 2^-11, 2^-11, 2^-8); budgets
# leave room for error accumulated over a deep network, and cosine catches systematic drift.
_TOLERANCES = {
    "fp32": Tolerance(1e-5, 0.999999),
    "tf32": Tolerance(5e-3, 0.9999),
    "fp16": Tolerance(1e-2, 0.9995),
    "bf16": Tolerance(4e-2, 0.999),
    # dynamic INT8: 8-bit weights per channel and activations per call (~1-2% of scale measured
    # on a 1024x1024 Linear); cosine guards the direction
    "int8": Tolerance(5e-2, 0.999),
    # 8-bit weights, float activations: the weight error alone (0.5-0.8% of a Linear's output
    # scale measured, tests/test_quant_kernels.py), so INT8's budget holds
    "int8_weight_only": Tolerance(5e-2, 0.999),
    # FP8 e4m3 keeps 3 mantissa bits for weights and activations alike: 2.9-3.5% of a Linear's
    # output scale measured per layer (tests/test_quant_kernels.py), twice that over a model
    "fp8_e4m3": Tolerance(8e-2, 0.998),
    # 4-bit weights, 16 levels per group: 5.8% of a Linear's output scale at group 32, more
    # at 128; the per-node guard keeps the layers that would break this in bf16
    "int4": Tolerance(1.2e-1, 0.995),
}


def tolerance_for(precision: str) -> Tolerance:
    return _TOLERANCES.get(precision, _TOLERANCES["fp32"])


def loosest(formats: set[str] | frozenset[str] | list[str]) -> str:
    """The format among ``formats`` with the widest budget (a pass applying several formats is
    checked against it), "fp32" for none."""
    return max(formats, key=lambda f: tolerance_for(f).rel_to_scale, default="fp32")


def same_nonfinite(reference: Any, out: Any) -> bool:
    """Whether ``out`` holds an inf or NaN exactly where ``reference`` holds the same one: a
    model whose own outputs hold NaN or inf keeps them and is compared on its finite values;
    any other inf or NaN is an error (numpy arrays, one comparison for every output check)."""
    ref, got = np.asarray(reference), np.asarray(out)
    return bool(np.array_equal(np.where(np.isfinite(ref), 0, ref),
                               np.where(np.isfinite(got), 0, got), equal_nan=True))
