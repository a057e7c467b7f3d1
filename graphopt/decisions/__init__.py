"""Decisions: what to change per node and per model for a target, each with its reason.

One module per decision family; each re-exports its public names here.
"""

from __future__ import annotations

from graphopt.decisions.cpu_int8 import int8_pays_on_cpu
from graphopt.decisions.gemm_precision import node_precision, plan_precisions
from graphopt.decisions.memory import (
    MemoryPlan,
    ReservePolicy,
    memory_plan,
    render_breakdown,
    usable_memory,
)
from graphopt.decisions.quant_formats import FORMATS, QuantFormat, get_format, runs_natively
from graphopt.decisions.quantization import QuantRecommendation, recommend_quant

__all__ = [
    # quantization + memory
    "FORMATS",
    "MemoryPlan",
    "QuantFormat",
    "QuantRecommendation",
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
