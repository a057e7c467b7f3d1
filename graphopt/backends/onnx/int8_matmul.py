"""Dynamic INT8 MatMuls written by graphopt: the graph ONNX Runtime's ``quantize_dynamic``
writes, node for node and byte for byte, without its per-channel Python loop.

Why not call ORT's quantizer (:func:`.quantize_ort.ort_dynamic_int8`, still the reference the
tests and ``benchmarks/bench_quantize_call.py`` compare with): it quantizes each weight column
in a Python call of its own (50,000 calls, 3.5 s on GPT-2 4L) and saves and reloads the
model with shape inference, and the accuracy guard calls it again for every fallback round.
Here each weight is quantized in a few numpy operations. ``tests/test_int8_matmul.py`` checks
the result against ORT's: the same nodes, names and initializer bytes, and the same outputs.

What ORT writes (onnxruntime 1.31, ``IntegerOps`` mode, ``per_channel=True``, int8 symmetric
weights, ``MatMulConstBOnly``), for ``y = MatMul(x, W)`` named ``mm``:

* ``x_quantized, x_scale, x_zero_point = DynamicQuantizeLinear(x)`` (``x_QuantizeLinear``),
  once per activation however many MatMuls read it;
* ``W_quantized`` (int8), ``W_scale`` (fp32) and ``W_zero_point`` (int8 zeros), one value per
  output column, once per weight; the fp32 ``W`` goes when nothing else reads it. Per column:
  ``absmax = max(|min(w, 0)|, max(w, 0))``, ``scale = fp32(2 * absmax / (qmax - qmin))`` in
  float64, with ``(qmin, qmax) = (-64, 64)`` under ``reduce_range`` else ``(-127, 127)``; a
  scale below fp32's ``tiny`` becomes 1. ``q = clip(round(w / scale), -128, 127)``;
* ``mm_quant_scales_mul`` = ``x_scale * W_scale``, ``mm_quant`` = MatMulInteger, a ``Cast``
  to fp32 and ``mm_quant_output_scale_mul``, which writes ``y``.

ONNX Runtime fuses that pattern into ``DynamicQuantizeMatMul`` when it loads the model.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from graphopt.backends.onnx.ort_runner import outer_inputs
from graphopt.files.proto_copy import copy_except
from graphopt.frontends.onnx_safety import default_opset

__all__ = ["MIN_OPSET", "dynamic_int8_matmuls", "quantized_weight"]

#: DynamicQuantizeLinear and MatMulInteger are opset 10-11 ops (the ONNX frontend raises every
#: model to ``frontends.onnx_safety.MIN_OPSET``, 13, before any pass: this is a guard)
MIN_OPSET = 11


def quantized_weight(w: np.ndarray, reduce_range: bool) -> tuple[np.ndarray, np.ndarray]:
    """(int8 weights, fp32 scale per column) of a 2-D fp32 ``w``, as ORT computes them."""
    qmin, qmax = (-64, 64) if reduce_range else (-127, 127)
    w = np.asarray(w, dtype=np.float32)
    absmax = np.maximum(np.abs(np.minimum(w.min(axis=0), 0)), np.maximum(w.max(axis=0), 0))
    scale64 = 2.0 * absmax.astype(np.float64) / float(qmax - qmin)
    tiny = scale64 < np.finfo(np.float32).tiny
    scale = np.where(tiny, 1.0, scale64).astype(np.float32)
    q = np.round(w / scale)
    np.clip(q, -128, 127, out=q)
    return q.astype(np.int8), scale


def _quantize_weight(name: str, w: onnx.TensorProto, reduce_range: bool
                     ) -> list[onnx.TensorProto]:
    q, scale = quantized_weight(numpy_helper.to_array(w), reduce_range)
    return [numpy_helper.from_array(scale, f"{name}_scale"),
            numpy_helper.from_array(np.zeros(scale.shape, np.int8), f"{name}_zero_point"),
            numpy_helper.from_array(q, f"{name}_quantized")]


def _matmul_nodes(node: onnx.NodeProto, x: str, w: str) -> list[onnx.NodeProto]:
    """MatMulInteger, Cast and the two Muls standing for ``node`` (names as ORT gives them)."""
    out = node.output[0]
    quant = f"{node.name}_quant" if node.name else ""
    scales = f"{quant}_scales_mul" if quant else f"{x}_scale_{w}_scale_mul"
    integer = f"{out}_output_quantized"
    return [
        helper.make_node("Mul", [f"{x}_scale", f"{w}_scale"], [f"{scales}:0"], scales),
        helper.make_node("MatMulInteger", [f"{x}_quantized", f"{w}_quantized",
                                           f"{x}_zero_point", f"{w}_zero_point"],
                         [integer], quant),
        helper.make_node("Cast", [integer], [f"{integer}_cast_output"], f"{integer}_cast",
                         to=onnx.TensorProto.FLOAT),
        helper.make_node("Mul", [f"{integer}_cast_output", f"{scales}:0"], [out],
                         f"{quant}_output_scale_mul" if quant else ""),
    ]


def dynamic_int8_matmuls(model: onnx.ModelProto, nodes: Iterable[str], *,
                         reduce_range: bool) -> onnx.ModelProto:
    """A copy of ``model`` with each MatMul in ``nodes`` (top-level, fp32 2-D initializer
    weight, activation not an initializer: what :mod:`.quantize` picks) quantized as ORT's
    dynamic quantizer does (module docstring)."""
    opset = default_opset(model) or 0
    if opset < MIN_OPSET:
        raise ValueError(f"opset {opset} < {MIN_OPSET}")
    chosen = set(nodes)
    inits = {t.name: t for t in model.graph.initializer}
    graph_inputs = {i.name for i in model.graph.input}
    new_inits: list[onnx.TensorProto] = []
    done_w: set[str] = set()
    done_x: set[str] = set()
    body: list[onnx.NodeProto] = []
    for node in model.graph.node:
        if node.name not in chosen or node.op_type != "MatMul":
            body.append(node)
            continue
        x, w = node.input[0], node.input[1]
        if x in inits or w not in inits or w in graph_inputs:
            raise ValueError(f"MatMul {node.name!r} is not activation x constant weight")
        if x not in done_x:
            done_x.add(x)
            body.append(helper.make_node(
                "DynamicQuantizeLinear", [x], [f"{x}_quantized", f"{x}_scale", f"{x}_zero_point"],
                f"{x}_QuantizeLinear"))
        if w not in done_w:
            done_w.add(w)
            new_inits += _quantize_weight(w, inits[w], reduce_range)
        body += _matmul_nodes(node, x, w)
    out = copy_except(model, onnx.ModelProto(), "graph")  # the weights are copied once, below
    g = copy_except(model.graph, out.graph, "node", "initializer")
    g.node.extend(body)
    read = {t for n in g.node for t in (*n.input, *outer_inputs(n))} | {o.name for o in g.output}
    shared = [w for w in sorted(done_w) if w in read]  # still read by a float node
    g.node.extend(helper.make_node("DequantizeLinear", [f"{w}_quantized", f"{w}_scale",
                                                        f"{w}_zero_point"], [w],
                                   f"{w}_DequantizeLinear", axis=-1) for w in shared)
    g.initializer.extend(t for t in model.graph.initializer if t.name not in done_w)
    g.initializer.extend(new_inits)
    return out

