"""Fold small constant subgraphs of an ONNX model, so that shape inference sees their values.

torch's TorchScript exporter computes ``F.pad`` amounts with Constant -> ConstantOfShape -> Concat
-> Reshape -> Slice -> Transpose -> Reshape -> Cast into Pad's ``pads``; ONNX shape inference
(``data_prop`` included) cannot see through that chain, so every tensor after the Pad gets
symbolic dims and the planner costs the model with them as 1. The chain is constant: evaluating
it once gives the pads, and the shapes after the Pad become static.

:func:`fold_constants` folds (numbered cases, referred to in the code):

1. a node of the default domain whose every input is a constant: an initializer with data that
   no graph input overrides, a ``Constant`` node's output, or an output folded before (case 2);
2. in topological order, so chains fold wave by wave; each folded node becomes initializers
   holding its outputs.

It does not fold (the node stays as it is):

a. random ops, ``Constant`` itself, nodes with graph attributes, custom domains, nodes without
   inputs, nodes that write a graph output;
b. tensors over ``max_elements`` elements, in or out (an output's size is known from shape
   inference before anything is evaluated), dtypes numpy does not hold natively (bf16, fp8...);
c. nodes that ONNX's reference evaluator fails on, or hits a numpy floating-point error in
   (log(0), an inf cast to int: a value the runtime may not agree on), or whose result is not
   the dtype and shape ONNX type inference gives.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import numpy as np
import onnx
import onnx.shape_inference
from onnx import helper, numpy_helper

__all__ = ["MAX_ELEMENTS", "fold_constants"]

logger = logging.getLogger(__name__)

_T = onnx.TensorProto
_A = onnx.AttributeProto

#: Shape-like values are a few elements (pads of a 5-D tensor: 10); 1024 keeps weights out.
MAX_ELEMENTS = 1024

_RANDOM = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                     "Multinomial", "Bernoulli", "Dropout"})
# Dtypes numpy holds natively: results round-trip through numpy_helper exactly.
_DTYPES = frozenset({_T.FLOAT, _T.DOUBLE, _T.FLOAT16, _T.BOOL, _T.INT8, _T.INT16, _T.INT32,
                     _T.INT64, _T.UINT8, _T.UINT16, _T.UINT32, _T.UINT64})

_Value = onnx.TensorProto  # a constant, named as the tensor it holds


def fold_constants(model: onnx.ModelProto, max_elements: int = MAX_ELEMENTS
                   ) -> dict[str, np.ndarray]:
    """Fold ``model``'s small constant subgraphs in place; returns the folded outputs' values.

    In place because the caller (the frontend's shape-inference skeleton) owns ``model``; copy
    first to keep the original. Remaining nodes keep their names and order.
    """
    g = model.graph
    inputs = {i.name for i in g.input}
    named = {t.name for t in g.initializer if t.name not in inputs}
    named |= {n.output[0] for n in g.node if n.op_type == "Constant" and n.output}
    if not any(n.input and all(t in named for t in n.input if t) and n.op_type != "Constant"
               for n in g.node):
        return {}  # no node reads only constants: nothing to fold (most models), and cheap
    known = _constants(g, max_elements)
    outputs = {o.name for o in g.output}
    pending = [i for i, n in enumerate(g.node) if _foldable(n, outputs)]  # case a
    if not pending:
        return {}
    opsets = [o for o in model.opset_import if o.domain in ("", "ai.onnx")]
    folded: dict[str, np.ndarray] = {}
    done: set[int] = set()
    while pending:  # case 2: one wave per chain step
        wave = [i for i in pending if all(t in known for t in g.node[i].input if t)]
        if not wave:
            break
        pending = [i for i in pending if i not in set(wave)]
        values = _evaluate([g.node[i] for i in wave], known, model.ir_version, opsets,
                           max_elements)
        for i in wave:
            names = [o for o in g.node[i].output if o]
            if all(o in values for o in names):
                done.add(i)
                for o in names:
                    folded[o] = values[o]
                    known[o] = numpy_helper.from_array(values[o], o)
    if not done:
        return {}
    kept = [n for i, n in enumerate(g.node) if i not in done]
    del g.node[:]
    g.node.extend(kept)
    g.initializer.extend(known[o] for o in folded)
    logger.debug("folded %d constant node(s) into %d initializer(s)", len(done), len(folded))
    return folded


def _constants(g: onnx.GraphProto, max_elements: int) -> dict[str, _Value]:
    """Case 1's constants: small initializers with data no input overrides, Constant values."""
    inputs = {i.name for i in g.input}
    known: dict[str, _Value] = {}
    for t in g.initializer:
        if t.name not in inputs and _small(t, max_elements):
            known[t.name] = t
    for n in g.node:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and len(n.output) == 1:
            t = _constant_tensor(n)
            if t is not None and _small(t, max_elements):
                known[n.output[0]] = t
    return known


def _small(t: onnx.TensorProto, max_elements: int) -> bool:
    return (t.data_location != _T.EXTERNAL and t.data_type in _DTYPES
            and math.prod(t.dims) <= max_elements)


def _constant_tensor(node: onnx.NodeProto) -> onnx.TensorProto | None:
    """A ``Constant`` node's value as a tensor named like its output; None for sparse/strings."""
    for a in node.attribute:
        if a.name == "value":
            t = onnx.TensorProto()
            t.CopyFrom(a.t)
            t.name = node.output[0]
            return t
        if a.name in ("value_float", "value_floats", "value_int", "value_ints"):
            arr = np.asarray(helper.get_attribute_value(a),
                             dtype=np.float32 if "float" in a.name else np.int64)
            return numpy_helper.from_array(arr, node.output[0])
    return None


def _foldable(node: onnx.NodeProto, graph_outputs: set[str]) -> bool:
    return (node.domain in ("", "ai.onnx") and node.op_type != "Constant"
            and node.op_type not in _RANDOM and any(node.input) and any(node.output)
            and not any(a.type in (_A.GRAPH, _A.GRAPHS) for a in node.attribute)
            and not any(o in graph_outputs for o in node.output))


def _evaluate(nodes: Sequence[onnx.NodeProto], known: dict[str, _Value], ir_version: int,
              opsets: Sequence[onnx.OperatorSetIdProto], max_elements: int,
              split: bool = True) -> dict[str, np.ndarray]:
    """Values of ``nodes``' outputs that pass cases b and c; one model for the whole wave.

    If the wave fails as a whole, each node is tried alone so that one bad node (case c)
    does not keep the others from folding.
    """
    try:
        types = _output_types(nodes, known, ir_version, opsets)
        ok = [n for n in nodes if all(_fits(types.get(o), max_elements) for o in n.output if o)]
        if not ok:
            return {}
        from onnx.reference import ReferenceEvaluator  # only when there is something to fold

        names = [o for n in ok for o in n.output if o]
        model = _model(ok, known, ir_version, opsets)
        with np.errstate(divide="raise", over="raise", invalid="raise"):  # case c: log(0)...
            results = dict(zip(names, ReferenceEvaluator(model).run(names, {}), strict=True))
    except Exception:  # the evaluator and inference raise many types; a failure folds nothing
        if split and len(nodes) > 1:
            return {k: v for n in nodes
                    for k, v in _evaluate([n], known, ir_version, opsets, max_elements,
                                          split=False).items()}
        return {}
    out: dict[str, np.ndarray] = {}
    for n in ok:
        names = [o for o in n.output if o]
        if all(_matches(results[o], types[o]) for o in names):  # case c
            out.update((o, results[o]) for o in names)
    return out


def _model(nodes: Sequence[onnx.NodeProto], known: dict[str, _Value], ir_version: int,
           opsets: Sequence[onnx.OperatorSetIdProto]) -> onnx.ModelProto:
    """A model of ``nodes`` alone, their constant inputs as initializers."""
    inputs = dict.fromkeys(t for n in nodes for t in n.input if t)
    outs = [helper.make_value_info(o, onnx.TypeProto()) for n in nodes for o in n.output if o]
    graph = helper.make_graph(list(nodes), "fold", [], outs,
                              initializer=[known[t] for t in inputs if t in known])
    return helper.make_model(graph, ir_version=max(ir_version, 4), opset_imports=list(opsets))


def _output_types(nodes: Sequence[onnx.NodeProto], known: dict[str, _Value], ir_version: int,
                  opsets: Sequence[onnx.OperatorSetIdProto]) -> dict[str, onnx.TypeProto]:
    """Output types by ONNX inference, before evaluating: a huge output is never computed."""
    inferred = onnx.shape_inference.infer_shapes(_model(nodes, known, ir_version, opsets),
                                                 strict_mode=False, data_prop=True)
    return {vi.name: vi.type for vi in (*inferred.graph.output, *inferred.graph.value_info)}


def _fits(tp: onnx.TypeProto | None, max_elements: int) -> bool:
    """Case b: a known native dtype and a static shape of at most ``max_elements``."""
    if tp is None or not tp.HasField("tensor_type"):
        return False
    tt = tp.tensor_type
    if tt.elem_type not in _DTYPES or not tt.HasField("shape"):
        return False
    dims = tt.shape.dim
    return (all(d.HasField("dim_value") for d in dims)
            and math.prod(d.dim_value for d in dims) <= max_elements)


def _matches(value: object, tp: onnx.TypeProto) -> bool:
    """Case c: the evaluator's result has the dtype and shape inference promised."""
    tt = tp.tensor_type
    return (isinstance(value, np.ndarray)
            and value.dtype == helper.tensor_dtype_to_np_dtype(tt.elem_type)
            and value.shape == tuple(d.dim_value for d in tt.shape.dim))
