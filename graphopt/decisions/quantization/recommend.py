"""The model's weight format on a target: size, fit and preference decide it (cases 1-4).

The cases :func:`recommend_quant` handles:

1. Candidates are the original format and every SMALLER one (never an upcast, never a sideways
   16-bit swap such as fp16 -> bf16, which only loses mantissa) that the target can run: natively
   (:func:`~graphopt.decisions.quant_formats.runs_natively`), as weight-only GGUF or torch's
   weight-only formats (INT4 on GPUs with bf16 and on CPUs, 8-bit weight-only everywhere), or,
   on CPUs, as a float converted in software. Size = params x bpw / 8 + activations + GEMM
   workspace, checked against usable memory (total - reserve,
   :mod:`graphopt.decisions.memory_runtime.memory`).
2. quality: the best-ranked format that fits. balanced: a format of at most 8.5 bpw that fits,
   preferring ones the matrix units run natively (FP8, INT8, NVFP4) and then quality; it halves
   16-bit weights and doubles the tensor-core rate at a near-lossless cost. speed: the native
   low-bit format (FP8, INT8, NVFP4) with the highest datasheet peak that fits (ties go to
   quality); with none, the fastest native float, then the smallest weight-only format (INT4,
   4.25 bpw at g128, where it runs; else a GGUF).
3. Nothing fits: the smallest runnable format is returned with ``fits=False`` and the reason says
   how many bytes are missing and how many such devices the weights would need (INT4 where it
   runs, the smallest format since torch's 4-bit kernels joined the table).
4. An explicitly ``requested`` format that is larger than the original or that the target cannot
   run is NOT an error: the preference's pick is returned and the reason says why the request was
   not honoured (a plan for another machine must not crash). Unknown names raise GraphoptError.

Node level (each node's GEMM precision and who runs it) is the precision family's, numbered
on its own: :mod:`graphopt.decisions.precision.gemm`.
"""

from __future__ import annotations

import logging
import math

from graphopt.decisions.memory_runtime.memory import (
    GIB,
    ReservePolicy,
    gemm_workspace_bytes,
    usable_memory,
)
from graphopt.decisions.quant_formats import FORMATS, QuantFormat, get_format, runs_natively
from graphopt.errors import GraphoptError
from graphopt.hardware.profile import HardwareProfile
from graphopt.ir.plan_memory import QuantCandidate, QuantizationPlan

__all__ = ["PREFERENCES", "QuantCandidate", "QuantizationPlan", "recommend_quant", "runnable"]

logger = logging.getLogger(__name__)

PREFERENCES = ("quality", "balanced", "speed")
BALANCED_MAX_BPW = 8.5  # case 2: 8-bit formats including Q8_0's block scales
_LOW_BIT_PEAKS = frozenset({"fp8", "int8", "fp4"})


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def _accelerated(fmt: QuantFormat, target: HardwareProfile) -> bool:
    """Runs on the matrix units at its own width (not weight-only, not emulated)."""
    return not fmt.weight_only and runs_natively(fmt, target)[0]


def runnable(fmt: QuantFormat, target: HardwareProfile) -> tuple[bool, str]:
    """Natively, or on a CPU as a float converted in software (case 1), with the reason."""
    native, why = runs_natively(fmt, target)
    if native:
        return True, why
    if fmt.family == "float" and not target.is_gpu:
        return True, f"{fmt.display} runs converted to fp32 on this CPU (no native arithmetic)"
    return False, why


def _check_preference(preference: str) -> str:
    pref = preference.strip().lower()
    if pref not in PREFERENCES:
        raise GraphoptError(f"unknown quantization preference {preference!r}",
                            f"use one of: {', '.join(PREFERENCES)}")
    return pref


def _pick(pref: str, fits: list[QuantFormat], target: HardwareProfile
          ) -> tuple[QuantFormat, str] | None:
    """Case 2 over the eligible formats that fit."""
    if not fits:
        return None

    def rate(f: QuantFormat) -> float:
        return target.peak_flops.get(f.peak or "", 0.0)

    if pref == "quality":
        f = min(fits, key=lambda f: (f.quality_rank, not _accelerated(f, target)))
        return f, "the highest-quality format that fits"
    if pref == "balanced":
        small = [f for f in fits if f.bits_per_weight <= BALANCED_MAX_BPW]
        if small:
            f = min(small, key=lambda f: (not _accelerated(f, target), f.quality_rank))
            kind = "runs natively on the matrix units" if _accelerated(f, target) else (
                "is weight-only (no native 8-bit-or-smaller format fits)")
            return f, (f"balanced: the best format of <= {BALANCED_MAX_BPW} bpw that fits; it "
                       f"{kind}")
        f = min(fits, key=lambda f: f.quality_rank)
        return f, "balanced: nothing of <= 8.5 bpw is eligible; the best format that fits"
    low = [f for f in fits if f.peak in _LOW_BIT_PEAKS and _accelerated(f, target)]
    if low:
        f = min(low, key=lambda f: (-rate(f), f.quality_rank))
        return f, (f"speed: the fastest native low-bit format that fits "
                   f"({rate(f) / 1e12:.1f} T{'OPS' if f.peak == 'int8' else 'FLOPS'} dense peak)")
    floats = [f for f in fits if f.family == "float" and _accelerated(f, target)]
    if floats:
        f = min(floats, key=lambda f: (-rate(f), f.quality_rank))
        return f, "speed: no low-bit format runs natively here that fits; the fastest float"
    f = min(fits, key=lambda f: f.bits_per_weight)
    return f, "speed: the smallest weight-only format that fits (saves bandwidth, not FLOPs)"


def recommend_quant(target: HardwareProfile, param_count: int, original_format: str = "bf16",
                    preference: str = "balanced", *, activation_bytes: int = 0,
                    requested: str | None = None,
                    reserve_policy: ReservePolicy | None = None) -> QuantizationPlan:
    """The weight format for a model of ``param_count`` parameters on ``target`` (cases 1-4)."""
    pref = _check_preference(preference)
    orig = get_format(original_format)
    req = get_format(requested) if requested is not None else None
    if param_count <= 0:
        raise GraphoptError(f"param_count must be positive, got {param_count}",
                            "pass the model's number of parameters, e.g. plan.model.param_count")
    if activation_bytes < 0:
        raise GraphoptError(f"activation_bytes must be >= 0, got {activation_bytes}",
                            "pass the activation peak from memory_plan(), or 0")
    usable = usable_memory(target, reserve_policy)
    workspace, _ = gemm_workspace_bytes(target)
    orig_runs = runnable(orig, target)[0]
    cands: list[QuantCandidate] = []
    eligible: list[QuantFormat] = []
    for f in FORMATS.values():
        weights = math.ceil(param_count * f.bits_per_weight / 8)
        est = weights + activation_bytes + workspace
        runs, why = runnable(f, target)
        ok = runs
        if f.bits_per_weight > orig.bits_per_weight:
            ok, why = False, f"larger than the original {orig.display}"
        elif f.bits_per_weight == orig.bits_per_weight and f is not orig and orig_runs:
            ok, why = False, f"same size as the original {orig.display}: a swap only loses bits"
        cands.append(QuantCandidate(f.key, f.bits_per_weight, weights, est, est <= usable, ok,
                                    _accelerated(f, target), why))
        if ok:
            eligible.append(f)
    by_key = {c.format: c for c in cands}
    fitting = [f for f in eligible if by_key[f.key].fits]
    prefix = ""
    if req is not None:
        c = by_key[req.key]
        if c.eligible:
            short = "" if c.fits else (f"; does not fit: {_gib(c.est_memory_bytes - usable)} "
                                       f"missing of {_gib(c.est_memory_bytes)}")
            return _recommendation(req, c, usable, pref, orig, cands,
                                   f"{req.display} as requested ({c.note}){short}")
        prefix = f"requested {req.display} not used: {c.note}; "
    picked = _pick(pref, fitting, target)
    if picked is None:
        if not eligible:
            raise GraphoptError(f"no weight format runs on {target.display_name}",
                                "report this target: the format table has no entry for it")
        f = min(eligible, key=lambda f: f.bits_per_weight)
        c = by_key[f.key]
        missing = c.est_memory_bytes - usable
        devices = math.ceil((c.est_memory_bytes - workspace) / max(1, usable - workspace))
        why = (f"does not fit: even {f.display} ({f.bits_per_weight:g} bpw) needs "
               f"{_gib(c.est_memory_bytes)} but {target.display_name} has {_gib(usable)} usable; "
               f"{_gib(missing)} ({missing} B) missing. Shard over >= {devices} such devices "
               f"(tensor/pipeline parallel) or offload to host memory")
        return _recommendation(f, c, usable, pref, orig, cands, prefix + why)
    f, rule = picked
    c = by_key[f.key]
    why = (f"{rule}: {f.display} ({f.bits_per_weight:g} bpw) needs {_gib(c.est_memory_bytes)} of "
           f"{_gib(usable)} usable on {target.display_name}; {c.note}")
    return _recommendation(f, c, usable, pref, orig, cands, prefix + why)


def _recommendation(f: QuantFormat, c: QuantCandidate, usable: int, pref: str, orig: QuantFormat,
                    cands: list[QuantCandidate], reason: str) -> QuantizationPlan:
    logger.info("quantization (%s): %s, fits=%s", pref, f.key, c.fits)
    return QuantizationPlan(
        format=f.key, display=f.display, bits_per_weight=f.bits_per_weight,
        weight_bytes=c.weight_bytes, est_memory_bytes=c.est_memory_bytes,
        usable_bytes=usable, fits=c.fits,
        missing_bytes=max(0, c.est_memory_bytes - usable), preference=pref,
        original_format=orig.key, reason=reason, alternatives=tuple(cands))
