"""A weight GEMM's low-precision format on a GPU, where it pays, and who runs it.

:mod:`graphopt.decisions.precision.gemm` decides each node's carrier (case 1) and the GEMMs
that stay at it (case 2), then asks here for the other weight GEMMs on a GPU. The cases are
numbered there; this module handles case 3 and case 5 on a GPU:

7. Other weight GEMMs get the target's native low-precision format if it pays: FP8 on Ada /
   Hopper / Blackwell (preferred to INT8 at the same width: it keeps a per-value exponent, so it
   needs no outlier calibration), NVFP4 on Blackwell only where weights are at least half the
   node's traffic (``WEIGHT_HEAVY``), INT8 on GPUs with int8 tensor cores and no FP8 (Turing,
   Ampere). "Pays" = the roofline time at the low precision (weights at its bpw, activations
   at the carrier) is at least ``MIN_GAIN`` below the carrier's and the node is not
   launch-bound. ``MIN_GAIN`` = 10 %: about the uncertainty of the roofline's efficiency
   factors, below which a predicted gain does not justify the accuracy risk. Quantized GEMMs
   also need K and N aligned to 16 bytes of the low type (tensor-core operand alignment,
   ``roofline.tc_alignment``).
   Weight-only formats (torch's kernels; Linear nodes only) for memory-bound GEMMs whose
   weights are at least half the traffic (decode GEMVs and small-M GEMMs): 4-bit group-wise
   ("int4", tinygemm: bf16 activations, sm_80+, so GPUs with bf16) costed with weights at
   4 + 32 / group bpw (a bf16 scale and zero per group; group from
   ``quantization.torch_kernels.int4_group``, 128 where K allows) and activations and the matmul at
   the carrier (tinygemm dequantizes to bf16); chosen where it beats the fastest 8-bit option
   by ``MIN_GAIN``. On GPUs with no FP8 or INT8 tensor cores and no bf16 (Volta), 8-bit
   weight-only ("int8_weight_only") the same way, its matmul costed in fp32 on the CUDA cores
   (torch's CUDA kernel converts the activations and computes there).
   Order: the fastest 8-bit option, INT4 where it is ``MIN_GAIN`` faster than that, NVFP4
   where it is ``MIN_GAIN`` faster than the pick so far: a format graphopt's torch module
   applies is kept unless the plan-only NVFP4 is that much faster, and the reason says which.
9. ``runs_on`` on a GPU: a ``Linear`` at FP8, INT8, INT4 or 8-bit weight-only is "torch" with
   the ``kernel`` key (``quantization.torch_kernels.torch_kernel_for``; INT4 also its ``group``):
   graphopt's torch module applies it with torch's own ops (``graphopt::fp8_linear`` over
   ``torch._scaled_mm`` etc., ``quantization.torch_kernels.KERNEL_OPS``), after
   ``quantization.torch_kernels.kernel_refuses`` (device "cuda", activations at the carrier) took
   the node. A format that kernel refuses is not planned for the node at all: the node takes the
   next option that pays, or keeps the carrier, and the reason says what the kernel refuses.
   The plan then says what the torch artifact carries. Marking it "onnx" instead would promise
   a speed neither artifact has on a GPU: the ONNX backend emits such a node as QDQ only with
   calibration data, and only an engine that fuses QDQ into low-bit GEMMs (TensorRT) runs
   that at the low precision. NVFP4, and low-bit formats on GPU GEMMs other than ``Linear``
   (MatMul, Gemm, conv), are "plan-only" (torch has no NVFP4 kernel; graphopt's torch kernels
   replace nn.Linear only), and the reason says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphopt.analysis.record import NodeAnalysis
from graphopt.cost.roofline import alignment_efficiency, tc_alignment
from graphopt.decisions.precision.cost import cost_at_format
from graphopt.decisions.quant_formats import (
    FORMATS,
    QuantFormat,
    get_format,
    int4_bits_per_weight,
)
from graphopt.decisions.quantization.torch_kernels import (
    INT4_GROUPS,
    KERNEL_OPS,
    int4_group,
    kernel_refuses,
    torch_kernel_for,
)
from graphopt.hardware.profile import HardwareProfile
from graphopt.ir.decision_details import RunsOn

__all__ = ["MIN_GAIN", "WEIGHT_HEAVY", "GpuChoice", "GpuNode", "gpu_format"]

MIN_GAIN = 0.10  # case 3
WEIGHT_HEAVY = 0.5  # case 3: NVFP4 and weight-only formats only where weights are >= half
_PEAK_DTYPE = {"fp4": "fp4", "fp8": "fp8_e4m3", "int8": "int8"}


@dataclass(frozen=True, slots=True)
class GpuNode:
    """What case 3 reads of a weight GEMM: its analysis, op, and traced weight and activation
    widths."""

    a: NodeAnalysis
    op_type: str | None
    w_bytes: int
    w_bits: float
    act_bits: float

    @property
    def weight_heavy(self) -> bool:
        """Weights are at least ``WEIGHT_HEAVY`` of the node's traffic, counted in elements."""
        w = self.w_bytes / self.w_bits
        return w >= WEIGHT_HEAVY * (w + max(0, self.a.bytes_total - self.w_bytes)
                                    / self.act_bits)


@dataclass(frozen=True, slots=True)
class GpuChoice:
    """Cases 3 and 5's answer for one weight GEMM: its format (the carrier where none pays),
    why, who runs it, and for a chosen low format the carrier it beat, by how much, and the
    torch kernel and group that run it (None: left out of the decision)."""

    format: str
    reason: str
    runs_on: RunsOn = RunsOn.TORCH
    baseline: str | None = None
    speedup: float | None = None
    kernel: str | None = None
    group: int | None = None


@dataclass(frozen=True, slots=True)
class _Option:
    """A low-precision format that pays on a node (case 3), and who runs it (case 5)."""

    fmt: QuantFormat
    display: str
    t: float
    gain: float
    kernel: str | None  # the torch kernel key, None: plan-only
    group: int | None = None
    how: str = ""  # how its cost was taken, for the reason


def _low_formats(target: HardwareProfile) -> tuple[list[QuantFormat], str]:
    """A GPU's native low-precision formats to try, best first, and why others are out
    (case 3)."""
    out = []
    if target.has("fp4"):
        out.append(FORMATS["nvfp4"])
    if target.has("fp8"):
        return [*out, FORMATS["fp8_e4m3"]], ""
    if target.has("int8_tensor") and "int8" in target.peak_flops:
        return [FORMATS["int8"]], (f"no FP8 tensor cores on {target.generation} (FP8 needs cc "
                                   "8.9+); INT8 tensor cores instead")
    return [], f"no FP8 or INT8 tensor cores on {target.generation}"


def _weight_only_formats(target: HardwareProfile) -> list[QuantFormat]:
    """Case 3's weight-only candidates on a GPU: INT4 where tinygemm runs (bf16, sm_80+); 8-bit
    weight-only where no 8-bit tensor-core format and no bf16 exist (Volta and older)."""
    if target.has("bf16"):
        return [FORMATS["int4"]]
    if not target.has("fp8") and not target.has("int8_tensor"):
        return [FORMATS["int8_weight_only"]]
    return []


def gpu_format(g: GpuNode, target: HardwareProfile, model: QuantFormat,
               carrier: tuple[str, str, float, str]) -> GpuChoice:
    """Cases 3 and 5 on a GPU: the best low format that pays against the carrier ``(format,
    why, seconds, bottleneck)``, torch's where torch runs it."""
    fmt, why, t_hi, bound = carrier
    lows, why_not = _low_formats(target)
    linear = g.op_type == "Linear"
    wo = _weight_only_formats(target) if linear else []
    lows = [f for f in lows if f.bits_per_weight < model.bits_per_weight]
    wo = [f for f in wo if f.bits_per_weight < model.bits_per_weight]
    if not lows and not wo:
        return GpuChoice(fmt, f"stays {fmt} ({why}): "
                         f"{why_not or 'the model is already at or below 8 bits'}")
    if bound == "latency":
        return GpuChoice(fmt, f"stays {fmt}: small GEMM, launch-bound at "
                         f"{t_hi * 1e6:.2f} us; a lower precision cannot speed it up")
    notes: list[str] = []
    options: dict[str, _Option] = {}
    for f in [*lows, *wo]:
        o = _option(f, g, target, fmt, t_hi, bound, notes)
        if o is None:
            continue
        if linear:
            o = _torch_legal(o, g.a, fmt, notes)
        if o is not None:
            options[f.key] = o
    if not options:
        return GpuChoice(fmt, f"stays {fmt}: " + "; ".join(
            [*notes, why_not] if why_not else notes))
    o = _pick(options, linear, notes)
    return _chosen(o, g, fmt, t_hi, notes, why_not)


def _option(f: QuantFormat, g: GpuNode, target: HardwareProfile, carrier: str, t_hi: float,
            bound: str, notes: list[str]) -> _Option | None:
    """Case 3: ``f``'s roofline time on the node if it pays against the carrier, else None
    (and why, in ``notes``)."""
    a = g.a
    c_bits = get_format(carrier).bits_per_weight
    if f.weight_only:  # torch's weight-only kernels: weights at their bpw, matmul at the carrier
        if bound != "memory" or not g.weight_heavy:
            notes.append(f"{f.display} saves weight bytes only: not for a "
                         f"{'compute-bound' if bound != 'memory' else 'activation-heavy'} GEMM")
            return None
        group = None
        if f.key == "int4":
            group = int4_group(a.dims.get("K", 0))
            if group is None:
                notes.append(f"INT4: K={a.dims.get('K')} splits into no group of "
                             f"{', '.join(map(str, INT4_GROUPS))}")
                return None
            bpw, dtype, act = int4_bits_per_weight(group), carrier, c_bits
            how = f"weights at {bpw:g} bits, activations and the matmul at {carrier} (tinygemm)"
        else:  # the CUDA kernel converts the activations and computes in fp32 (CUDA cores)
            bpw, dtype, act = f.bits_per_weight, "fp32", 32
            how = "weights at 8 bits, activations and the matmul in fp32 on the CUDA cores"
        display = f.display.replace("g128", f"g{group}") if group else f.display
    else:
        peak = f.peak or "fp32"
        if alignment_efficiency(a, peak, target) != 1.0:
            notes.append(f"{f.display} needs K and N multiples of {tc_alignment(peak)}")
            return None
        if f.key == "nvfp4" and not g.weight_heavy:
            notes.append("NVFP4 only where weights dominate the traffic; here activations do")
            return None
        bpw, dtype, act, group = f.bits_per_weight, _PEAK_DTYPE[peak], c_bits, None
        display, how = f.display, ""
    t_lo = cost_at_format(a, target, g.w_bytes, g.w_bits, bits_per_weight=bpw, act_bits=act,
                          dtype=dtype).est_time_s
    gain = 1 - t_lo / t_hi
    if gain < MIN_GAIN:
        notes.append(f"{display} {_short(gain, carrier)}")
        return None
    return _Option(f, display, t_lo, gain, torch_kernel_for(f.key), group, how)


def _torch_legal(o: _Option, a: NodeAnalysis, carrier: str, notes: list[str]
                 ) -> _Option | None:
    """Case 5 legality on a Linear: ``o`` if torch's kernel takes the node on CUDA (and on the
    CPU, where the artifact is checked), else None and why; a plan-only format passes."""
    if o.kernel is None:
        return o
    why = kernel_refuses(o.kernel, a.dims.get("K", 0), a.dims.get("N", 0), carrier, o.group,
                         device="cuda")
    if why is None:
        return o
    notes.append(f"{o.display}: torch's kernel refuses the node ({why})")
    return None


def _faster(gain: float) -> str:
    """A gain in words: "8% faster", or "3% slower" for a negative one."""
    return f"{gain:.0%} faster" if gain >= 0 else f"{-gain:.0%} slower"


def _short(gain: float, other: str) -> str:
    """A gain below ``MIN_GAIN`` over ``other`` in words."""
    return (f"would beat {other} by only {gain:.0%} (< {MIN_GAIN:.0%})" if gain >= 0
            else f"would be {-gain:.0%} slower than {other}")


def _pick(options: dict[str, _Option], linear: bool, notes: list[str]) -> _Option:
    """Case 3's order: the fastest 8-bit option; INT4 where it beats that by ``MIN_GAIN``;
    NVFP4 (plan-only) where it beats the pick so far by ``MIN_GAIN`` (a format graphopt's
    torch module applies is kept unless a plan-only one is that much faster)."""
    eight = [o for k, o in options.items() if k not in ("int4", "nvfp4")]
    best = min(eight, key=lambda o: o.t) if eight else None
    for key in ("int4", "nvfp4"):
        o = options.get(key)
        if o is None:
            continue
        if best is None:
            best = o
            continue
        gain = 1 - o.t / best.t
        torch_run = linear and best.kernel is not None and o.kernel is None
        if gain >= MIN_GAIN:
            notes.append(f"{o.display} (plan-only) is {_faster(gain)} than {best.display}, "
                         f"which graphopt's torch module runs (>= {MIN_GAIN:.0%})" if torch_run
                         else f"{o.display} is {_faster(gain)} than {best.display}")
            best = o
            continue
        notes.append(f"{best.display} runs in graphopt's torch module and {o.display} "
                     f"(plan-only) {_short(gain, 'it')}" if torch_run else
                     f"{o.display} {_short(gain, best.display)}")
    assert best is not None  # options is not empty
    return best


def _chosen(o: _Option, g: GpuNode, carrier: str, t_hi: float, notes: list[str],
            why_not: str) -> GpuChoice:
    """The choice of option ``o`` with its reason: format, times, gain, notes, who runs it
    (case 5)."""
    if o.kernel is not None and g.op_type == "Linear":
        runs_on = RunsOn.TORCH
        where = f"applied by graphopt's torch module ({KERNEL_OPS[o.kernel]})"
    elif o.kernel is not None:
        runs_on = RunsOn.PLAN_ONLY
        where = (f"plan-only: graphopt's torch kernels replace nn.Linear only, not "
                 f"{g.op_type or 'this node'}; deploy with TensorRT(-LLM), vLLM or Transformer "
                 "Engine")
    else:
        runs_on = RunsOn.PLAN_ONLY
        where = (f"plan-only: torch has no {o.fmt.display} kernel; deploy with TensorRT(-LLM), "
                 "vLLM or Transformer Engine")
    extra = "".join(f"; {n}" for n in [o.how, *notes, why_not] if n)
    return GpuChoice(o.fmt.key, f"{o.display}: roofline {t_hi * 1e6:.2f} -> "
                     f"{o.t * 1e6:.2f} us ({o.gain:.0%} faster than {carrier}){extra}; {where}",
                     runs_on, carrier, round(t_hi / o.t, 3),
                     o.kernel if runs_on is RunsOn.TORCH else None,
                     o.group if runs_on is RunsOn.TORCH else None)
