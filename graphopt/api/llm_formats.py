"""The format each weight GEMM of an LLM phase is costed at: case 5 of :mod:`graphopt.api.llm`.

5. Formats (``quantize``): "none" costs every node at the weights' own dtype; "auto" each weight
   GEMM at the format its precision decision picked
   (:mod:`graphopt.decisions.precision.gemm`, at the plan's opt batch); a format name ("fp8",
   "int8", "int4") every weight GEMM but the sensitive ones, which stay at the weights' dtype
   as the precision decision keeps them (:func:`~graphopt.decisions.precision.gemm.sensitive_gemms`,
   precision.gemm case 2: on GPUs the first and last weight GEMM; GEMMs no output depends
   on); a format the target cannot run is an error that names those it can. A GEMM at a
   format reads its weights at the format's bits per weight and its activations at the
   carrier (:func:`~graphopt.decisions.precision.cost.cost_at_format`, what precision.gemm
   costs with); it computes at the format's peak (FP8, INT8: W8A8) or, weight-only, at the
   dtype its kernel runs (``quant_formats.FORMAT_DTYPE``: INT4 in bf16), which its
   activations are converted to. The KV cache stays at the model's dtype.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from graphopt.analysis.record import NodeAnalysis
from graphopt.cost.roofline import NodeCost
from graphopt.decisions.precision.cost import cost_at_format, is_weight_gemm, weight_tensors
from graphopt.decisions.precision.gemm import sensitive_gemms
from graphopt.decisions.quant_formats import FORMAT_DTYPE, FORMATS, QuantFormat, get_format
from graphopt.decisions.quantization.recommend import runnable
from graphopt.errors import GraphoptError
from graphopt.hardware.profile import HardwareProfile
from graphopt.ir.graph import DTYPE_BITS, TensorInfo
from graphopt.ir.plan import Plan
from graphopt.ir.plan_llm import GemmFormats

__all__ = ["WeightFormats", "cost_dtype", "format_cost", "format_note", "quantize_key",
           "weight_formats"]

logger = logging.getLogger(__name__)

#: the formats a "can't run here" error suggests, best first, where the target runs them
_SUGGEST = ("fp8_e4m3", "int8", "int4", "int8_weight_only", "nvfp4")


@dataclass(frozen=True, slots=True)
class WeightFormats:
    """The format each weight GEMM of one phase is costed at (case 5)."""

    #: "none", "auto" or a format key
    quantize: str
    #: node -> the low-precision format it is costed at
    applied: Mapping[str, str]
    #: node -> why it stays at the weights' dtype although ``quantize`` asked for a format
    kept: Mapping[str, str]
    #: format -> how many weight GEMMs run at it (the kept ones at their weights' dtype)
    counts: Mapping[str, int]

    @property
    def precision(self) -> dict[str, str] | None:
        """The ``precision`` argument of
        :func:`~graphopt.decisions.memory_runtime.memory.memory_plan`."""
        return dict(self.applied) or None

    def record(self) -> GemmFormats:
        """The ``llm`` section's record of this phase's formats."""
        return GemmFormats(dict(self.counts), dict(self.kept))


def quantize_key(quantize: Any, target: HardwareProfile) -> str:
    """``quantize`` checked against ``target`` (case 5): "none", "auto" or a format key."""
    usage = "pass quantize='none', 'auto' or a format: 'fp8', 'int8', 'int4'"
    if not isinstance(quantize, str):
        raise GraphoptError(f"quantize must be a string, got {quantize!r}", usage)
    q = quantize.strip().lower()
    if q in ("none", "auto"):
        return q
    try:
        fmt = get_format(q)
    except GraphoptError as e:
        raise GraphoptError(f"unknown quantize {quantize!r}: {e.problem}", usage) from None
    if fmt.family == "float":
        raise GraphoptError(f"quantize={quantize!r} is a float format, not a quantization",
                            f"load the model in {fmt.display} (model.to(dtype)) and pass "
                            "quantize='none'")
    ok, why = runnable(fmt, target)
    if not ok:
        alts = [k for k in _SUGGEST if k in FORMATS and runnable(FORMATS[k], target)[0]]
        raise GraphoptError(
            f"quantize={quantize!r}: {why}",
            "pass " + ", ".join(f"quantize={k!r}" for k in alts)
            + f"{' or ' if alts else ''}quantize='auto' (the plan's choice per GEMM) on "
            f"{target.name}, or plan a target that runs {fmt.display}")
    return fmt.key


def _low_format(name: Any) -> QuantFormat | None:
    """The format a precision decision names, when it is a quantization (not a float)."""
    try:
        fmt = get_format(str(name))
    except GraphoptError:
        return None
    return None if fmt.family == "float" else fmt


def weight_formats(plan: Plan, quantize: str = "none") -> WeightFormats:
    """The format each weight GEMM of ``plan`` is costed at under ``quantize`` (case 5)."""
    q = quantize_key(quantize, plan.target)
    gemms = [n for n in plan.nodes if is_weight_gemm(n)]
    applied: dict[str, str] = {}
    kept: dict[str, str] = {}
    if q == "auto":
        for n in gemms:
            d = n.decisions.get("precision")
            fmt = _low_format(d.detail.format) if d is not None else None
            if fmt is not None:
                applied[n.name] = fmt.key
            else:
                kept[n.name] = d.reason if d is not None else "no precision decision"
    elif q != "none":
        kept = sensitive_gemms(plan)
        applied = {n.name: q for n in gemms if n.name not in kept}
    counts = Counter(applied.get(n.name) or weight_tensors(n.inputs)[0].dtype or "fp32"
                     for n in gemms)  # the float dtypes are named as their formats
    logger.debug("%s on %s: weight GEMMs %s", q, plan.target.name, dict(counts))
    return WeightFormats(q, MappingProxyType(applied), MappingProxyType(kept),
                         MappingProxyType(dict(counts)))


def cost_dtype(fmt: QuantFormat, carrier: str) -> str:
    """The dtype a GEMM at ``fmt`` computes in: the format's own (W8A8, W4A4), else the one
    its weight-only kernel runs (``FORMAT_DTYPE``: tinygemm's INT4 in bf16), else the carrier."""
    return FORMAT_DTYPE.get(fmt.key, carrier)


def format_cost(a: NodeAnalysis, weights: list[TensorInfo], fmt: QuantFormat, carrier: str,
                target: HardwareProfile) -> NodeCost:
    """Case 5: the node's roofline with its ``weights`` at ``fmt``'s bits per weight and its
    activations at the carrier, or at the float dtype a weight-only kernel converts them to."""
    w_bits = DTYPE_BITS.get(weights[0].dtype or "fp32", 32) if weights else 16
    dtype = cost_dtype(fmt, carrier)
    act = dtype if fmt.weight_only and dtype.startswith(("fp", "bf")) else carrier
    return cost_at_format(a, target, sum(t.nbytes for t in weights), w_bits,
                          bits_per_weight=fmt.bits_per_weight, act_bits=DTYPE_BITS.get(act, 16),
                          dtype=dtype)


def format_note(formats: Mapping[str, WeightFormats], own: str, carrier: str) -> str:
    """How the section's weight GEMMs are costed (case 5), for its notes; ``formats``: by
    phase, in the section's order."""
    d = formats["decode"]
    if d.quantize == "none":
        return f"costed at the weights' dtype ({own})"
    how = ("the format each GEMM's precision decision picked" if d.quantize == "auto"
           else get_format(d.quantize).display)
    counts = "; ".join(f"{p}: " + ", ".join(f"{k} x{v}" for k, v in sorted(
        f.counts.items())) for p, f in formats.items())
    kept = next(iter(d.kept.items()), None)
    said = f"; {len(d.kept)} kept at {own} in decode (e.g. {kept[0]}: {kept[1]})" if kept else ""
    wo = sorted({k for f in formats.values() for k in f.applied.values()
                 if get_format(k).weight_only})
    computes = "".join(f"; {get_format(k).display} computes at "
                       f"{cost_dtype(get_format(k), carrier)}" for k in wo)
    return (f"weight GEMMs costed at {how} ({counts}){said}{computes}; the other nodes and the "
            f"KV cache stay {own}")
