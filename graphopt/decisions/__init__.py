"""Decisions: what to change per node and per model for a target, each with its reason.

One subpackage per decision family, its entry function(s) exported by its ``__init__``:
``padding``, ``layout``, ``precision``, ``quantization``, ``memory_runtime``, ``kernels`` and
``deploy``; no family shares a mutable object with another. At this level: what all of them
share or drive (``planner`` builds the plan, ``decide`` fills its decisions, ``rewrites`` and
``range_plan`` extend it, ``tolerance`` and ``quant_formats`` are shared tables, ``lint`` reads
the decisions back).
"""

from __future__ import annotations

from graphopt.decisions.memory_runtime.memory import (
    MemoryPlan,
    ReservePolicy,
    memory_plan,
    render_breakdown,
    usable_memory,
)
from graphopt.decisions.precision.gemm import node_precision, plan_precisions
from graphopt.decisions.quant_formats import FORMATS, QuantFormat, get_format, runs_natively
from graphopt.decisions.quantization.cpu_int8 import int8_pays_on_cpu
from graphopt.decisions.quantization.recommend import QuantizationPlan, recommend_quant

__all__ = [
    # quantization + memory
    "FORMATS",
    "MemoryPlan",
    "QuantFormat",
    "QuantizationPlan",
    "ReservePolicy",
    "get_format",
    "int8_pays_on_cpu",
    "memory_plan",
    "node_precision",
    "plan_precisions",
    "recommend_quant",
    "render_breakdown",
    "runs_natively",
    "usable_memory",
]
