"""Sizes ONNX's shape inference loses, kept as expressions of the input dims.

Nearly every transformer exported with ``dynamic_axes`` computes its reshape targets at run
time (``Shape -> Gather -> Concat -> Reshape``). ONNX's inferencer gives such an output fresh
symbols (``unk__12``) that say nothing about the inputs, and a plan read them as 1: a
``[batch * seq, 768]`` projection became a GEMV with M = 1. ONNX Runtime's symbolic shape
inference (``onnxruntime.tools.symbolic_shape_infer``, sympy underneath) follows the shape
arithmetic and writes ``batch*seq``, which :func:`graphopt.ir.shape_range.evaluate` sizes at
any point of the range.

It runs only where it can help (ONNX left a dim unknown, or a tensor untyped: ORT's contrib
ops such as ``MatMulNBits`` and ``QGemm`` are unknown to ONNX's inferencer), on the
weight-free skeleton the frontend already made, and a tensor takes its
answer only when that answer names fewer unknown symbols. It is pure Python over the graph
(about 1 s per 2,700 nodes here); any failure leaves ONNX's answer as it was, with a warning.
"""

from __future__ import annotations

import ast
import contextlib
import io
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnx.numpy_helper
import onnx.shape_inference

from graphopt.frontends.onnx_fold import fold_constants

__all__ = ["input_symbols", "opt_point_shapes", "sharpen", "skeleton", "unknown_dims"]

logger = logging.getLogger(__name__)

# Shape inference needs the values of shape-like inputs only (Reshape shape, Resize scales, Slice
# starts...: a few elements); bigger initializers go in as dims-only stubs. Counted from dims:
# ByteSize() walks the data and takes seconds on GB-sized tensors.
_SKELETON_MAX_ELEMENTS = 256


def skeleton(model: onnx.ModelProto, order: Iterable[int]) -> onnx.ModelProto:
    """The model, nodes in ``order``, big initializers as dims-only stubs: for shape inference."""
    skel = onnx.ModelProto(ir_version=model.ir_version)
    skel.opset_import.extend(model.opset_import)
    skel.functions.extend(model.functions)
    src, g = model.graph, skel.graph
    g.name = src.name
    g.node.extend(src.node[i] for i in order)
    g.input.extend(src.input)
    g.output.extend(src.output)
    g.value_info.extend(src.value_info)
    g.sparse_initializer.extend(src.sparse_initializer)
    for t in src.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL or \
                math.prod(t.dims) <= _SKELETON_MAX_ELEMENTS:
            g.initializer.append(t)
        else:
            stub = g.initializer.add(name=t.name, data_type=t.data_type, dims=t.dims,
                                     data_location=onnx.TensorProto.EXTERNAL)
            stub.external_data.add(key="location", value="graphopt-shape-inference-stub")
    return skel


def input_symbols(graph: onnx.GraphProto) -> set[str]:
    """The symbolic dim names of the graph's inputs."""
    return {d.dim_param for vi in graph.input if vi.type.HasField("tensor_type")
            for d in vi.type.tensor_type.shape.dim if d.dim_param}


def _names(expr: str) -> set[str] | None:
    """The symbols an expression names; None if it is not one."""
    try:
        tree = ast.parse(expr, mode="eval")
    except (SyntaxError, ValueError, RecursionError):
        return None
    calls = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Name)}
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} - calls


def unknown_dims(dims: Iterable[int | str], known: set[str]) -> int:
    """How many of ``dims`` are neither a number nor an expression of ``known`` symbols."""
    bad = 0
    for d in dims:
        if isinstance(d, int):
            continue
        names = _names(d) if d and d != "?" else None
        bad += names is None or not names <= known
    return bad


def _dims(vi: onnx.ValueInfoProto) -> list[int | str] | None:
    if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else d.dim_param
            for d in vi.type.tensor_type.shape.dim]


def _ort_symbolic(tool: Any, skeleton: onnx.ModelProto) -> onnx.ModelProto:
    """``SymbolicShapeInference.infer_shapes``'s own loop, keeping what it inferred when some
    tensor stays unknown. Its public wrapper then writes ``sym_shape_infer_temp.onnx`` into the
    current folder, the user's, and raises: graphopt writes nothing the user did not ask for."""
    run = tool(2**31 - 1, True, False, 0)  # int_max, auto_merge, guess_output_rank, verbose
    run._preprocess(skeleton)
    while run.run_:
        run._infer_impl()
    run._update_output_from_vi()
    return run.out_mp_


def sharpen(skeleton: onnx.ModelProto, inferred: onnx.GraphProto, warnings: list[str]
            ) -> dict[str, onnx.ValueInfoProto]:
    """Value infos from ORT's symbolic inference of ``skeleton`` for the tensors ONNX's
    ``inferred`` graph left with unknown dims, where ORT knows more."""
    known = input_symbols(skeleton.graph)  # none in a static model: contrib ops' shapes
    vague = {vi.name: unknown_dims(dims, known) for group in (inferred.value_info,
                                                              inferred.output)
             for vi in group if (dims := _dims(vi)) is not None}
    produced = {o for n in skeleton.graph.node for o in n.output if o}
    if not any(vague.values()) and produced <= set(vague):
        return {}
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

        with contextlib.redirect_stdout(io.StringIO()):  # it prints what it cannot infer
            out = _ort_symbolic(SymbolicShapeInference, skeleton)
    except Exception as e:  # noqa: BLE001 - ORT's tool raises anything; ONNX's answer stands
        logger.debug("symbolic shape inference failed: %s: %s", type(e).__name__, e)
        warnings.append(f"ONNX Runtime's symbolic shape inference failed "
                        f"({type(e).__name__}: {str(e)[:160]}); sizes computed at run time "
                        "from the inputs' shapes may be unknown")
        return {}
    if out is None:
        return {}
    better = {}
    for vi in (*out.graph.value_info, *out.graph.output):
        dims = _dims(vi)
        if dims is None:
            continue
        before = vague.get(vi.name)
        if before is None or unknown_dims(dims, known) < before:
            better[vi.name] = vi
    return better


def opt_point_shapes(model: onnx.ModelProto, order: Sequence[int], values: Mapping[str, int]
                     ) -> dict[str, tuple[int, ...]]:
    """Every tensor's static shape with the input dims set to ``values`` (the opt point):
    the model's static twin, inferred with its shape arithmetic folded (each ``Shape`` of a
    tensor whose shape is now known becomes its value, folded onward, until nothing changes).
    For the dims neither inferencer could write as an expression of the inputs; empty if
    inference fails."""
    skel = skeleton(model, order)
    del skel.graph.value_info[:]  # stored symbolic dims would win over the inferred sizes
    for vi in skel.graph.input:
        for d in vi.type.tensor_type.shape.dim if vi.type.HasField("tensor_type") else ():
            if d.dim_param in values:
                d.dim_value = int(values[d.dim_param])  # clears dim_param (a oneof)
    out: dict[str, tuple[int, ...]] = {}
    for _ in range(_TWIN_ROUNDS):
        try:
            fold_constants(skel)
            inferred = onnx.shape_inference.infer_shapes(
                skel, check_type=False, strict_mode=False, data_prop=True).graph
        except Exception as e:  # noqa: BLE001 - the C++ inferencer raises many types
            logger.debug("opt-point shape inference failed: %s: %s", type(e).__name__, e)
            return out
        out = {}
        for vi in (*inferred.value_info, *inferred.output, *skel.graph.input):
            dims = _dims(vi)
            if dims is not None and all(isinstance(d, int) and d >= 0 for d in dims):
                out[vi.name] = tuple(dims)
        if not _shapes_as_constants(skel, out):
            break
        del skel.graph.value_info[:]
    return out


_TWIN_ROUNDS = 8  # Shape -> Range -> Shape chains in real exports are 2-3 deep


def _shapes_as_constants(skel: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]]) -> bool:
    """Each ``Shape``/``Size`` node of a tensor in ``shapes`` becomes a ``Constant`` of its
    value (in place); whether any did."""
    changed = False
    for node in skel.graph.node:
        if node.op_type not in ("Shape", "Size") or node.domain not in ("", "ai.onnx") or \
                node.input[0] not in shapes:
            continue
        shape = shapes[node.input[0]]
        if node.op_type == "Size":
            value = np.array(math.prod(shape), dtype=np.int64)
        else:
            attrs = {a.name: a.i for a in node.attribute}
            value = np.array(shape[slice(attrs.get("start", 0), attrs.get("end"))],
                             dtype=np.int64)
        node.op_type = "Constant"
        del node.input[:]
        del node.attribute[:]
        node.attribute.append(onnx.helper.make_attribute(
            "value", onnx.numpy_helper.from_array(value)))
        changed = True
    return changed
