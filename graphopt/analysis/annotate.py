"""The analysis pass: one :class:`NodeAnalysis` per node of a graph."""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import Any

from graphopt.analysis.classify import classify_op
from graphopt.analysis.control_flow import with_bodies
from graphopt.analysis.kernel_class import GEMM_LIKE, KernelClass
from graphopt.analysis.metrics import has_empty_outputs, node_work
from graphopt.analysis.patterns import find_patterns
from graphopt.analysis.record import NodeAnalysis
from graphopt.ir import ops
from graphopt.ir.graph import Graph, Node, TensorInfo

__all__ = ["annotate"]

logger = logging.getLogger(__name__)

_FLOAT_DTYPES = frozenset({"fp64", "fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "fp4"})
_QUANT_CLASSES = frozenset({KernelClass.QUANT_GEMM, KernelClass.QUANT_DOT})
_INT8_CONVS = frozenset({"ConvInteger", "QLinearConv"})  # 8-bit operands, 32-bit sums
#: a weight dequantized from these computes at their width when ORT fuses the QDQ pair
_DQ_FORMATS = {"int8": "int8", "uint8": "int8", "int4": "int4", "uint4": "int4",
               "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}


def annotate(graph: Graph) -> dict[str, NodeAnalysis]:
    """Classify every node, recognize multi-node patterns, and count each node's work.

    A node's class, work and flags depend only on its op, attributes and tensors, so a node
    like one already seen (the same layer repeated 32 times) reuses its result.
    """
    patterns = find_patterns(graph)
    out: dict[str, NodeAnalysis] = {}
    seen: dict[tuple[Any, ...], tuple[KernelClass, Any, tuple[str, ...]]] = {}
    for node in graph.nodes:
        ins = graph.input_infos(node)
        outs = graph.output_infos(node)
        key = _signature(node, ins, outs)
        hit = seen.get(key)
        if hit is None:
            natural = classify_op(graph, node)
            hit = (natural, node_work(graph, node, natural), _flags(node, ins, outs))
            seen[key] = hit
        natural, work, flags = hit
        match = patterns.get(node.name)
        kc = match.kernel_class if match is not None else natural
        dims = dict(match.dims) if match is not None else dict(work.dims)
        out[node.name] = NodeAnalysis(
            kernel_class=kc,
            dims=dims,
            flops=work.flops,
            bytes_read=work.bytes_read,
            bytes_written=work.bytes_written,
            param_count=work.param_count,
            dtype=_compute_dtype(node, kc, ins, outs),
            pattern=match.id if match is not None else None,
            flags=flags,
            op_type=node.op_type,
        )
    with_bodies(graph, out, annotate)  # If/Loop/Scan: their bodies' nodes
    for name in _shape_arithmetic(graph):
        out[name] = replace(out[name], flags=(*out[name].flags, "shape_arithmetic"))
    for name, dtype in _qdq_dtypes(graph, out).items():
        out[name] = replace(out[name], dtype=dtype)
    logger.info("annotated %d nodes (%d distinct), %d in patterns", len(out), len(seen),
                len(patterns))
    return out


def _qdq_dtypes(graph: Graph, out: dict[str, NodeAnalysis]) -> dict[str, str]:
    """A conv or GEMM whose weight a ``DequantizeLinear`` of a low-bit tensor makes (a QDQ
    model, ORT's default format): ONNX Runtime fuses the pair into an integer kernel
    (QLinearConv / QGemm), so it computes at the weight's width, not in fp32."""
    found = {}
    for node in graph.nodes:
        a = out[node.name]
        if a.kernel_class not in (KernelClass.CONV, *GEMM_LIKE) or len(node.inputs) < 2 or \
                node.op_type == "DequantizeLinear":
            continue
        dq = graph.producer.get(node.inputs[1])
        src = graph.tensors.get(dq.inputs[0]) if dq is not None and dq.inputs else None
        if dq is not None and dq.op_type == "DequantizeLinear" and src is not None and \
                src.dtype in _DQ_FORMATS:
            found[node.name] = _DQ_FORMATS[src.dtype]
    return found


#: the most elements a shape-arithmetic value holds (a shape, an axis list, a size)
_SHAPE_VALUE_MAX = 64
_INDEX_DTYPES = frozenset({"int64", "int32", "bool"})


def _shape_arithmetic(graph: Graph) -> set[str]:
    """Nodes that compute on tensor shapes only: ``Shape``/``Size``, and every node whose inputs
    are constants or such nodes' outputs and whose outputs are small static index tensors.
    A dynamic-axes export computes its reshape targets so (``Shape -> Gather -> Concat``);
    a static export of the same model folds them away, and ONNX Runtime runs them on the host
    beside the kernels, so they are host work, not kernels (roofline case 8)."""
    found: set[str] = set()
    made: set[str] = set()  # tensors the found nodes write
    for node in graph.nodes:
        outs = graph.output_infos(node)
        small = all(t is not None and t.is_static and t.dtype in _INDEX_DTYPES and
                    math.prod(t.shape) <= _SHAPE_VALUE_MAX for t in outs) and bool(outs)
        if not small:
            continue
        if node.op_type not in ("Shape", "Size"):
            ins = [(name, graph.tensors.get(name)) for name in node.inputs if name]
            if not ins or any(name not in made and (t is None or t.kind != "constant")
                              for name, t in ins):
                continue
        found.add(node.name)
        made.update(o for o in node.outputs if o)
    return found


def _signature(node: Node, ins: list[TensorInfo | None], outs: list[TensorInfo | None]
               ) -> tuple[Any, ...]:
    """What a node's analysis depends on: op, attributes, and its tensors' shapes, dtypes
    and kinds (not their names)."""
    try:
        attrs: Any = tuple(sorted(node.attrs.items()))
        hash(attrs)
    except TypeError:  # list-valued attributes: their text is as good a key
        attrs = repr(sorted(node.attrs.items()))
    return (node.op_type, node.source_op, attrs,
            tuple(None if t is None else (t.shape, t.dtype, t.kind) for t in ins),
            tuple(None if t is None else (t.shape, t.dtype, t.kind) for t in outs))


def _compute_dtype(node: Node, kc: KernelClass, ins: list[TensorInfo | None],
                   outs: list[TensorInfo | None]) -> str | None:
    """The dtype the kernel computes in: the weight's for quantized GEMMs and convs, else the
    inputs'."""
    if node.op_type in _INT8_CONVS:
        return "int8"
    if kc in _QUANT_CLASSES:
        if node.op_type == "MatMulNBits":
            return "int4" if int(node.attrs.get("bits", 4)) <= 4 else "int8"
        for t in ins:
            if t is not None and t.dtype in ("int8", "uint8", "int4", "uint4", "fp8_e4m3",
                                             "fp8_e5m2"):
                return "int8" if t.dtype in ("int8", "uint8") else t.dtype
        return "int8"
    for t in ins:
        if t is not None and t.dtype in _FLOAT_DTYPES:
            return t.dtype
    for t in outs:
        if t is not None and t.dtype is not None:
            return t.dtype
    return ins[0].dtype if ins and ins[0] is not None else None


def _flags(node: Node, ins: list[TensorInfo | None], outs: list[TensorInfo | None]) -> tuple[
        str, ...]:
    flags: list[str] = []
    if node.op_type not in ops.KNOWN_OPS:
        flags.append("unsupported_op")
    tensors = [t for t in (*ins, *outs) if t is not None]
    if any(t.shape is None for t in outs if t is not None) or any(t is None for t in outs):
        flags.append("unknown_shape")
    if any(t.shape is not None and not t.is_static for t in tensors):
        flags.append("dynamic_shape")
    if any(t.shape is not None and 0 in t.shape for t in tensors):
        flags.append("zero_size")
    if has_empty_outputs(outs):
        flags.append("empty_output")
    return tuple(flags)
