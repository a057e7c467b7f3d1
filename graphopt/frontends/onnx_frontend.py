"""ONNX frontend: an ONNX file or ``ModelProto`` becomes a graphopt
:class:`~graphopt.ir.graph.Graph`.

Steps: read without trusting the file (:mod:`.onnx_safety`); check the graph and put its nodes
in topological order; infer shapes on a weight-free skeleton (a model of any size stays under
protobuf's 2 GB limit and weights are never serialized twice) whose small constant subgraphs are
folded first (:mod:`.onnx_fold`); then the tensor table and the nodes
with canonical op names and the attributes the analysis reads made explicit (:mod:`.onnx_attrs`).

Tensor kinds, the param/constant rule: an initializer, or the value of a ``Constant`` node, is a
``param`` when it holds more than one element of a floating or low-bit integer dtype (fp64 ... fp4,
int8, uint8, int4, uint4: weights, quantized ones included); everything else (scalars, int16/32/64
shape, axes and index tensors, bool masks, strings, unknown dtypes) is a ``constant``. As
:mod:`graphopt.ir.graph` asks, ``Constant`` nodes become tensors, not nodes.

The user's ``ModelProto`` is never modified: the frontend works on a copy, which becomes
``Graph.source_model`` with external data loaded, local functions inlined and every node named
as in the ``Graph`` (unnamed or duplicate names get ``f"{op_type}_{index}"``).

Constant folding happens in the skeleton only, never in the copy: the folded chain's nodes stay
in the ``Graph`` (with static shapes, their values known to the analysis) and in
``source_model``, so graphopt's evaluator can change shapes the planner sees but never the
numbers of a model it writes, nor the reference the optimize pipeline checks against (it runs
``source_model``); node indices, and so the names of unnamed nodes, stay those of the file.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.inliner
import onnx.shape_inference
from onnx import helper

from graphopt.errors import GraphoptError, ModelLoadError
from graphopt.frontends.onnx_attrs import ConstValue, attr_value, fill_defaults
from graphopt.frontends.onnx_bodies import control_flow_bodies
from graphopt.frontends.onnx_fold import fold_constants
from graphopt.frontends.onnx_normalize import free_negative_dims, weights_as_initializers
from graphopt.frontends.onnx_safety import (
    check_structure,
    load_external_data,
    read_model,
    uses_external_data,
)
from graphopt.frontends.onnx_symbolic import sharpen, skeleton
from graphopt.frontends.onnx_upgrade import upgrade
from graphopt.ir.graph import Graph, Node, TensorInfo, TensorKind
from graphopt.ir.ops import KNOWN_OPS
from graphopt.ir.order import stable_topo_order

__all__ = ["ONNX_DTYPES", "load_onnx"]

logger = logging.getLogger(__name__)

_T = onnx.TensorProto
_A = onnx.AttributeProto

#: ONNX ``TensorProto`` data type -> canonical dtype name (:data:`graphopt.ir.graph.DTYPE_BITS`).
ONNX_DTYPES: dict[int, str] = {
    _T.FLOAT: "fp32", _T.FLOAT16: "fp16", _T.BFLOAT16: "bf16", _T.DOUBLE: "fp64",
    _T.FLOAT8E4M3FN: "fp8_e4m3", _T.FLOAT8E4M3FNUZ: "fp8_e4m3", _T.FLOAT8E5M2: "fp8_e5m2",
    _T.FLOAT8E5M2FNUZ: "fp8_e5m2", _T.FLOAT4E2M1: "fp4", _T.INT8: "int8", _T.UINT8: "uint8",
    _T.INT4: "int4", _T.UINT4: "uint4", _T.INT16: "int16", _T.INT32: "int32", _T.INT64: "int64",
    _T.BOOL: "bool", _T.STRING: "string", _T.COMPLEX64: "complex64", _T.COMPLEX128: "complex128",
}
_WEIGHT_DTYPES = frozenset({"fp64", "fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "fp4",
                            "int8", "uint8", "int4", "uint4"})

_CHECK_FIX = ("the graph is invalid: run onnx.checker.check_model(path, full_check=True) to see "
              "where, then re-export the model")

# Renames into the canonical vocabulary; the contrib op keeps its attributes (transA, transB...).
_RENAMES = {"FusedMatMul": "MatMul", "SimplifiedLayerNormalization": "RMSNormalization"}
_CONTRIB_DOMAINS = frozenset({"com.microsoft"})
# The ai.onnx ops with graph attributes; custom-domain ops (e.g. BeamSearch) are checked too.
_CONTROL_FLOW = frozenset({"If", "Loop", "Scan", "SequenceMap"})

Shape = tuple[int | str, ...]


def load_onnx(model: str | os.PathLike[str] | onnx.ModelProto, *,
              base_dir: str | os.PathLike[str] | None = None) -> Graph:
    """Load an ONNX model as a :class:`Graph`; the user's ModelProto and files stay untouched.

    Args:
        model: path of a ``.onnx`` file, or a ``ModelProto``.
        base_dir: folder of the external data; defaults to the model file's folder. A
            ``ModelProto`` with unloaded external data and no ``base_dir`` keeps it on disk.

    Raises:
        ModelLoadError: the file is missing, empty, corrupt, too old (opset < 13) or invalid.
        UnsafePathError: external data points outside the model's folder.
    """
    start = time.perf_counter()
    warnings: list[str] = []
    if isinstance(model, onnx.ModelProto):
        proto = onnx.ModelProto()
        proto.CopyFrom(model)
        check_structure(proto, "the given ModelProto")
        name, folder = proto.graph.name or "model", base_dir
    elif isinstance(model, (str, os.PathLike)):
        path = Path(model)
        proto = read_model(path)
        name, folder = proto.graph.name or path.stem, base_dir or path.parent
    else:
        raise ModelLoadError(f"load_onnx takes a path or an onnx.ModelProto, not "
                             f"{type(model).__name__}", fix="pass the .onnx file's path")
    try:
        if uses_external_data(proto):
            if folder is None:
                warnings.append("external data not loaded (a ModelProto without base_dir): "
                                "weights have shapes but no values")
            else:
                load_external_data(proto, folder)
        proto = upgrade(proto, warnings)
        if len(proto.functions):
            proto = _inline_functions(proto, warnings)
        if free_negative_dims(proto):
            warnings.append("-1 dims read as free (symbolic) dims, as ONNX Runtime runs them")
        graph = _build(proto, name, warnings)
        weights_as_initializers(proto, _is_weight)  # after _build named the nodes
    except GraphoptError:
        raise
    except Exception as exc:  # a malformed proto must end as a GraphoptError, not a traceback
        raise ModelLoadError(f"could not read the graph of {name!r}: {type(exc).__name__}: "
                             f"{str(exc)[:200]}",
                             fix="check the model with onnx.checker.check_model(path, "
                                 "full_check=True); if it passes, report a graphopt bug") from exc
    logger.info("loaded ONNX model %r: %d nodes, %d tensors in %.2fs", graph.name, len(graph),
                len(graph.tensors), time.perf_counter() - start)
    return graph


def _inline_functions(proto: onnx.ModelProto, warnings: list[str]) -> onnx.ModelProto:
    """Inline model-local functions so their bodies are analysed like any other node."""
    try:
        return onnx.inliner.inline_local_functions(proto)
    except Exception as exc:  # an inliner failure must not stop the load
        warnings.append(f"model-local functions were not inlined ({type(exc).__name__}: "
                        f"{str(exc)[:200]}); calls to them are not analysed")
        return proto


def _infer_shapes(model: onnx.ModelProto, order: list[int], warnings: list[str]
                  ) -> tuple[onnx.GraphProto, dict[str, np.ndarray]]:
    """The inferred graph, and the values of the nodes folded in the skeleton."""
    skel = skeleton(model, order)
    try:
        folded = fold_constants(skel)
    except Exception as exc:  # folding only sharpens shapes; a failure must not stop the load
        logger.debug("constant folding skipped: %s: %s", type(exc).__name__, exc)
        folded = {}
    try:
        inferred = onnx.shape_inference.infer_shapes(
            skel, check_type=False, strict_mode=False, data_prop=True).graph
    except Exception as exc:  # the C++ inferencer raises many types; fall back, never crash
        warnings.append(f"ONNX shape inference failed ({type(exc).__name__}: {str(exc)[:200]});"
                        " only the shapes stored in the model are known")
        inferred = model.graph
    better = sharpen(skel, inferred, warnings)  # sizes computed from the inputs' shapes
    if better:
        kept = [vi for vi in inferred.value_info if vi.name not in better]
        del inferred.value_info[:]
        inferred.value_info.extend([*kept, *better.values()])
    return inferred, folded


def _type_info(tp: onnx.TypeProto) -> tuple[Shape | None, str | None]:
    """Shape and dtype of a tensor type; a dim is its value, its symbol, or "?" if neither."""
    if tp.HasField("tensor_type"):
        tt = tp.tensor_type
    elif tp.HasField("sparse_tensor_type"):
        tt = tp.sparse_tensor_type
    else:
        return None, None  # sequences, maps, optionals: no tensor shape to give
    dtype = ONNX_DTYPES.get(tt.elem_type)
    if not tt.HasField("shape"):
        return None, dtype
    return tuple([d.dim_value if d.HasField("dim_value") and d.dim_value >= 0
                  else (d.dim_param or "?") for d in tt.shape.dim]), dtype


def _value_kind(dtype: str | None, shape: Shape) -> TensorKind:
    numel = math.prod(d if isinstance(d, int) else 1 for d in shape)
    return "param" if dtype in _WEIGHT_DTYPES and numel > 1 else "constant"


def _is_weight(t: onnx.TensorProto) -> bool:
    """A ``Constant`` node's tensor that the param rule calls a weight."""
    dtype = ONNX_DTYPES.get(t.data_type)
    return _value_kind(dtype, tuple(t.dims)) == "param"


def _constant_value(node: onnx.NodeProto) -> tuple[Shape | None, str | None, ConstValue | None]:
    """Shape, dtype and value of a ``Constant`` node, from whichever value attribute it has."""
    for a in node.attribute:
        if a.name == "value":
            return tuple(a.t.dims), ONNX_DTYPES.get(a.t.data_type), a.t
        if a.name == "sparse_value":
            sp = a.sparse_tensor
            return tuple(sp.dims), ONNX_DTYPES.get(sp.values.data_type), None
        if a.name in ("value_float", "value_floats", "value_int", "value_ints"):
            arr = np.asarray(attr_value(a),
                             dtype=np.float32 if "float" in a.name else np.int64)
            return arr.shape, "fp32" if "float" in a.name else "int64", arr
        if a.name in ("value_string", "value_strings"):
            return (() if a.name == "value_string" else (len(a.strings),)), "string", None
    return None, None, None


def _topo_order(nodes: Any, ins: list[list[str]], outs: list[list[str]],
                available: set[str]) -> list[int]:
    """Node indices in topological order: the file's order when valid, else a stable sort.

    ``ins``/``outs`` are the nodes' tensor names as Python lists, read from the protos once.
    """
    producer: dict[str, int] = {}
    for i, names in enumerate(outs):
        for out in names:
            if not out:
                continue
            if out in producer or out in available:
                raise ModelLoadError(f"tensor {out!r} is written twice (node {i}, "
                                     f"{nodes[i].op_type})", fix=_CHECK_FIX)
            producer[out] = i
    in_order = True
    for i, names in enumerate(ins):
        for t in names:
            if t and t not in available:
                p = producer.get(t)
                if p is None:
                    raise ModelLoadError(
                        f"node {nodes[i].name or i!r} ({nodes[i].op_type}) reads {t!r}, which no "
                        f"node, graph input or initializer provides", fix=_CHECK_FIX)
                in_order = in_order and p < i
    if in_order:
        return list(range(len(ins)))
    order = stable_topo_order([{producer[t] for t in names if t and t not in available}
                               for names in ins])
    if len(order) < len(ins):
        raise ModelLoadError(f"the graph has a cycle through {len(ins) - len(order)} node(s)",
                             fix=_CHECK_FIX)
    return order


def _node_names(nodes: Any) -> list[str]:
    """Unique names, by file index: the ONNX name when unique and non-empty, else op_index."""
    counts = Counter(n.name for n in nodes)
    used = {name for name, c in counts.items() if name and c == 1}
    names: list[str] = []
    for i, n in enumerate(nodes):
        if n.name and counts[n.name] == 1:
            names.append(n.name)
            continue
        base = name = f"{n.op_type}_{i}"
        k = 0
        while name in used:
            k += 1
            name = f"{base}_{k}"
        used.add(name)
        names.append(name)
    return names


def _canonical_op(domain: str, op: str) -> tuple[str, str]:
    """(op_type, source_op): ONNX names stay, contrib ops map when ops.py knows them."""
    if not domain:
        return _RENAMES.get(op, op), op
    source = f"{domain}::{op}"
    canonical = _RENAMES.get(op, op)
    if domain in _CONTRIB_DOMAINS and canonical in KNOWN_OPS:
        return canonical, source
    return source, source


def _build(proto: onnx.ModelProto, name: str, warnings: list[str]) -> Graph:
    g = proto.graph
    tensors: dict[str, TensorInfo] = {}
    consts: dict[str, ConstValue] = {}
    for t in g.initializer:
        shape, dtype = tuple(t.dims), ONNX_DTYPES.get(t.data_type)
        tensors[t.name] = TensorInfo(t.name, shape, dtype, _value_kind(dtype, shape))
        consts[t.name] = t
    for sp in g.sparse_initializer:
        shape, dtype = tuple(sp.dims), ONNX_DTYPES.get(sp.values.data_type)
        tensors[sp.values.name] = TensorInfo(sp.values.name, shape, dtype,
                                             _value_kind(dtype, shape))
    inputs: list[str] = []
    for vi in g.input:
        if vi.name not in tensors:  # old exports also list initializers as inputs
            tensors[vi.name] = TensorInfo(vi.name, *_type_info(vi.type), kind="input")
            inputs.append(vi.name)
    ins = [list(n.input) for n in g.node]
    outs = [list(n.output) for n in g.node]
    order = _topo_order(g.node, ins, outs, set(tensors))
    if order != sorted(order):
        warnings.append("the nodes were not in topological order; graphopt sorted them")
    inferred, folded = _infer_shapes(proto, order, warnings)
    infos = {vi.name: vi for group in (inferred.value_info, inferred.output, inferred.input)
             for vi in group}
    for out, value in folded.items():  # initializers in the skeleton: no inferred value_info
        infos[out] = helper.make_tensor_value_info(
            out, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape)
        consts.setdefault(out, value)
    names = _node_names(g.node)
    notes: dict[str, list[str]] = {}
    custom: Counter[str] = Counter()
    nodes: list[Node] = []
    for idx in order:
        onode = g.node[idx]
        if onode.name != names[idx]:
            onode.name = names[idx]  # our copy: rewrites find Graph nodes by name in source_model
        domain = "" if onode.domain in ("", "ai.onnx") else onode.domain
        if not domain and onode.op_type == "Constant" and outs[idx]:
            shape, dtype, value = _constant_value(onode)
            out = outs[idx][0]
            kind = "constant" if shape is None else _value_kind(dtype, shape)
            tensors[out] = TensorInfo(out, shape, dtype, kind)
            if value is not None:
                consts[out] = value
            continue
        op_type, source_op = _canonical_op(domain, onode.op_type)
        if domain and op_type == source_op:
            custom[source_op] += 1
        attrs = {a.name: attr_value(a) for a in onode.attribute}
        if (domain or onode.op_type in _CONTROL_FLOW) and any(
                a.type in (_A.GRAPH, _A.GRAPHS) for a in onode.attribute):
            bodies = control_flow_bodies(proto, onode, names[idx], infos, consts, _build,
                                         warnings)
            if bodies is None:
                notes.setdefault("control-flow subgraphs are not analysed", []).append(names[idx])
            else:
                attrs.update(bodies)  # If/Loop/Scan: bodies built and analysed like any graph
        node = Node(names[idx], op_type, source_op, ins[idx], outs[idx], attrs)
        for out in node.outputs:
            if out:
                vi = infos.get(out)
                shape, dtype = _type_info(vi.type) if vi is not None else (None, None)
                tensors[out] = TensorInfo(out, shape, dtype, "activation")
        fill_defaults(node, tensors, consts, notes)
        nodes.append(node)
    outputs = [o.name for o in g.output]
    for out in outputs:
        if out not in tensors:
            raise ModelLoadError(f"graph output {out!r} is produced by no node", fix=_CHECK_FIX)
    for what, who in notes.items():
        more = f" and {len(who) - 5} more" if len(who) > 5 else ""
        warnings.append(f"{what}: {', '.join(who[:5])}{more}")
    if custom:
        listed = ", ".join(f"{op} (x{n})" for op, n in custom.most_common(10))
        warnings.append(f"custom-domain ops kept as they are, not analysed: {listed}")
    return Graph(name=name, source="onnx", nodes=nodes, tensors=tensors, inputs=inputs,
                 outputs=outputs, warnings=warnings, source_model=proto)


def graph_from_proto(proto: onnx.ModelProto) -> Graph:
    """The graph of a model graphopt already loaded and owns (a rewrite's private copy).

    No copy, no safety checks: unnamed nodes are named in ``proto`` itself, so the rewrite
    finds every graph node by name.
    """
    return _build(proto, proto.graph.name or "model", [])
