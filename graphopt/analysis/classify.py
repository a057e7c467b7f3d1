"""Kernel class of a single node from its canonical op (patterns may override it later)."""

from __future__ import annotations

from graphopt.analysis.kernel_class import KernelClass
from graphopt.analysis.metrics import gemm_dims
from graphopt.ir import ops
from graphopt.ir.graph import Graph, Node

__all__ = ["classify_op"]

_RMSNORM_OPS = frozenset({"RMSNormalization",
                          "SkipSimplifiedLayerNormalization"})
_BY_FAMILY: tuple[tuple[frozenset[str], KernelClass], ...] = (
    (ops.CONV_OPS, KernelClass.CONV),
    (ops.ATTENTION_OPS, KernelClass.ATTENTION),
    (ops.ROPE_OPS, KernelClass.ROPE),
    (ops.SOFTMAX_OPS, KernelClass.SOFTMAX),
    (_RMSNORM_OPS, KernelClass.RMSNORM),
    (ops.NORM_OPS, KernelClass.NORM),
    (frozenset({"Silu"}), KernelClass.SILU),
    (ops.UNARY_ELEMENTWISE | ops.BINARY_ELEMENTWISE, KernelClass.ELEMENTWISE),
    (ops.REDUCE_OPS | ops.POOL_OPS, KernelClass.REDUCTION),
    (ops.VIEW_OPS, KernelClass.VIEW),
)
_OP_CLASS: dict[str, KernelClass] = {op: kc for family, kc in _BY_FAMILY for op in family}


def classify_op(graph: Graph, node: Node) -> KernelClass:
    """Class of ``node`` run on its own: GEMMs split into gemm/gemv by shape, aliases are views."""
    op = node.op_type
    if op in ops.GEMM_OPS or op in ops.QUANT_GEMM_OPS:
        d = gemm_dims(node, graph.input_infos(node))
        vector = d["M"] == 1 or d["N"] == 1
        if op in ops.QUANT_GEMM_OPS:
            return KernelClass.QUANT_DOT if vector else KernelClass.QUANT_GEMM
        return KernelClass.GEMV if vector else KernelClass.GEMM
    if op in ops.DATA_MOVEMENT:
        return KernelClass.VIEW if node.attrs.get("alias") else KernelClass.DATA_MOVEMENT
    if op in ops.VIEW_OPS and node.attrs.get("alias") is False:  # the frontend saw it copy
        return KernelClass.DATA_MOVEMENT
    return _OP_CLASS.get(op, KernelClass.OTHER)
