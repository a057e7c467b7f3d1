"""ONNX padding: what the rules read about a model, paddable GEMM sites, padded constants.

:class:`ModelInfo` holds the real (unpadded) shapes from ONNX shape inference, the constant
values and every tensor's users; :func:`gemm_site` finds the Conv (NCHW), Gemm and MatMul nodes
with a constant weight whose channels may be padded, or says why not. Maps are
:class:`~graphopt.rewrites.channel_map.ChannelMap` (real channel ``i`` at ``positions[i]`` of
the padded axis; ``clean`` = the padding holds exact zeros). Which ops a padded axis passes
through is :mod:`.padding_carry`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import onnx
import onnx.shape_inference
from onnx import numpy_helper

from graphopt.decisions.channel_map import ChannelMap

__all__ = ["Carry", "Cut", "Dims", "InitSink", "Lookup", "ModelInfo", "Site", "absorbs", "attr",
           "gemm_site", "scatter_axis", "scatter_weight", "subgraph_refs"]

Lookup = Callable[[str], "ChannelMap | None"]
Dims = tuple["int | str", ...]

_SKELETON_MAX = 256  # shape inference needs shape-like constants only; bigger ones become stubs


class InitSink(Protocol):
    """Where an edit puts the padded constants it creates."""

    def replace_input(self, node: onnx.NodeProto, index: int, hint: str,
                      value: np.ndarray) -> None: ...


@dataclass(frozen=True)
class Carry:
    """The op keeps the padding: its output map, why, and the edit it needs."""

    out: ChannelMap
    reason: str
    edit: Callable[[InitSink], None] | None = None


@dataclass(frozen=True)
class Cut:
    """The op would see the padding: slice its padded inputs first."""

    reason: str


def attr(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _infer(model: onnx.ModelProto) -> dict[str, Dims]:
    """Shapes of every tensor: ONNX shape inference on a weight-free skeleton of ``model``."""
    skel = onnx.ModelProto(ir_version=model.ir_version)  # no weight is copied
    skel.opset_import.extend(model.opset_import)
    skel.functions.extend(model.functions)
    src = model.graph
    skel.graph.name = src.name
    for part in ("node", "input", "output", "value_info", "sparse_initializer"):
        getattr(skel.graph, part).extend(getattr(src, part))
    for t in model.graph.initializer:
        if math.prod(t.dims) <= _SKELETON_MAX or t.data_location == onnx.TensorProto.EXTERNAL:
            skel.graph.initializer.append(t)
        else:
            stub = skel.graph.initializer.add(name=t.name, data_type=t.data_type, dims=t.dims,
                                              data_location=onnx.TensorProto.EXTERNAL)
            stub.external_data.add(key="location", value="graphopt-shape-inference-stub")
    try:
        g = onnx.shape_inference.infer_shapes(skel, check_type=False, strict_mode=False,
                                              data_prop=True).graph
    except Exception:  # the C++ inferencer raises many types: fall back to stored shapes
        g = model.graph
    shapes: dict[str, Dims] = {t.name: tuple(t.dims) for t in model.graph.initializer}
    for vi in (*g.input, *g.value_info, *g.output):
        tt = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and tt.HasField("shape"):
            shapes[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                                    for d in tt.shape.dim)
    return shapes


def subgraph_refs(node: onnx.NodeProto) -> set[str]:
    """Every tensor name read inside ``node``'s subgraphs (If/Loop/Scan bodies): an outer-scope
    tensor they read is an input no ``node.input`` lists."""
    refs: set[str] = set()
    for a in node.attribute:
        for sub in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
            for n in sub.node:
                refs.update(i for i in n.input if i)
                refs |= subgraph_refs(n)
    return refs


class ModelInfo:
    """What the rules read about a model: shapes, constant values, producers and users."""

    def __init__(self, model: onnx.ModelProto) -> None:
        g = model.graph
        self.inits = {t.name: t for t in g.initializer}
        self.graph_inputs = {i.name for i in g.input}
        self.outputs = [o.name for o in g.output]
        self.consts = {n.output[0]: n for n in g.node
                       if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and n.output}
        self.users: dict[str, list[onnx.NodeProto]] = {}
        self.implicit: set[str] = set()  # read inside subgraphs: never padded
        for n in g.node:
            for i in n.input:
                if i:
                    self.users.setdefault(i, []).append(n)
            self.implicit |= subgraph_refs(n)
        self.shapes = _infer(model)
        self._values: dict[str, np.ndarray | None] = {}

    def value(self, name: str) -> np.ndarray | None:
        """The value of a constant (an initializer no graph input overrides, or a Constant)."""
        if name not in self._values:
            v = None
            try:
                if name in self.inits and name not in self.graph_inputs:
                    v = numpy_helper.to_array(self.inits[name])
                elif name in self.consts and self.consts[name].attribute[0].name in (
                        "value", "value_float", "value_floats", "value_int", "value_ints"):
                    val = onnx.helper.get_attribute_value(self.consts[name].attribute[0])
                    v = numpy_helper.to_array(val) if isinstance(val, onnx.TensorProto) \
                        else np.asarray(val)
            except (ValueError, OSError, TypeError):  # e.g. external data that is not loaded
                v = None
            self._values[name] = v
        return self._values[name]

    def shape(self, name: str) -> Dims | None:
        return self.shapes.get(name)


@dataclass(frozen=True)
class Site:
    """A Conv (NCHW), Gemm or MatMul with a constant weight, whose channels may be padded."""

    node: onnx.NodeProto
    op: str  # "conv" | "gemm" | "matmul"
    x: str
    weight: np.ndarray
    bias: np.ndarray | None
    c_in: int
    c_out: int
    groups: int
    in_shape: Dims
    out_shape: Dims
    in_axis: int
    out_axis: int
    trans_b: bool = False

    @property
    def depthwise(self) -> bool:
        return self.groups > 1 and self.groups == self.c_in


def gemm_site(node: onnx.NodeProto, info: ModelInfo) -> Site | str | None:
    """The site of a GEMM-like node; a reason string if it cannot be padded; None if not one."""
    op = {"Conv": "conv", "Gemm": "gemm", "MatMul": "matmul"}.get(node.op_type)
    if op is None or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
        return None
    x, w_name = node.input[0], node.input[1]
    w = info.value(w_name)
    if w is None:
        return ("the weight is a graph input (overridable at run time)"
                if w_name in info.graph_inputs else "the weight is computed, not a constant")
    b_name = node.input[2] if len(node.input) > 2 and node.input[2] else None
    b = info.value(b_name) if b_name else None
    if b_name and b is None:
        return "the bias is computed, not a constant"
    in_shape, out_shape = info.shape(x), info.shape(node.output[0])
    if in_shape is None or out_shape is None or not out_shape:
        return "unknown shapes"
    if 0 in (*in_shape, *out_shape, *w.shape):
        return "a zero-size tensor: no work to speed up"
    groups, trans_b = 1, False
    if op == "conv":
        groups = int(attr(node, "group", 1))
        c_out, c_in, in_axis, out_axis = w.shape[0], w.shape[1] * groups, 1, 1
    elif w.ndim != 2:
        return f"the {node.op_type} weight is not a 2-D matrix"
    elif op == "gemm":
        trans_b = bool(attr(node, "transB", 0))
        c_out, c_in = w.shape if trans_b else w.shape[::-1]
        in_axis, out_axis = (0 if attr(node, "transA", 0) else 1), 1
    else:
        if len(in_shape) < 2:
            return "MatMul of a 1-D input"
        c_in, c_out = w.shape
        in_axis, out_axis = len(in_shape) - 1, len(out_shape) - 1
    if in_shape[in_axis] != c_in or out_shape[out_axis] != c_out:
        return "the channel dims are not static"
    return Site(node, op, x, w, b, int(c_in), int(c_out), groups, in_shape, out_shape, in_axis,
                out_axis, trans_b)


def absorbs(site: Site, cmap: ChannelMap) -> bool:
    """Can zero weights at the padding positions absorb a padded input (identity 1)?"""
    if cmap.axis != site.in_axis or site.depthwise:
        return False
    return cmap.group_block(site.groups) is not None


def scatter_axis(a: np.ndarray, axis: int, positions: Sequence[int], size: int,
                 fill: float = 0.0) -> np.ndarray:
    """``a`` with its ``axis`` spread to ``size``: slice ``i`` at ``positions[i]``, ``fill``
    elsewhere."""
    shape = list(a.shape)
    shape[axis] = size
    out = np.full(shape, fill, dtype=a.dtype)
    idx: list[Any] = [slice(None)] * a.ndim
    idx[axis] = np.asarray(positions, dtype=np.int64)
    out[tuple(idx)] = a
    return out


def scatter_weight(w: np.ndarray, groups: int, in_map: ChannelMap, out_map: ChannelMap
                   ) -> np.ndarray:
    """Weight ``[C_out, C_in/g, *k]`` at the maps' positions (per group), zero elsewhere."""
    c_out, per_in = w.shape[0], w.shape[1]
    per_out, block = c_out // groups, in_map.size // groups
    new = np.zeros((out_map.size, block, *w.shape[2:]), dtype=w.dtype)
    for j in range(groups):
        rows = np.asarray(out_map.positions[j * per_out:(j + 1) * per_out], dtype=np.int64)
        cols = np.asarray([in_map.positions[j * per_in + i] - j * block for i in range(per_in)],
                          dtype=np.int64)
        new[rows[:, None], cols[None, :]] = w[j * per_out:(j + 1) * per_out]
    return new
