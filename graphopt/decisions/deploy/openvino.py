"""The inference precision OpenVINO runs graphopt's optimized ONNX model at, and the budget its
outputs are checked against.

graphopt picks bf16 on a CPU only where the CPU computes it natively (AMX, AVX512-BF16); the
same rule holds here, read from OpenVINO's own view of the CPU (its ``OPTIMIZATION_CAPABILITIES``
lists ``BF16`` exactly there). Elsewhere bf16 would be emulated, slower than f32, and OpenVINO's
CPU plugin silently runs f32 anyway. A precision the user pinned (``precision="fp32"``) holds for
this artifact too. Pure functions: the capabilities are given, so a test needs no such CPU.
"""

from __future__ import annotations

from collections.abc import Iterable

from graphopt.decisions.tolerance import Tolerance, tolerance_for
from graphopt.ir.options import Options

__all__ = ["OV_PRECISIONS", "inference_precision", "reduced_budget"]

#: the inference precisions graphopt asks OpenVINO's CPU plugin for (its own spellings)
OV_PRECISIONS = ("f32", "bf16")


def inference_precision(capabilities: Iterable[str], requested: str | None = None
                        ) -> tuple[str, str]:
    """(precision, why) for OpenVINO's ``INFERENCE_PRECISION_HINT``: ``"bf16"`` when OpenVINO
    reports native BF16 and the run's ``precision`` option (None: an ONNX input, "auto") allows
    it, else ``"f32"``."""
    caps = sorted({str(c).upper() for c in capabilities})
    said = ", ".join(caps) or "none"
    if requested not in (None, "auto", "bf16"):
        return "f32", f"precision={requested!r} was asked for: f32"
    if "BF16" in caps:
        return "bf16", (f"the CPU computes bf16 natively (OpenVINO's CPU capabilities: {said}): "
                        "bf16, as graphopt picks on such CPUs")
    return "f32", f"no native bf16 on this CPU (OpenVINO's CPU capabilities: {said}): f32"


def reduced_budget(base: Tolerance, options: Options | None) -> Tolerance:
    """The budget of bf16 inference over an artifact checked at ``base``: the wider of the two,
    bf16's (``decisions/tolerance``; the user's ``tolerance`` where given) or ``base``."""
    bf16 = tolerance_for("bf16") if options is None else options.lossy_budget(
        tolerance_for("bf16"))
    return Tolerance(max(base.rel_to_scale, bf16.rel_to_scale),
                     min(base.min_cosine, bf16.min_cosine))
