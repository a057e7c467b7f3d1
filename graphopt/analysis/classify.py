"""Kernel class of a single node from its canonical op (patterns may override it later)."""

from __future__ import annotations

from graphopt.analysis.einsum import einsum_work
from graphopt.analysis.kernel_class import KernelClass
from graphopt.analysis.metrics import einsum_shapes, gemm_dims
from graphopt.analysis.recurrent import rnn_dims
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
    (ops.CONTROL_FLOW_OPS, KernelClass.CONTROL_FLOW),
)
_OP_CLASS: dict[str, KernelClass] = {op: kc for family, kc in _BY_FAMILY for op in family}


def classify_op(graph: Graph, node: Node) -> KernelClass:
    """Class of ``node`` run on its own: GEMMs (and recurrences, einsums) split into gemm/gemv by
    shape, aliases are views."""
    op = node.op_type
    if op in ops.GEMM_OPS or op in ops.QUANT_GEMM_OPS:
        d = gemm_dims(node, graph.input_infos(node))
        vector = d["M"] == 1 or d["N"] == 1
        if op in ops.QUANT_GEMM_OPS:
            return KernelClass.QUANT_DOT if vector else KernelClass.QUANT_GEMM
        return KernelClass.GEMV if vector else KernelClass.GEMM
    if op in ops.RNN_OPS:  # a GEMM per step: GEMVs for a batch of one
        return KernelClass.GEMV if rnn_dims(node, graph.input_infos(node))["M"] == 1 \
            else KernelClass.GEMM
    if op in ops.EINSUM_OPS:
        work = einsum_work(str(node.attrs.get("equation", "")),
                           einsum_shapes(graph.input_infos(node)))
        return KernelClass.OTHER if work is None else work.kernel_class
    if op in ops.DATA_MOVEMENT:
        return KernelClass.VIEW if node.attrs.get("alias") else KernelClass.DATA_MOVEMENT
    if op in ops.VIEW_OPS and node.attrs.get("alias") is False:  # the frontend saw it copy
        return KernelClass.DATA_MOVEMENT
    return _OP_CLASS.get(op, KernelClass.OTHER)
