"""Each node's precision on a target: its baseline format, or a low-bit one where it pays.

The precision family's per-node cases are numbered here, once. This module handles cases 1, 2,
4 and 5 on a CPU and is the entry point of all of them (:func:`node_precision`,
:func:`plan_precisions`); cases 3 and 5 on a GPU are :mod:`.gpu_formats`, and the cost at a
format both use is :mod:`.cost`. The model-level weight format is the quantization family's
(:mod:`graphopt.decisions.quantization.recommend`, numbered on its own).

1. Baseline ("carrier") precision: the model's own 16-bit format, else bf16 where the target has
   bf16 matrix units, fp16 on older GPUs, fp32 on CPUs without bf16. An ONNX model on a CPU
   runs in ONNX Runtime's CPU EP, which has no bf16 kernels (``precision.format.onnx_precision``
   keeps the ONNX artifact fp32): its carrier is fp32, so INT8 competes with what ORT runs.
   fp32 islands (norms, softmax, exp/log/pow, sums, squares ``x*x``) run in fp32 by
   ``precision.by_op.node_island``, the rule both backends apply, so the plan says what they do.
2. Sensitive GEMMs stay at the carrier: on GPUs the first and last weight GEMMs (their
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
   :func:`sensitive_gemms` names a plan's sensitive weight GEMMs with the same code (the LLM
   plan keeps them at the weights' dtype when it costs a format).
3. Other weight GEMMs on a GPU get the target's native low-precision format if it pays against
   the carrier by ``MIN_GAIN`` (FP8, NVFP4 where weights are ``WEIGHT_HEAVY``, INT8, torch's
   weight-only INT4 and 8-bit): :mod:`graphopt.decisions.precision.gpu_formats`.
4. CPUs: INT8 for GEMM, GEMV and conv nodes where it pays by cost against the carrier
   (:mod:`graphopt.decisions.quantization.cpu_int8`: the int8 GEMM at the CPU's int8-path rate, plus
   quantizing the activations per call, plus the casts a bf16 carrier needs), whatever the ISA
   path; the reason gives both times.
5. ``runs_on``: "torch" for fp32/bf16/fp16 and for CPU INT8 on ``Linear`` nodes (torch's
   dynamic INT8 pass, ``backends/torch/quantize.py``, and ONNX's); "onnx" for CPU INT8 on
   other GEMMs and convs (ONNX Runtime's quantizers run them, torch's pass covers nn.Linear
   only). On GPUs, "torch" with a ``kernel`` key for a ``Linear`` that torch's kernels take,
   else "plan-only": :mod:`graphopt.decisions.precision.gpu_formats`.
"""

from __future__ import annotations

import logging
from typing import Any

from graphopt.analysis.kernel_class import GEMM_LIKE, KernelClass
from graphopt.analysis.record import NodeAnalysis
from graphopt.decisions.precision.by_op import island_reason, node_island
from graphopt.decisions.precision.cost import cost_at_format, is_weight_gemm, node_weights
from graphopt.decisions.precision.format import native_format
from graphopt.decisions.precision.gpu_formats import (
    MIN_GAIN,
    WEIGHT_HEAVY,
    GpuChoice,
    GpuNode,
    gpu_format,
)
from graphopt.decisions.quant_formats import QuantFormat, get_format
from graphopt.decisions.quantization.cpu_int8 import (
    CONV_INT8_MEASURED,
    can_int8_on_cpu,
    should_int8_on_cpu,
)
from graphopt.decisions.quantization.recommend import runnable
from graphopt.hardware.profile import HardwareProfile
from graphopt.ir.decision_details import GemmEdge, PrecisionDetail, RunsOn
from graphopt.ir.graph import DTYPE_BITS
from graphopt.ir.legality import Legality
from graphopt.ir.plan import Decision, NodePlan, Plan

__all__ = ["MIN_GAIN", "WEIGHT_HEAVY", "carrier_format", "node_precision", "plan_precisions",
           "sensitive_gemms"]

logger = logging.getLogger(__name__)

_TORCH_FORMATS = frozenset({"fp32", "bf16", "fp16"})
_DTYPE_FORMAT = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16", "fp8_e4m3": "fp8_e4m3",
                 "int8": "int8", "fp4": "nvfp4"}


def carrier_format(target: HardwareProfile, model_format: str, source: str = "torch"
                   ) -> tuple[str, str]:
    """The format a node runs at when it is not quantized (case 1), and why: the model's own
    16-bit format where native, else the target's (``precision.format.native_format``);
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


def _decide(fmt: str, model: QuantFormat, reason: str, runs_on: RunsOn = RunsOn.TORCH,
            **extra: Any) -> Decision:
    """The node's decision at ``fmt``; ``extra``: the other :class:`PrecisionDetail` fields."""
    return Decision(reason, PrecisionDetail(fmt, runs_on, **extra), applied=fmt != model.key)


def _edge(is_first: bool, is_last: bool) -> GemmEdge | None:
    """Case 2: "first" or "last" weight GEMM of the model, else None."""
    return GemmEdge.FIRST if is_first else GemmEdge.LAST if is_last else None


def _sensitive(kc: KernelClass, w_bytes: int, live: bool, edge: GemmEdge | None,
               target: HardwareProfile) -> str | None:
    """Case 2: why a GEMM stays at the carrier, else None."""
    if kc is KernelClass.ATTENTION or w_bytes == 0:
        return ("attention logits / a GEMM of two activations: no weight to quantize, and "
                "quantizing QK^T or PV hurts accuracy")
    if not live:
        return "no graph output depends on it (an ONNX export drops it)"
    if edge is not None and target.is_gpu:
        return (f"{edge} weight GEMM of the model: its quantization error is not averaged out "
                "by other layers")
    return None


def node_precision(node: NodePlan | NodeAnalysis, target: HardwareProfile,
                   model_format: str | None = None, *, is_first: bool = False,
                   is_last: bool = False, live: bool = True, source: str = "torch"
                   ) -> Decision:
    """The precision ``node`` should run at on ``target`` (cases 1-5); ``live``: a graph
    output depends on it (case 2); ``source``: the graph's frontend (case 1)."""
    a, w_bytes, w_dtype, op_type = node_weights(node)
    model = get_format(model_format or _DTYPE_FORMAT.get(w_dtype or a.dtype or "", "fp32"))
    carrier, carrier_why = carrier_format(target, model.key, source)
    kc = a.kernel_class
    if kc in (KernelClass.QUANT_GEMM, KernelClass.QUANT_DOT):
        return Decision("already quantized in the model: kept",
                        PrecisionDetail(a.dtype or "int8", RunsOn.TORCH), applied=False)
    island = node_island(node) if isinstance(node, NodePlan) else island_reason("", a)
    if island is not None:  # case 1: the backends' rule, so plan and backends agree
        return _decide("fp32", model, f"fp32 island: {island}")
    if kc not in GEMM_LIKE:
        return _decide(carrier, model, f"{kc.value}: follows the baseline {carrier} "
                       f"({carrier_why}); nothing to quantize")
    edge = _edge(is_first, is_last)
    keep = _sensitive(kc, w_bytes, live, edge, target)
    prior = keep is not None and edge is not None and target.is_gpu and live and w_bytes > 0 \
        and kc is not KernelClass.ATTENTION  # case 2's GPU prior: measured by torch's guard
    if keep and not prior:
        return _decide(carrier, model, f"stays {carrier} ({carrier_why}): {keep}")
    w_bits = DTYPE_BITS.get(w_dtype or model.key, int(model.bits_per_weight))
    act_bits = DTYPE_BITS.get(a.dtype or "fp32", 32)
    c_bits = get_format(carrier).bits_per_weight
    hi = cost_at_format(a, target, w_bytes, w_bits, bits_per_weight=c_bits, act_bits=c_bits,
                        dtype=carrier)
    if not target.is_gpu:
        return _cpu_int8(a, target, model, (carrier, carrier_why, c_bits, hi.est_time_s),
                         w_bytes, w_bits, act_bits, op_type, edge)
    c = gpu_format(GpuNode(a, op_type, w_bytes, w_bits, act_bits), target, model,
                   (carrier, carrier_why, hi.est_time_s, hi.bottleneck))
    if prior:
        return _edge_prior(carrier, carrier_why, keep or "", model, edge, c)
    return _decide(c.format, model, c.reason, c.runs_on, baseline=c.baseline,
                   speedup=c.speedup, kernel=c.kernel, group=c.group)


def _edge_prior(carrier: str, why: str, keep: str, model: QuantFormat, edge: GemmEdge | None,
                c: GpuChoice) -> Decision:
    """Case 2 on a GPU: the first or last weight GEMM stays at the carrier in the plan (its
    predictions assume the usual outcome), and the format it would get is recorded as a
    ``candidate`` that torch's guard measures (``backends/torch/quant_guard.py``), lowering
    it where the outputs stay within the budget: measured, not assumed."""
    if c.runs_on is not RunsOn.TORCH or not c.kernel:
        return _decide(carrier, model, f"stays {carrier} ({why}): {keep}", edge=edge)
    return _decide(carrier, model, f"stays {carrier} ({why}): {keep}; the plan counts it at "
                   f"{carrier}, and optimize's guard measures it at {c.format} and lowers it "
                   "if the outputs stay within the budget", edge=edge, candidate=c.format,
                   candidate_kernel=c.kernel, candidate_group=c.group)


def _cpu_where(a: NodeAnalysis, op_type: str | None) -> tuple[RunsOn, str]:
    """Case 5 on a CPU: (runs_on, which backend applies an INT8 node and how)."""
    if a.kernel_class is KernelClass.CONV:
        return RunsOn.ONNX, ("applied on ONNX as static QDQ (QLinearConv) when calibration data "
                             "is given; torch has no INT8 conv pass; never dynamic: "
                             f"{CONV_INT8_MEASURED}")
    if op_type == "Linear":
        return RunsOn.TORCH, ("applied by torch's dynamic INT8 pass (quantized::linear_dynamic) "
                              "and on ONNX (dynamic INT8, static QDQ with calibration data)")
    return RunsOn.ONNX, ("applied on ONNX (dynamic INT8, static QDQ with calibration data); "
                         "torch's INT8 pass covers nn.Linear only")


def _cpu_int8(a: NodeAnalysis, target: HardwareProfile, model: QuantFormat,
              carrier: tuple[str, str, float, float], w_bytes: int, w_bits: float,
              act_bits: float, op_type: str | None, edge: GemmEdge | None) -> Decision:
    """Case 4: INT8 where it pays by cost against the carrier ``(format, why, activation bits,
    seconds)``, else the carrier, with both times in the reason; ``edge``: "first"/"last"
    weight GEMM (case 2's prior, recorded for the checks that measure it)."""
    fmt, why, c_bits, t_base = carrier
    legal = Legality.no("the model is already at or below 8 bits") \
        if model.bits_per_weight <= 8 else can_int8_on_cpu(a, target)
    if not legal:
        return _decide(fmt, model, f"stays {fmt} ({why}): {legal.reason}")
    v = should_int8_on_cpu(a, target, base=fmt, base_s=t_base, weight_bytes=w_bytes,
                           weight_bits=w_bits, act_bits=act_bits, base_bits=c_bits)
    if not v.pays:
        return _decide(fmt, model, f"stays {fmt} ({why}): {v.reason}")
    runs_on, where = _cpu_where(a, op_type)
    said = "" if edge is None else (
        f"; the {edge} weight GEMM: its error is not averaged out by other layers, so the "
        "accuracy checks measure it (torch retries without the first and last GEMMs, the "
        "ONNX guard keeps the most sensitive nodes)")
    return _decide("int8", model, f"{v.reason}; {where}{said}", runs_on, baseline=fmt,
                   speedup=round(t_base / v.cost.total_s, 3), method=v.cost.method, edge=edge)


def _live(plan: Plan) -> set[str] | None:
    """The nodes a graph output depends on (case 2); None when the plan names no outputs."""
    outs = plan.model.output_names
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


def _ends(plan: Plan, live: set[str] | None) -> tuple[str | None, str | None]:
    """Case 2: the first and last weight GEMMs among those a graph output depends on."""
    gemms = [n.name for n in plan.nodes
             if is_weight_gemm(n) and (live is None or n.name in live)]
    return (gemms[0], gemms[-1]) if gemms else (None, None)


def sensitive_gemms(plan: Plan) -> dict[str, str]:
    """Case 2 on ``plan``: its weight GEMMs that stay at the carrier, in graph order, and why;
    the rule and the first / last / live facts :func:`plan_precisions` decides with."""
    live = _live(plan)
    first, last = _ends(plan, live)
    out: dict[str, str] = {}
    for n in plan.nodes:
        if is_weight_gemm(n):
            why = _sensitive(n.analysis.kernel_class, node_weights(n)[1],
                             live is None or n.name in live,
                             _edge(n.name == first, n.name == last), plan.target)
            if why is not None:
                out[n.name] = why
    return out


def _dominant_format(plan: Plan) -> str:
    """The format of the dtype that holds most parameter bytes (fp32 without params)."""
    params: dict[str, tuple[str | None, int]] = {}
    for n in plan.nodes:
        for t in n.inputs:
            if t is not None and t.kind == "param":
                params[t.name] = (t.dtype, t.nbytes)
    by_dtype: dict[str, int] = {}
    for dtype, nbytes in params.values():
        by_dtype[dtype or "fp32"] = by_dtype.get(dtype or "fp32", 0) + nbytes
    dominant = max(by_dtype, key=lambda d: by_dtype[d]) if by_dtype else "fp32"
    return _DTYPE_FORMAT.get(dominant, "fp32")


def plan_precisions(plan: Plan, model_format: str | None = None) -> dict[str, Decision]:
    """:func:`node_precision` for every node, knowing which weight GEMMs come first and last
    among those a graph output depends on (case 2)."""
    live = _live(plan)
    first, last = _ends(plan, live)
    if model_format is None:
        model_format = _dominant_format(plan)
    source = plan.model.source
    out = {n.name: node_precision(n, plan.target, model_format, is_first=n.name == first,
                                  is_last=n.name == last, live=live is None or n.name in live,
                                  source=source)
           for n in plan.nodes}
    low = sum(d.detail.format not in _TORCH_FORMATS for d in out.values()
              if isinstance(d.detail, PrecisionDetail))
    logger.info("precision on %s: %d of %d nodes at a low-precision format", plan.target.name,
                low, len(out))
    return out
