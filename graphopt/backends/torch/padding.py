"""Tensor-core padding, torch backend: apply the padding plan as fx edits.

What to pad, carry and cut is decided once on graphopt's IR (:mod:`graphopt.decisions.padding`,
read its docstring for the identity and the cases). This module describes the current fx graph
to that decision (``graph_from_graph_module``: fx node names are IR node and tensor names) and
applies its steps: weights and per-channel constants placed at the maps' positions, per-call
pads, slices back to the real channels. Any reader of a padded tensor that no step says reads
it padded gets the real channels back, so the applied graph computes what the original did.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial

import numpy as np
import torch
from torch import fx

from graphopt.backends.torch.cleanup_view import cleaned_graph
from graphopt.backends.torch.context import RewriteContext
from graphopt.backends.torch.fx_utils import aten_name, get_tensor, new_param
from graphopt.backends.torch.padding_edits import PadState, pad_per_call, refresh_meta, slice_real
from graphopt.decisions.padding import (
    SMALL_VALUE,
    AttentionStep,
    CarryStep,
    ChannelMap,
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
from graphopt.frontends.torch_frontend import graph_from_graph_module
from graphopt.ir.graph import Graph, Node
from graphopt.ir.legality import Legality
from graphopt.ir.shape_range import bind

__all__ = ["pad_channels", "padding_view"]

logger = logging.getLogger(__name__)

#: fx argument index of the IR inputs (x, weight, bias) of each op the backend rewrites
_ARGS = {**{op: (0, 1, 2) for op in ("linear", "conv1d", "conv2d", "conv3d",
                                      "conv_transpose1d", "conv_transpose2d",
                                      "conv_transpose3d")},
         "addmm": (1, 2, 0), "mm": (0, 1, -1), "matmul": (0, 1, -1)}


@dataclass
class _Backend(ContextBackend):
    """What the padding decision asks of the torch backend (decisions land on ``ctx``);
    ``tensor`` gives the real tensor behind a parameter or constant node."""

    tensor: Callable[[fx.Node | None], torch.Tensor | None]

    def can_edit(self, node: Node) -> Legality:
        fx_node = self.nodes.get(node.name)
        if fx_node is None:
            return Legality.no("the op sits inside a wrapped subgraph the torch backend does "
                               "not rewrite")
        name = aten_name(fx_node)
        if node.op_type == "Attention":
            return Legality.OK if name == "scaled_dot_product_attention" else Legality.no(
                f"the torch backend rewrites scaled_dot_product_attention, not {name}")
        if node.op_type in ("Conv", "ConvTranspose", "Linear", "Gemm", "MatMul") and (
                name not in _ARGS or (name == "addmm" and (
                    fx_node.kwargs.get("alpha", 1) != 1 or fx_node.kwargs.get("beta", 1) != 1))):
            return Legality.no("the torch backend rewrites linear, addmm, mm and conv weights, "
                               f"not {name}")
        return Legality.OK

    def value(self, tensor: str) -> np.ndarray | None:
        t = self.tensor(self.nodes.get(tensor))
        if t is None or t.numel() > SMALL_VALUE or t.is_complex():
            return None
        return t.detach().to(torch.float64).numpy()


@dataclass
class _Apply:
    """The fx edits of one plan; ``readers[n]`` are the padded inputs ``n`` reads as padded."""

    st: PadState
    nodes: dict[str, fx.Node]
    readers: dict[fx.Node, set[fx.Node]] = field(default_factory=dict)

    def fx(self, name: str) -> fx.Node:
        return self.nodes[name]

    def reads(self, node: fx.Node, src: fx.Node) -> None:
        self.readers.setdefault(node, set()).add(src)

    def set_map(self, tensor: str, cmap: ChannelMap) -> None:
        self.st.maps[self.fx(tensor)] = cmap
        self.st.changed = True


def _gemm(ap: _Apply, step: GemmStep) -> None:
    st, site, inp, out = ap.st, step.site, step.inp, step.out
    node, x = ap.fx(site.node.name), ap.fx(site.x)
    i_x, i_w, i_b = _ARGS[aten_name(node) or ""]
    if inp.action == "pad":
        assert inp.src is not None
        base = x
        if not inp.from_padded and x in st.maps:
            base = slice_real(st, x, node)
        padded = pad_per_call(st, base, inp.src, inp.reads, node)
        if inp.from_padded:
            ap.reads(padded, x)
        node.update_arg(i_x, padded)
    elif inp.from_padded:
        ap.reads(node, x)
    in_map = inp.reads
    if in_map.is_padded or out.is_padded:
        w = get_tensor(st.gm, ap.fx(site.weight))
        assert w is not None
        w = w.detach()
        if site.w_layout == "in_out":  # [K, N], or ConvTranspose [C_in, C_out/g, *k]
            new_w = scatter_weight(w.transpose(0, 1), 1, in_map, out, torch).transpose(0, 1)
        else:
            new_w = scatter_weight(w, site.groups, in_map, out, torch)
        node.update_arg(i_w, new_param(st.gm, f"{node.name}_weight", new_w.contiguous(), node))
        b = get_tensor(st.gm, ap.fx(site.bias)) if site.bias else None
        if b is not None and out.is_padded and site.bias_per_channel:
            node.update_arg(i_b, new_param(st.gm, f"{node.name}_bias", scatter_axis(
                b.detach(), b.dim() - 1, out.positions, out.size, 0.0, torch), node))
        st.changed = True
    if out.is_padded:
        ap.set_map(site.node.outputs[0], out)


def _carry(ap: _Apply, step: CarryStep) -> None:
    st, node = ap.st, ap.fx(step.node.name)
    for inp in node.all_input_nodes:
        if inp in st.maps:
            ap.reads(node, inp)
    for edit in step.edits:
        if isinstance(edit, PadConst):
            const = ap.fx(edit.tensor)
            t = get_tensor(st.gm, const)
            assert t is not None
            new = scatter_axis(t.detach(), edit.axis, edit.positions, edit.size, edit.fill,
                               torch)
            node.replace_input_with(const, new_param(st.gm, f"{node.name}_const", new, node))
        elif isinstance(edit, SetShape):
            sizes = list(node.args[1])
            sizes[edit.axis] = edit.size
            node.args = (node.args[0], sizes, *node.args[2:])
        elif isinstance(edit, SetGroups):
            args = list(node.args) + [None] * (7 - len(node.args))
            for i, default in ((3, 1), (4, 0), (5, 1)):
                args[i] = default if args[i] is None else args[i]
            args[6] = edit.groups
            node.args = tuple(args)
    ap.set_map(step.node.outputs[0], step.out)


def _attention(ap: _Apply, step: AttentionStep) -> None:
    st, node = ap.st, ap.fx(step.node.name)
    for name in step.ready:
        ap.reads(node, ap.fx(name))
    for name, real, want in step.pads:
        x = ap.fx(name)
        nd = len(x.meta["val"].shape)
        src = ChannelMap.identity(nd - 1, real)
        base = slice_real(st, x, node) if x in st.maps else x
        node.replace_input_with(x, pad_per_call(st, base, src, replace(src, size=want), node))
    if step.scale is not None:
        node.kwargs = {**node.kwargs, "scale": step.scale}
    if step.out is not None:
        ap.set_map(step.node.outputs[0], step.out)
    st.changed = True


def _restore_real(ap: _Apply) -> None:
    """Every reader no step made a padded reader gets the real channels (a slice)."""
    st = ap.st
    for src in list(st.maps):
        for user in list(src.users):
            if src in ap.readers.get(user, ()) or user.meta.get("graphopt_rule") == "padding":
                continue
            if aten_name(user) == "_assert_tensor_metadata" and user.kwargs.get("size") is None \
                    and user.kwargs.get("stride") is None:
                continue  # checks dtype/device only (from .to()): padding changes neither
            user.replace_input_with(src, slice_real(st, src, user))


def pad_channels(gm: fx.GraphModule, ctx: RewriteContext) -> bool:
    """Pad GEMM-like channels to tensor-core multiples where the plan says it pays."""
    nodes = {n.name: n for n in gm.graph.nodes}
    backend = _Backend(ctx, nodes, partial(get_tensor, gm))
    graph = graph_from_graph_module(gm)
    if ctx.shape_range:  # decided at the range's opt point, like the plan
        graph = bind(graph, ctx.shape_range.values("opt"))
    plan = plan_padding(graph, backend.value, backend, ctx.options)
    ctx.notes["padding"] = plan.notes(ctx.options.pad, ctx.compute_dtype).to_json()
    ap = _Apply(PadState(gm, ctx), nodes)
    for step in plan.steps:
        if isinstance(step, GemmStep):
            _gemm(ap, step)
        elif isinstance(step, CarryStep):
            _carry(ap, step)
        else:
            _attention(ap, step)
    _restore_real(ap)
    if ap.st.changed:
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
        refresh_meta(gm, ctx.example_inputs)
    logger.info("padding: %d nodes padded, %d carried, %d slices, %d per-call pads",
                len(plan.padded), plan.carried, len(plan.slices), len(plan.pads))
    return ap.st.changed


def padding_view(graph: Graph, ctx: DryRunContext) -> PaddingView | None:
    """What :func:`pad_channels` tells the padding decision about the traced model ``graph``
    before any pass (``graphopt.plan``'s dry run): the same legality and constants, over the
    graph the cleanup pass that runs first leaves (:mod:`.cleanup_view`: BatchNorm folded,
    dropout gone; its decisions land on ``ctx`` too). None when the model was traced by make_fx
    only (``optimize`` refuses it). An exported program's parameters are placeholders: its
    state dict holds them."""
    ep = graph.source_model
    if not isinstance(ep, torch.export.ExportedProgram):
        return None
    sig = ep.graph_signature
    owner = {**sig.inputs_to_parameters, **sig.inputs_to_buffers,
             **sig.inputs_to_lifted_tensor_constants}
    state = {**ep.state_dict, **ep.constants}

    def tensor(node: fx.Node | None) -> torch.Tensor | None:
        if node is None or node.op != "placeholder" or node.name not in owner:
            return None
        t = state.get(owner[node.name])
        return t if isinstance(t, torch.Tensor) else None

    backend = _Backend(ctx, {n.name: n for n in ep.graph_module.graph.nodes}, tensor)
    return PaddingView(backend, backend.value, cleaned_graph(graph, ctx))
