"""Tensor-core padding, ONNX backend: apply the padding plan as ONNX edits.

What to pad, carry and cut is decided once on graphopt's IR (:mod:`graphopt.decisions.padding`,
read its docstring for the identity and the cases). This module describes the model to that
decision (the ONNX frontend's graph of the pass's own copy: node and tensor names are the
model's) and applies its steps: weights, biases and per-channel constants as new initializers,
per-call ``Pad``/``Gather``, and a ``Slice`` back to the real channels under the original name
wherever the real tensor is still read (:mod:`.padding_edits`).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
import onnx

from graphopt.backends.onnx.context import OnnxContext
from graphopt.backends.onnx.padding_edits import PadState, topo_order
from graphopt.decisions.padding import (
    SMALL_VALUE,
    CarryStep,
    ContextBackend,
    GemmStep,
    PadConst,
    SetGroups,
    SetShape,
    plan_padding,
    scatter_axis,
    scatter_weight,
)
from graphopt.decisions.rewrites import DryRunContext, PaddingView
from graphopt.frontends.onnx_attrs import ConstValue, const_array
from graphopt.frontends.onnx_frontend import graph_from_proto
from graphopt.ir.graph import Node
from graphopt.ir.legality import Legality
from graphopt.ir.shape_range import bind

__all__ = ["pad_channels", "padding_view"]

logger = logging.getLogger(__name__)

_VALUE_ATTRS = ("value", "value_float", "value_floats", "value_int", "value_ints")


class _Values:
    """Constant values of the model: initializers no graph input overrides, and Constants,
    decoded on demand by the frontend's ``const_array`` (never from external data)."""

    def __init__(self, model: onnx.ModelProto) -> None:
        g = model.graph
        inputs = {i.name for i in g.input}
        self.consts: dict[str, ConstValue] = {t.name: t for t in g.initializer
                                              if t.name not in inputs}
        for n in g.node:
            if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and n.output and \
                    n.attribute and n.attribute[0].name in _VALUE_ATTRS:
                val = onnx.helper.get_attribute_value(n.attribute[0])
                self.consts[n.output[0]] = val if isinstance(val, onnx.TensorProto) \
                    else np.asarray(val)

    def full(self, name: str) -> np.ndarray | None:
        return const_array(self.consts, name)

    def loaded(self, name: str) -> bool:
        """Whether constant ``name``'s values are in the model (not external data), without
        decoding them: most weights asked about are never padded."""
        t = self.consts.get(name)
        return t is not None and not (isinstance(t, onnx.TensorProto)
                                      and t.data_location == onnx.TensorProto.EXTERNAL)

    def small(self, name: str) -> np.ndarray | None:
        t = self.consts.get(name)
        if isinstance(t, onnx.TensorProto) and math.prod(t.dims) > SMALL_VALUE:
            return None
        return self.full(name)


@dataclass
class _Backend(ContextBackend):
    """What the padding decision asks of the ONNX backend (decisions land on ``ctx``)."""

    values: _Values

    def can_edit(self, node: Node) -> Legality:
        proto = self.nodes.get(node.name)
        if proto is None:
            return Legality.no("the node is not in the model under its planned name")
        if proto.domain not in ("", "ai.onnx"):
            return Legality.no(f"{proto.domain}::{proto.op_type} is a custom-domain op the ONNX "
                               "backend does not rewrite")
        if node.op_type == "Attention":
            return Legality.no("the ONNX backend does not rewrite attention nodes")
        if node.op_type in ("Conv", "ConvTranspose", "Gemm", "MatMul") and \
                not self.values.loaded(node.inputs[1]):
            return Legality.no("the weight's values are not loaded (external data)")
        return Legality.OK


def _weight(values: _Values, step: GemmStep) -> np.ndarray:
    """The weight placed at the maps' positions, in the layout the node stores it."""
    site, in_map, out = step.site, step.inp.reads, step.out
    w = values.full(site.weight)
    assert w is not None
    if site.w_layout == "out_in":
        return scatter_weight(w, site.groups, in_map, out, np)
    # a [K, N] matrix, or a ConvTranspose [C_in, C_out/g, *k] (groups 1)
    return np.ascontiguousarray(np.swapaxes(
        scatter_weight(np.swapaxes(w, 0, 1), 1, in_map, out, np), 0, 1))


def _gemm(st: PadState, nodes: dict[str, onnx.NodeProto], values: _Values,
          step: GemmStep) -> None:
    site, inp, out = step.site, step.inp, step.out
    node = nodes[site.node.name]
    if inp.action == "pad":
        assert inp.src is not None
        x = st.names[site.x] if inp.from_padded else site.x
        node.input[0] = st.pad_per_call(x, len(site.in_shape), inp.src, inp.reads, node)
    elif inp.from_padded:
        node.input[0] = st.names[site.x]
    if inp.reads.is_padded or out.is_padded:
        st.replace_input(node, 1, f"{node.name}_weight", _weight(values, step))
        b = values.full(site.bias) if site.bias else None
        if b is not None and out.is_padded and site.bias_per_channel:
            st.replace_input(node, 2, f"{node.name}_bias", scatter_axis(
                b, b.ndim - 1, out.positions, out.size, 0.0, np))
    if out.is_padded:
        st.set_padded(node, out)


def _carry(st: PadState, nodes: dict[str, onnx.NodeProto], values: _Values,
           step: CarryStep) -> None:
    node = nodes[step.node.name]
    st.read_padded(node)
    for edit in step.edits:
        if isinstance(edit, PadConst):
            v = values.full(edit.tensor)
            assert v is not None
            i = list(node.input).index(edit.tensor)
            st.replace_input(node, i, f"{node.name}_pad{i}", scatter_axis(
                v, edit.axis, edit.positions, edit.size, edit.fill, np))
        elif isinstance(edit, SetShape):
            spec = values.full(node.input[1])
            assert spec is not None
            spec = spec.astype(np.int64).copy()
            spec[edit.axis] = edit.size
            st.replace_input(node, 1, f"{node.name}_shape", spec)
        elif isinstance(edit, SetGroups):
            for a in node.attribute:
                if a.name == "group":
                    a.i = edit.groups
    st.set_padded(node, step.out)


def pad_channels(model: onnx.ModelProto, ctx: OnnxContext) -> onnx.ModelProto | None:
    """Pad GEMM-like channels to tensor-core multiples where the plan says it pays.

    Returns a new model, or None when nothing was padded; ``model`` is never modified.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    available = {t.name for t in g.initializer} | {i.name for i in g.input}
    order = topo_order(list(g.node), available)
    del g.node[:]
    g.node.extend(order)
    if ctx.graph is not None and ctx.graph.source_model is model:
        graph = ctx.graph  # the model the plan was built from: same names, same shapes
    else:
        # names unnamed nodes in ``out``, never in ``model``; sized like the plan
        graph = bind(graph_from_proto(out), ctx.dim_values)
    nodes = {n.name: n for n in g.node}
    values = _Values(out)
    plan = plan_padding(graph, values.small, _Backend(ctx, nodes, values), ctx.options)
    ctx.notes["padding"] = plan.notes(ctx.options.pad, ctx.compute_dtype).to_json()
    if not plan.steps:
        return None
    st = PadState(out, {o for n in g.node for o in (*n.output, n.name)} | available)
    for step in plan.steps:
        if isinstance(step, GemmStep):
            _gemm(st, nodes, values, step)
        elif isinstance(step, CarryStep):
            _carry(st, nodes, values, step)
    st.finish()
    logger.info("padding: %d nodes padded, %d carried, %d slices, %d per-call pads",
                len(plan.padded), plan.carried, len(plan.slices), len(plan.pads))
    return out


def padding_view(model: onnx.ModelProto, ctx: DryRunContext) -> PaddingView:
    """What :func:`pad_channels` tells the padding decision, for ``model`` as the frontend
    loaded it (``graphopt.plan``'s dry run: node names are the plan's)."""
    values = _Values(model)
    return PaddingView(_Backend(ctx, {n.name: n for n in model.graph.node}, values),
                       values.small)
