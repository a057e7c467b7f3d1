"""Each node's precision on a target: its baseline format, or a low-bit one where it pays.

The model-level weight format (cases 1-4) is :mod:`graphopt.decisions.quantization`; this module
continues its numbering.

5. Baseline ("carrier") precision: the model's own 16-bit format, else bf16 where the target has
   bf16 matrix units, fp16 on older GPUs, fp32 on CPUs without bf16. An ONNX model on a CPU
   runs in ONNX Runtime's CPU EP, which has no bf16 kernels (``precision_format.onnx_precision``
   keeps the ONNX artifact fp32): its carrier is fp32, so INT8 competes with what ORT runs.
   fp32 islands (norms, softmax, exp/log/pow, sums, squares ``x*x``) run in fp32 by
   ``precision_plan.node_island``, the rule both backends apply, so the plan says what they do.
6. Sensitive GEMMs stay at the carrier: on GPUs the first and last weight GEMMs (their
   quantization error is not averaged out by later layers; llama.cpp's K-quant mixes keep
   ``output.weight`` at Q6_K), GEMMs without a weight (attention logits QK^T and PV), fused
   attention, small GEMMs. On CPUs, where graphopt applies INT8 and can check it, the first
   and last are INT8 by cost too and marked ``edge``: the checks measure them (the torch
   backend retries without them when the whole set leaves tolerance; the ONNX guard keeps
   the most sensitive nodes, by measurement). Measured: ORT's ``quantize_dynamic`` of every
   GEMM stays within the int8 budget on BERT-base and GPT-2, 4 layers each
   (``benchmarks/bench_host_peers.py``).
   First and last are counted among the GEMMs a graph output depends on: a traced model keeps
   work no output reads (BERT's pooler under ``last_hidden_state``), its ONNX export drops it,
   and both must quantize the same nodes. Such dead GEMMs stay at the carrier too.
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
   ``torch_quant_kernels.int4_group``, 128 where K allows) and activations and the matmul at
   the carrier (tinygemm dequantizes to bf16); chosen where it beats the fastest 8-bit option
   by ``MIN_GAIN``. On GPUs with no FP8 or INT8 tensor cores and no bf16 (Volta), 8-bit
   weight-only ("int8_weight_only") the same way, its matmul costed in fp32 on the CUDA cores
   (torch's CUDA kernel converts the activations and computes there).
   Order: the fastest 8-bit option, INT4 where it is ``MIN_GAIN`` faster than that, NVFP4
   where it is ``MIN_GAIN`` faster than the pick so far: a format graphopt's torch module
   applies is kept unless the plan-only NVFP4 is that much faster, and the reason says which.
8. CPUs: INT8 for GEMM, GEMV and conv nodes where it pays by cost against the carrier
   (:mod:`graphopt.decisions.cpu_int8`: the int8 GEMM at the CPU's int8-path rate, plus
   quantizing the activations per call, plus the casts a bf16 carrier needs), whatever the ISA
   path; the reason gives both times.
9. ``runs_on``: "torch" for fp32/bf16/fp16 and for CPU INT8 on ``Linear`` nodes (torch's
   dynamic INT8 pass, ``backends/torch/quantize.py``, and ONNX's); "onnx" for CPU INT8 on
   other GEMMs and convs (ONNX Runtime's quantizers run them, torch's pass covers nn.Linear
   only). On GPUs, a ``Linear`` at FP8, INT8, INT4 or 8-bit weight-only is "torch" with the
   ``kernel`` key (``torch_quant_kernels.torch_kernel_for``; INT4 also its ``group``): graphopt's
   torch module applies it with torch's own ops (``graphopt::fp8_linear`` over
   ``torch._scaled_mm`` etc., ``torch_quant_kernels.KERNEL_OPS``), after
   ``torch_quant_kernels.kernel_refuses`` (device "cuda", activations at the carrier) took the
   node. A format that kernel refuses is not planned for the node at all: the node takes the
   next option that pays, or keeps the carrier, and the reason says what the kernel refuses.
   The plan then says what the torch artifact carries. Marking it "onnx" instead would promise
   a speed neither artifact has on a GPU: the ONNX backend emits such a node as QDQ only with
   calibration data, and only an engine that fuses QDQ into low-bit GEMMs (TensorRT) runs
   that at the low precision. NVFP4, and low-bit formats on GPU GEMMs other than ``Linear``
   (MatMul, Gemm, conv), are "plan-only" (torch has no NVFP4 kernel; graphopt's torch kernels
   replace nn.Linear only), and the reason says so.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from graphopt.analysis.kernel_class import GEMM_LIKE, KernelClass
from graphopt.analysis.record import NodeAnalysis
from graphopt.cost.roofline import alignment_efficiency, estimate, tc_alignment
from graphopt.decisions.cpu_int8 import (
    CONV_INT8_MEASURED,
    can_int8_on_cpu,
    should_int8_on_cpu,
)
from graphopt.decisions.precision_format import native_format
from graphopt.decisions.precision_plan import island_reason, node_island
from graphopt.decisions.quant_formats import (
    FORMATS,
    QuantFormat,
    get_format,
    int4_bits_per_weight,
)
from graphopt.decisions.quantization import runnable
from graphopt.decisions.torch_quant_kernels import (
    INT4_GROUPS,
    KERNEL_OPS,
    int4_group,
    kernel_refuses,
    torch_kernel_for,
)
from graphopt.hardware.profile import HardwareProfile
from graphopt.ir.graph import DTYPE_BITS
from graphopt.ir.plan import Decision, NodePlan, Plan

__all__ = ["MIN_GAIN", "carrier_format", "node_precision", "plan_precisions"]

logger = logging.getLogger(__name__)

MIN_GAIN = 0.10  # case 7
WEIGHT_HEAVY = 0.5  # case 7: NVFP4 and weight-only formats only where weights are >= half
_TORCH_FORMATS = frozenset({"fp32", "bf16", "fp16"})
_PEAK_DTYPE = {"fp4": "fp4", "fp8": "fp8_e4m3", "int8": "int8"}
_DTYPE_FORMAT = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16", "fp8_e4m3": "fp8_e4m3",
                 "int8": "int8", "fp4": "nvfp4"}


def carrier_format(target: HardwareProfile, model_format: str, source: str = "torch"
                   ) -> tuple[str, str]:
    """The format a node runs at when it is not quantized (case 5), and why: the model's own
    16-bit format where native, else the target's (``precision_format.native_format``);
    ``source``: the graph's frontend ("onnx": it runs in ONNX Runtime)."""
    m = get_format(model_format)
    if m.family == "float" and m.bits_per_weight == 16:
        if runnable(m, target)[0]:
            return m.key, f"the model's own {m.display}"
        return "fp16", f"{m.display} is not native on {target.display_name}; fp16 tensor cores"
    fmt = native_format(target)
    if target.is_gpu:
        return fmt, {"bf16": "bf16 tensor cores, fp32's exponent range",
                     "fp16": f"no bf16 on {target.generation}; fp16 tensor cores",
                     "fp32": "no tensor cores"}[fmt]
    if fmt == "bf16" and source == "onnx":
        return "fp32", ("ONNX Runtime's CPU EP has no bf16 kernels: the ONNX model runs fp32 "
                        f"on {target.display_name}")
    if fmt == "bf16":
        return "bf16", f"{target.display_name} computes bf16 natively"
    return "fp32", f"{target.display_name} has no native bf16 arithmetic"


def _weights(node: NodePlan | NodeAnalysis) -> tuple[NodeAnalysis, int, str | None, str | None]:
    """(analysis, weight bytes as traced, weight dtype, op_type); no weight -> 0 bytes."""
    if isinstance(node, NodePlan):
        ws = [t for t in node.inputs
              if t is not None and t.kind in ("param", "constant") and len(t.shape or ()) >= 2]
        dtype = ws[0].dtype if ws else None
        return node.analysis, sum(t.nbytes for t in ws), dtype, node.op_type
    a = node
    return a, math.ceil(a.param_count * DTYPE_BITS.get(a.dtype or "fp32", 32) / 8), a.dtype, None


def _cost_at(a: NodeAnalysis, target: HardwareProfile, w_bytes: int, w_scale: float,
             act_scale: float, dtype: str) -> tuple[float, str]:
    """(roofline time, bottleneck) with weights and activations re-sized (case 7)."""
    act_read = max(0, a.bytes_read - w_bytes)
    scaled = replace(a, bytes_read=math.ceil(act_read * act_scale + w_bytes * w_scale),
                     bytes_written=math.ceil(a.bytes_written * act_scale), dtype=dtype)
    cost = estimate(scaled, target, dtype)
    return cost.est_time_s, cost.bottleneck


def _low_formats(target: HardwareProfile) -> tuple[list[QuantFormat], str]:
    """A GPU's native low-precision formats to try, best first, and why others are out
    (case 7)."""
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
    """Case 7's weight-only candidates on a GPU: INT4 where tinygemm runs (bf16, sm_80+); 8-bit
    weight-only where no 8-bit tensor-core format and no bf16 exist (Volta and older)."""
    if target.has("bf16"):
        return [FORMATS["int4"]]
    if not target.has("fp8") and not target.has("int8_tensor"):
        return [FORMATS["int8_weight_only"]]
    return []


def _decide(fmt: str, model: QuantFormat, reason: str, runs_on: str = "torch",
            **extra: Any) -> Decision:
    fields = {"format": fmt, "runs_on": runs_on, **extra}
    return Decision(reason, MappingProxyType({k: v for k, v in fields.items() if v is not None}),
                    applied=fmt != model.key)


def _sensitive(kc: KernelClass, w_bytes: int, live: bool, edge: str | None,
               target: HardwareProfile) -> str | None:
    """Case 6: why a GEMM stays at the carrier, else None."""
    if kc is KernelClass.ATTENTION or w_bytes == 0:
        return ("attention logits / a GEMM of two activations: no weight to quantize, and "
                "quantizing QK^T or PV hurts accuracy")
    if not live:
        return "no graph output depends on it (an ONNX export drops it)"
    if edge is not None and target.is_gpu:
        return (f"{edge} weight GEMM of the model: its quantization error is not averaged out "
                "by other layers")
    return None


@dataclass(frozen=True, slots=True)
class _GpuNode:
    """What case 7 reads of a weight GEMM: its analysis, op, and traced weight and activation
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
class _Option:
    """A low-precision format that pays on a node (case 7), and who runs it (case 9)."""

    fmt: QuantFormat
    display: str
    t: float
    gain: float
    kernel: str | None  # the torch kernel key, None: plan-only
    group: int | None = None
    how: str = ""  # how its cost was taken, for the reason


def node_precision(node: NodePlan | NodeAnalysis, target: HardwareProfile,
                   model_format: str | None = None, *, is_first: bool = False,
                   is_last: bool = False, live: bool = True, source: str = "torch"
                   ) -> Decision:
    """The precision ``node`` should run at on ``target`` (cases 5-9); ``live``: a graph
    output depends on it (case 6); ``source``: the graph's frontend (case 5)."""
    a, w_bytes, w_dtype, op_type = _weights(node)
    model = get_format(model_format or _DTYPE_FORMAT.get(w_dtype or a.dtype or "", "fp32"))
    carrier, carrier_why = carrier_format(target, model.key, source)
    kc = a.kernel_class
    if kc in (KernelClass.QUANT_GEMM, KernelClass.QUANT_DOT):
        return Decision("already quantized in the model: kept",
                        MappingProxyType({"format": a.dtype or "int8", "runs_on": "torch"}),
                        applied=False)
    island = node_island(node) if isinstance(node, NodePlan) else island_reason("", a)
    if island is not None:  # case 5: the backends' rule, so plan and backends agree
        return _decide("fp32", model, f"fp32 island: {island}")
    if kc not in GEMM_LIKE:
        return _decide(carrier, model, f"{kc.value}: follows the baseline {carrier} "
                       f"({carrier_why}); nothing to quantize")
    edge = "first" if is_first else "last" if is_last else None
    keep = _sensitive(kc, w_bytes, live, edge, target)
    if keep:
        return _decide(carrier, model, f"stays {carrier} ({carrier_why}): {keep}")
    w_bits = DTYPE_BITS.get(w_dtype or model.key, int(model.bits_per_weight))
    act_bits = DTYPE_BITS.get(a.dtype or "fp32", 32)
    c_bits = get_format(carrier).bits_per_weight
    t_hi, bound = _cost_at(a, target, w_bytes, c_bits / w_bits, c_bits / act_bits, carrier)
    if not target.is_gpu:
        return _cpu_int8(a, target, model, (carrier, carrier_why, c_bits, t_hi),
                         w_bytes, w_bits, act_bits, op_type, edge)
    return _gpu_low(_GpuNode(a, op_type, w_bytes, w_bits, act_bits), target, model,
                    (carrier, carrier_why, t_hi, bound))


def _gpu_low(g: _GpuNode, target: HardwareProfile, model: QuantFormat,
             carrier: tuple[str, str, float, str]) -> Decision:
    """Cases 7 and 9 on a GPU: the best low format that pays against the carrier ``(format,
    why, seconds, bottleneck)``, torch's where torch runs it."""
    fmt, why, t_hi, bound = carrier
    lows, why_not = _low_formats(target)
    linear = g.op_type == "Linear"
    wo = _weight_only_formats(target) if linear else []
    lows = [f for f in lows if f.bits_per_weight < model.bits_per_weight]
    wo = [f for f in wo if f.bits_per_weight < model.bits_per_weight]
    if not lows and not wo:
        return _decide(fmt, model, f"stays {fmt} ({why}): "
                       f"{why_not or 'the model is already at or below 8 bits'}")
    if bound == "latency":
        return _decide(fmt, model, f"stays {fmt}: small GEMM, launch-bound at "
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
        return _decide(fmt, model, f"stays {fmt}: " + "; ".join(
            [*notes, why_not] if why_not else notes))
    o = _pick(options, linear, notes)
    return _chosen(o, g, model, fmt, t_hi, notes, why_not)


def _option(f: QuantFormat, g: _GpuNode, target: HardwareProfile, carrier: str, t_hi: float,
            bound: str, notes: list[str]) -> _Option | None:
    """Case 7: ``f``'s roofline time on the node if it pays against the carrier, else None
    (and why, in ``notes``)."""
    a = g.a
    c_act = get_format(carrier).bits_per_weight / g.act_bits
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
            bpw, dtype, act = int4_bits_per_weight(group), carrier, c_act
            how = f"weights at {bpw:g} bits, activations and the matmul at {carrier} (tinygemm)"
        else:  # the CUDA kernel converts the activations and computes in fp32 (CUDA cores)
            bpw, dtype, act = f.bits_per_weight, "fp32", 32 / g.act_bits
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
        bpw, dtype, act, group = f.bits_per_weight, _PEAK_DTYPE[peak], c_act, None
        display, how = f.display, ""
    t_lo, _ = _cost_at(a, target, g.w_bytes, bpw / g.w_bits, act, dtype)
    gain = 1 - t_lo / t_hi
    if gain < MIN_GAIN:
        notes.append(f"{display} {_short(gain, carrier)}")
        return None
    return _Option(f, display, t_lo, gain, torch_kernel_for(f.key), group, how)


def _torch_legal(o: _Option, a: NodeAnalysis, carrier: str, notes: list[str]
                 ) -> _Option | None:
    """Case 9 legality on a Linear: ``o`` if torch's kernel takes the node on CUDA (and on the
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
    """Case 7's order: the fastest 8-bit option; INT4 where it beats that by ``MIN_GAIN``;
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


def _chosen(o: _Option, g: _GpuNode, model: QuantFormat, carrier: str, t_hi: float,
            notes: list[str], why_not: str) -> Decision:
    """The decision for option ``o`` with its reason: format, times, gain, notes, who runs it
    (case 9)."""
    if o.kernel is not None and g.op_type == "Linear":
        runs_on = "torch"
        where = f"applied by graphopt's torch module ({KERNEL_OPS[o.kernel]})"
    elif o.kernel is not None:
        runs_on = "plan-only"
        where = (f"plan-only: graphopt's torch kernels replace nn.Linear only, not "
                 f"{g.op_type or 'this node'}; deploy with TensorRT(-LLM), vLLM or Transformer "
                 "Engine")
    else:
        runs_on = "plan-only"
        where = (f"plan-only: torch has no {o.fmt.display} kernel; deploy with TensorRT(-LLM), "
                 "vLLM or Transformer Engine")
    extra = "".join(f"; {n}" for n in [o.how, *notes, why_not] if n)
    return _decide(o.fmt.key, model, f"{o.display}: roofline {t_hi * 1e6:.2f} -> "
                   f"{o.t * 1e6:.2f} us ({o.gain:.0%} faster than {carrier}){extra}; {where}",
                   runs_on, baseline=carrier, speedup=round(t_hi / o.t, 3),
                   kernel=o.kernel if runs_on == "torch" else None,
                   group=o.group if runs_on == "torch" else None)


def _cpu_where(a: NodeAnalysis, op_type: str | None) -> tuple[str, str]:
    """Case 9 on a CPU: (runs_on, which backend applies an INT8 node and how)."""
    if a.kernel_class is KernelClass.CONV:
        return "onnx", ("applied on ONNX as static QDQ (QLinearConv) when calibration data is "
                        "given; torch has no INT8 conv pass; never dynamic: "
                        f"{CONV_INT8_MEASURED}")
    if op_type == "Linear":
        return "torch", ("applied by torch's dynamic INT8 pass (quantized::linear_dynamic) and "
                         "on ONNX (dynamic INT8, static QDQ with calibration data)")
    return "onnx", ("applied on ONNX (dynamic INT8, static QDQ with calibration data); torch's "
                    "INT8 pass covers nn.Linear only")


def _cpu_int8(a: NodeAnalysis, target: HardwareProfile, model: QuantFormat,
              carrier: tuple[str, str, float, float], w_bytes: int, w_bits: float,
              act_bits: float, op_type: str | None, edge: str | None) -> Decision:
    """Case 8: INT8 where it pays by cost against the carrier ``(format, why, activation bits,
    seconds)``, else the carrier, with both times in the reason; ``edge``: "first"/"last"
    weight GEMM (case 6's prior, recorded for the checks that measure it)."""
    fmt, why, c_bits, t_base = carrier
    illegal = "the model is already at or below 8 bits" if model.bits_per_weight <= 8 \
        else can_int8_on_cpu(a, target)
    if illegal is not None:
        return _decide(fmt, model, f"stays {fmt} ({why}): {illegal}")
    v = should_int8_on_cpu(a, target, base=fmt, base_s=t_base, weight_bytes=w_bytes,
                           weight_bits=w_bits, act_bits=act_bits, base_bits=c_bits)
    if not v.pays:
        return _decide(fmt, model, f"stays {fmt} ({why}): {v.reason}")
    runs_on, where = _cpu_where(a, op_type)
    extra = {} if edge is None else {"edge": edge}
    said = "" if edge is None else (
        f"; the {edge} weight GEMM: its error is not averaged out by other layers, so the "
        "accuracy checks measure it (torch retries without the first and last GEMMs, the "
        "ONNX guard keeps the most sensitive nodes)")
    return _decide("int8", model, f"{v.reason}; {where}{said}", runs_on, baseline=fmt,
                   speedup=round(t_base / v.cost.total_s, 3), method=v.cost.method, **extra)


def _live(plan: Plan) -> set[str] | None:
    """The nodes a graph output depends on (case 6); None when the plan names no outputs."""
    outs = [o.get("name") for o in plan.model.get("outputs", ()) if isinstance(o, Mapping)]
    producer = {t.name: n for n in plan.nodes for t in n.outputs if t is not None}
    stack = [producer[o] for o in outs if o in producer]
    if not stack:
        return None
    live: set[str] = set()
    while stack:
        n = stack.pop()
        if n.name not in live:
            live.add(n.name)
            stack += [producer[t.name] for t in n.inputs
                      if t is not None and t.name in producer]
    return live


def plan_precisions(plan: Plan, model_format: str | None = None) -> dict[str, Decision]:
    """:func:`node_precision` for every node, knowing which weight GEMMs come first and last
    among those a graph output depends on."""
    params: dict[str, tuple[str | None, int]] = {}
    gemms = []
    live = _live(plan)
    for n in plan.nodes:
        for t in n.inputs:
            if t is not None and t.kind == "param":
                params[t.name] = (t.dtype, t.nbytes)
        if n.analysis.kernel_class in GEMM_LIKE and _weights(n)[1] > 0 \
                and n.analysis.kernel_class is not KernelClass.ATTENTION \
                and (live is None or n.name in live):
            gemms.append(n.name)
    if model_format is None:
        by_dtype: dict[str, int] = {}
        for dtype, nbytes in params.values():
            by_dtype[dtype or "fp32"] = by_dtype.get(dtype or "fp32", 0) + nbytes
        dominant = max(by_dtype, key=lambda d: by_dtype[d]) if by_dtype else "fp32"
        model_format = _DTYPE_FORMAT.get(dominant, "fp32")
    first, last = (gemms[0], gemms[-1]) if gemms else (None, None)
    source = str(plan.model.get("source", "torch"))
    out = {n.name: node_precision(n, plan.target, model_format, is_first=n.name == first,
                                  is_last=n.name == last, live=live is None or n.name in live,
                                  source=source)
           for n in plan.nodes}
    low = sum(d.fields["format"] not in _TORCH_FORMATS for d in out.values())
    logger.info("precision on %s: %d of %d nodes at a low-precision format", plan.target.name,
                low, len(out))
    return out
