"""The compute format a target runs: the model-level precision decision, with its reason.

Sources:
  [HW]  graphopt/hardware: a dtype is native where the profile lists its peak; bf16 tensor
        cores from sm_80 (``capabilities_for``), AMX/AVX512-BF16 on CPUs.
"""

from __future__ import annotations

from graphopt.errors import GraphoptError
from graphopt.hardware.profile import HardwareProfile

__all__ = ["choose_precision", "native_format", "onnx_precision"]

_CHOICES = ("auto", "fp32", "tf32", "bf16", "fp16")


def _ratio(target: HardwareProfile, fmt: str) -> float:
    return target.peak_flops.get(fmt, 0.0) / max(target.peak_flops.get("fp32", 0.0), 1.0)


def _where(target: HardwareProfile) -> str:
    cc = target.compute_capability
    return (f"{target.display_name} ({target.generation}, sm_{cc[0]}{cc[1]})" if cc
            else f"{target.display_name}")


def native_format(target: HardwareProfile) -> str:
    """The fastest format ``target`` runs natively: the one rule for a target's default format.

    Both the model-level ``"auto"`` choice and the plan's carrier format
    (``precision.gemm.carrier_format``) use it. A dtype is native where the profile lists its
    peak [HW]; on a CPU bf16 must also beat fp32, else it is emulated.
    """
    if target.is_gpu:
        return next((f for f in ("bf16", "fp16") if f in target.peak_flops), "fp32")
    return "bf16" if _ratio(target, "bf16") > 1.0 else "fp32"


def _auto(target: HardwareProfile) -> tuple[str, str]:
    where, fmt = _where(target), native_format(target)
    if target.is_gpu:
        if fmt == "bf16":
            return "bf16", (f"bf16: {where} has bf16 tensor cores at {_ratio(target, 'bf16'):.0f}x "
                            "the fp32 peak, and bf16 keeps fp32's exponent range (no fp16 "
                            "overflow)")
        if fmt == "fp16":
            return "fp16", (f"fp16: {where} tensor cores run fp16 at {_ratio(target, 'fp16'):.0f}x"
                            " the fp32 peak but not bf16 (bf16 tensor cores start at sm_80)")
        return "fp32", f"fp32: {where} has no reduced-precision tensor cores"
    if fmt == "bf16":
        return "bf16", (f"bf16: {where} runs bf16 natively (AMX/AVX512-BF16/BF16 dot products) "
                        f"at {_ratio(target, 'bf16'):.0f}x the fp32 peak")
    return "fp32", (f"fp32: {where} has no native bf16 (needs AVX512-BF16 or AMX): bf16 would "
                    "be emulated and slower than fp32")


def choose_precision(target: HardwareProfile, requested: str) -> tuple[str, str]:
    """The compute dtype for ``target`` and the user's request, with the reason.

    ``"auto"`` picks the fastest format the target runs natively: bf16 on sm_80+ GPUs, fp16 on
    Volta/Turing, bf16 on CPUs whose bf16 peak exceeds fp32 (AMX, AVX512-BF16), else fp32.
    An explicit bf16/fp16 request the target cannot run natively is a wish for reduced
    precision, not an order: it falls back to what ``"auto"`` picks and the reason says so
    (rather than raising, so one script runs on every target). ``"tf32"`` needs sm_80+ tensor
    cores, else fp32. Unknown requests raise GraphoptError.
    """
    if requested not in _CHOICES:
        raise GraphoptError(f"precision={requested!r} is not an option",
                            f"use one of: {', '.join(_CHOICES)}")
    auto, auto_reason = _auto(target)
    if requested == "auto":
        return auto, auto_reason
    if requested == "fp32":
        return "fp32", "fp32 as requested: no reduced precision"
    where = _where(target)
    if requested == "tf32":
        if target.is_gpu and target.has("tf32"):
            return "tf32", (f"tf32 as requested: {where} runs fp32 GEMMs on tensor cores with "
                            "10-bit mantissa inputs and fp32 accumulation")
        return "fp32", (f"fp32: tf32 requested, but {where} has no TF32 tensor cores (a GPU "
                        "format from Ampere, sm_80, on)")
    if requested in target.peak_flops:
        return requested, (f"{requested} as requested: {where} runs it natively at "
                           f"{_ratio(target, requested):.0f}x the fp32 peak")
    return auto, (f"{auto}: {requested} requested, but {where} does not run {requested} "
                  f"natively (it would be emulated, slower than fp32); fell back to the auto "
                  f"choice ({auto_reason})")


def onnx_precision(target: HardwareProfile, requested: str) -> tuple[str, str]:
    """The torch path's precision choice, as ONNX Runtime can run it: the named exception to
    one choice for both backends.

    bf16 becomes fp16 on ONNX: ONNX's Conv/pooling schemas (opset <= 21) have no bf16, ORT's
    CPU EP has no bf16 kernels at all (measured, ORT 1.31: MatMul/Add/... NOT_IMPLEMENTED), so
    a bf16 graph could not run everywhere nor be checked by the guard; fp16 runs on the same
    tensor cores at the same peak on sm_80+, and the guard handles fp16's narrower range.
    On CPU targets reduced precision stays fp32 (ORT's CPU EP runs fp16 by casting to fp32).
    """
    chosen, why = choose_precision(target, requested)
    if chosen in ("bf16", "fp16") and not target.is_gpu:
        return "fp32", (f"fp32: {why}; but ORT's CPU EP has no native bf16/fp16 kernels "
                        "(it would insert casts around fp32 kernels), so the ONNX model stays "
                        "fp32")
    if chosen == "bf16":
        if "fp16" in target.peak_flops:
            return "fp16", (f"fp16 with fp32 islands ({why}; on ONNX bf16 becomes fp16: no bf16 "
                            "Conv in ONNX, no bf16 kernels in ORT's CPU EP, same tensor-core "
                            "peak; the accuracy guard covers fp16's range)")
        return "fp32", f"fp32: {why}; but the target has no fp16 tensor cores for ONNX's fp16"
    return chosen, why
