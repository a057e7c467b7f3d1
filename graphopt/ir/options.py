"""The user's options of ``graphopt.optimize``: one record and one table, for both backends.

Every option means the same on the torch module and on the ONNX model:

1. ``precision``: "auto" (the target's fastest 16-bit format where the plan says it pays, with
   fp32 islands) or a format by name.
2. ``pad``: tensor-core padding, "auto" (cost model, ``pad_margin``) | "always" | "never".
3. ``layout``: "auto" (cost model) | "channels_last" | "keep".
4. ``quantize``: "auto" (the plan's per-node format) | "none" | "int8_dynamic" (alias "int8")
   | "int8_static" | "fp8" | "int4" | "int8_weight_only". The torch module runs FP8, INT4,
   dynamic INT8 and 8-bit weight-only Linear layers with torch's own kernels
   (``backends/torch/quant_ops.py``); static INT8 needs ONNX Runtime's calibrated QDQ, and
   8-bit weight-only has no ONNX Runtime kernel here, so each backend refuses the one it cannot
   run, with the way to get it.
5. ``tolerance``: the budget of the lossy passes (precision, quantize): max |ref - out| <=
   tolerance * max |ref| per output; None: each format's own (``decisions.tolerance``).
6. ``measure``: time each auto-decided pass on this machine and revert it if slower; None:
   only when the target is this machine's CPU, the only case where the timing means anything.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal, TypeVar

from graphopt.errors import GraphoptError

__all__ = ["CHOICES", "Options"]

#: option -> allowed values, the same for both backends
CHOICES: dict[str, tuple[str, ...]] = {
    "precision": ("auto", "fp32", "tf32", "bf16", "fp16"),
    "pad": ("auto", "always", "never"),
    "layout": ("auto", "channels_last", "keep"),
    "quantize": ("auto", "none", "int8", "int8_dynamic", "int8_static", "fp8", "int4",
                 "int8_weight_only"),
}
#: quantize modes each backend can run
_RUNS = {"torch": ("auto", "none", "int8_dynamic", "fp8", "int4", "int8_weight_only"),
         "onnx": ("auto", "none", "int8_dynamic", "int8_static", "fp8", "int4")}

Backend = Literal["torch", "onnx"]
T = TypeVar("T")


@dataclass(frozen=True)
class Options:
    """Validated on construction; ``quantize="int8"`` is stored as "int8_dynamic"."""

    precision: str = "auto"
    pad: str = "auto"
    layout: str = "auto"
    quantize: str = "auto"
    tolerance: float | None = None
    #: padding must be predicted at least this much faster (Inductor's pad_mm uses 1.1x)
    pad_margin: float = 1.1
    measure: bool | None = None

    def __post_init__(self) -> None:
        for name, allowed in CHOICES.items():
            if getattr(self, name) not in allowed:
                raise GraphoptError(f"{name}={getattr(self, name)!r} is not an option",
                                    f"use one of: {', '.join(allowed)}")
        if self.quantize == "int8":
            object.__setattr__(self, "quantize", "int8_dynamic")
        if self.tolerance is not None and not (  # a bool is an int to Python, not a budget
                isinstance(self.tolerance, (int, float)) and
                not isinstance(self.tolerance, bool) and math.isfinite(self.tolerance)
                and self.tolerance > 0):
            raise GraphoptError(f"tolerance={self.tolerance!r} must be a positive number",
                                "give the budget as a fraction of each output's scale, e.g. 0.01")
        if self.measure is not None and not isinstance(self.measure, bool):
            raise GraphoptError(f"measure={self.measure!r} is not True, False or None",
                                "pass measure=True to time each pass here, False not to, or "
                                "leave it out (timed only when the target is this CPU)")

    def lossy_budget(self, base: T) -> T:
        """``base`` (a format's Tolerance) with the user's ``tolerance`` as its budget, when
        given; the cosine floor stays the format's."""
        if self.tolerance is None:
            return base
        return dataclasses.replace(base, rel_to_scale=float(self.tolerance))  # type: ignore

    def check_backend(self, backend: Backend) -> Options:
        """``self`` when ``backend`` can honour every option, else a GraphoptError."""
        if self.quantize in _RUNS[backend]:
            return self
        if backend == "torch":
            raise GraphoptError(
                f"quantize={self.quantize!r} needs activation scales from calibration data, "
                "which graphopt applies as ONNX Runtime QDQ nodes; a torch module quantizes "
                "activations per call (int8_dynamic, fp8) or weights only (int4, "
                "int8_weight_only)",
                f"export the model to ONNX (opt.export_onnx('m.onnx')) and optimize that file: "
                f"graphopt.optimize('m.onnx', quantize={self.quantize!r}, calibration=...); or "
                "pass quantize='int8'")
        raise GraphoptError(
            f"quantize={self.quantize!r}: ONNX Runtime has no 8-bit weight-only MatMul kernel "
            "that graphopt emits",
            "optimize the torch module for it (graphopt.optimize(model, inputs, "
            "quantize='int8_weight_only')), or use quantize='int4' (MatMulNBits) or "
            "'int8_dynamic' on ONNX")
