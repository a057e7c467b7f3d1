"""Each node's precision under a reduced compute dtype, decided on the plan by canonical op.

The planner's per-node precision (``precision.gemm``) takes its fp32 islands from here, and the
torch and ONNX precision passes read these decisions (their nodes carry the plan's names), so
the plan says what they apply; the passes only add what their IR needs: dtype propagation,
casts, and the legality checks of their own edits ("can't apply here: why").

Cases, per plan node:

1. fp32 island: a node of a detected norm pattern (``rmsnorm:N``/``layernorm:N``), a node of
   kernel class norm/rmsnorm/softmax that is not GEMM-like, a canonical op in
   ``precision.islands.ISLAND_OPS``, or a square ``Mul(x, x)`` (it is ``Pow(x, 2)``: the same
   range, so the same reason). Reason: why the op's error is not bounded in 16 bits.
2. GEMM-like (``GEMM_OPS``, ``Einsum``, float convs, ``ATTENTION_OPS``): runs at the compute
   dtype; the kernel accumulates in fp32, so only the inputs' rounding is lost.
3. Anything else is left to the backend's dtype propagation (no decision here).
"""

from __future__ import annotations

from collections.abc import Sequence

from graphopt.analysis.kernel_class import KernelClass
from graphopt.analysis.record import NodeAnalysis
from graphopt.decisions.precision.islands import ISLAND_OPS
from graphopt.ir import ops
from graphopt.ir.decision_details import PrecisionDetail
from graphopt.ir.plan import Decision, NodePlan, Plan

__all__ = ["LOW_KINDS", "island_reason", "kept_fp32", "node_decision", "node_island",
           "plan_decisions"]

#: canonical GEMM-like ops and the work they are (case 2)
LOW_KINDS: dict[str, str] = {
    **{op: "GEMM" for op in (*ops.GEMM_OPS, "Einsum")},
    **{op: "conv" for op in ("Conv", "ConvTranspose")},
    **{op: "attention" for op in ops.ATTENTION_OPS},
}
_NORM_PATTERNS = ("rmsnorm", "layernorm")
_ISLAND_CLASSES = {KernelClass.NORM: "LayerNormalization",
                   KernelClass.RMSNORM: "RMSNormalization", KernelClass.SOFTMAX: "Softmax"}


def island_reason(op_type: str, analysis: NodeAnalysis | None = None,
                  inputs: Sequence[str | None] = ()) -> str | None:
    """Why a node of canonical ``op_type`` (with its analysis, if planned, and its input tensor
    names, which tell a square) is an fp32 island (case 1), or None when it is not one."""
    pattern = (analysis.pattern or "") if analysis is not None else ""
    if pattern.split(":")[0] in _NORM_PATTERNS:
        return f"part of the decomposed norm {pattern}; {ISLAND_OPS['LayerNormalization']}"
    kc = analysis.kernel_class if analysis is not None else None
    if kc in _ISLAND_CLASSES and op_type not in LOW_KINDS:
        return f"{kc.value} kernel; {ISLAND_OPS[_ISLAND_CLASSES[kc]]}"
    if op_type == "Mul" and len(inputs) == 2 and inputs[0] and inputs[0] == inputs[1]:
        return f"x*x is a square; {ISLAND_OPS['Pow']}"
    return ISLAND_OPS.get(op_type)


def node_island(node: NodePlan) -> str | None:
    """:func:`island_reason` of a plan node: the one island rule the planner
    (``precision.gemm``) and both backends ask."""
    names = tuple(t.name if t is not None else None for t in node.inputs) \
        if node.op_type == "Mul" else ()  # only a square reads its inputs' names
    return island_reason(node.op_type, node.analysis, names)


def node_decision(node: NodePlan, compute_dtype: str) -> Decision | None:
    """The precision decision for one plan node at ``compute_dtype`` (cases 1-3)."""
    why = node_island(node)
    if why is not None:
        return Decision(f"fp32 island: {why}", PrecisionDetail("fp32", island=True),
                        applied=False)
    if node.op_type in LOW_KINDS:
        return Decision(f"{compute_dtype}: {LOW_KINDS[node.op_type]} with fp32 accumulation",
                        PrecisionDetail(compute_dtype, island=False))
    return None


def kept_fp32(why: str) -> str:
    """The reason a GEMM-like node gives when the whole model stays fp32 (both backends)."""
    return f"kept fp32: {why.removeprefix('fp32: ')}"


def plan_decisions(plan: Plan, compute_dtype: str) -> dict[str, Decision]:
    """{node name: decision} for every plan node with one (cases 1-2)."""
    out = {}
    for node in plan.nodes:
        d = node_decision(node, compute_dtype)
        if d is not None:
            out[node.name] = d
    return out
