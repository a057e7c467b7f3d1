"""Fill a plan's decisions for its target: per node precision and execution path; per model the
memory plan, the quantization recommendation and the runtime settings.

This is the planning half of the decisions (what graphopt would do and why); the torch rewrite
passes record what they actually applied on top of it.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import replace

from graphopt.analysis.kernel_class import GEMM_LIKE, KernelClass
from graphopt.cost.roofline import estimate
from graphopt.decisions.kernels.exec_path import exec_path
from graphopt.decisions.memory_runtime.compile_mode import compile_mode
from graphopt.decisions.memory_runtime.memory import memory_plan
from graphopt.decisions.memory_runtime.runtime import runtime_settings
from graphopt.decisions.precision.gemm import plan_precisions
from graphopt.decisions.quant_formats import FORMAT_DTYPE
from graphopt.decisions.quantization.recommend import recommend_quant
from graphopt.ir.plan import Plan
from graphopt.ir.plan_memory import MemoryPlan, QuantizationPlan, RuntimeSettings

__all__ = ["decide", "model_format", "plan_runtime_settings"]

logger = logging.getLogger(__name__)

# the precision format names node_precision emits -> the cost model's dtype names

#: a weight's stored dtype -> the weight format it is (:data:`quant_formats.FORMATS` keys); a
#: pre-quantized model's uint8 weights (ORT's ``MatMulInteger``, ``QLinearConv``) are INT8
_DTYPE_FORMAT = {"fp64": "fp32", "fp32": "fp32", "fp16": "fp16", "bf16": "bf16",
                 "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e4m3", "int8": "int8",
                 "uint8": "int8", "int4": "int4", "uint4": "int4", "fp4": "nvfp4"}
#: ops whose packed uint8 weight holds 4-bit values (ORT's MatMulNBits, bits=4 by default)
_NIBBLE_OPS = frozenset({"com.microsoft::MatMulNBits", "MatMulNBits"})


def model_format(plan: Plan) -> str:
    """The model's own weight format: the format most of its weight elements are stored in
    (fp32 if it has none), read from each weight's dtype and the op that consumes it."""
    counts: Counter[str] = Counter()
    for n in plan.nodes:
        for t in n.inputs:
            if t is None or t.kind != "param" or not t.dtype:
                continue
            fmt = "int4" if n.op_type in _NIBBLE_OPS and t.dtype == "uint8" else \
                _DTYPE_FORMAT.get(t.dtype)
            if fmt is not None:
                counts[fmt] += t.numel
    return counts.most_common(1)[0][0] if counts else "fp32"


def plan_runtime_settings(plan: Plan, precision: str,
                          memory: MemoryPlan | None = None) -> RuntimeSettings:
    """Runtime settings for ``plan`` run at ``precision``: whether it has convs and its largest
    attention head_dim come from the plan's nodes; the batch is ``memory``'s recommended one
    when it has one, else the largest it fits."""
    head_dims = [n.analysis.dims.get("head_dim") for n in plan.nodes
                 if n.analysis.kernel_class is KernelClass.ATTENTION]
    settings = runtime_settings(
        plan.target, precision=precision,
        has_convs=any(n.analysis.kernel_class is KernelClass.CONV for n in plan.nodes),
        static_shapes=not plan.shape_range,
        max_batch_size=None if memory is None else memory.max_batch_size,
        head_dim=max((h for h in head_dims if h), default=None),
        batch_size=None if memory is None else memory.recommended_batch_size,
        batch_reason=None if memory is None else memory.batch_advice)
    mode = compile_mode(plan.target, plan.summary.time_by_bottleneck_s,
                        dynamic=bool(plan.shape_range))
    return replace(settings, compile_mode=mode)


def decide(plan: Plan, *, preference: str = "balanced") -> Plan:
    """A copy of ``plan`` with node decisions and the model-level sections filled in."""
    target = plan.target
    precisions = plan_precisions(plan)
    nodes = []
    paths: dict[tuple, object] = {}  # repeated blocks share shapes: choose each tile once
    decided_time = 0.0
    for n in plan.nodes:
        decisions = dict(n.decisions)
        prec = precisions.get(n.name)
        dtype = None
        if prec is not None:
            decisions["precision"] = prec
            dtype = FORMAT_DTYPE.get(prec.detail.format)
        a = n.analysis
        if a.kernel_class is not KernelClass.VIEW:
            key = (a.kernel_class, tuple(a.dims.items()), a.flops, a.bytes_read,
                   a.bytes_written, a.param_count, a.dtype, a.flags, dtype)
            if key not in paths:
                paths[key] = exec_path(a, target, dtype)
            decisions["exec_path"] = paths[key]
        # the same roofline at the decided precision: what the decisions would buy
        decided_time += (estimate(a, target, dtype).est_time_s if dtype and dtype != a.dtype
                         else n.cost.est_time_s)
        nodes.append(replace(n, decisions=decisions))
    summary = replace(plan.summary, est_latency_with_decisions_s=decided_time,
                      predicted_speedup=(plan.est_latency_s / decided_time) if decided_time
                      else 1.0)
    decided = replace(plan, nodes=tuple(nodes), summary=summary)
    memory = memory_plan(decided, precisions)
    original = model_format(plan)
    params = plan.model.param_count
    quant = (recommend_quant(target, params, original, preference,
                             activation_bytes=memory.activation_peak_bytes)
             if params > 0 else
             QuantizationPlan.nothing_to_quantize("the model has no parameters to quantize"))
    low = {d.detail.format for d in precisions.values()} - {"fp32", "None"}
    settings = plan_runtime_settings(
        plan, "bf16" if "bf16" in low else next(iter(sorted(low)), "fp32"), memory)
    gemms = sum(1 for n in plan.nodes if n.analysis.kernel_class in GEMM_LIKE)
    logger.info("decided %d nodes (%d GEMM-like) on %s", len(nodes), gemms, target.name)
    return replace(decided, memory=memory, quantization=quant, runtime_settings=settings)
