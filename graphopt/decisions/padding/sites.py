"""Which IR nodes are GEMM-like sites whose channels may be padded (cases 1-3 of
:mod:`graphopt.decisions.padding`), and whether that is legal.

A site is a ``Conv``, ``ConvTranspose``, ``Linear``, ``Gemm`` or ``MatMul`` (canonical ops,
:mod:`graphopt.ir.ops`) with a constant weight. Its weight is stored one of two ways:
``out_in`` (``Linear``/``Gemm transB``: ``[N, K]``; ``Conv``: ``[C_out, C_in/g, *k]``) or
``in_out`` (``MatMul``/``Gemm``: ``[K, N]``; ``ConvTranspose``: ``[C_in, C_out/g, *k]``).
Legality (:func:`can_pad`) is kept apart from profitability (:func:`.gemm.should_pad`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from graphopt.decisions.padding.channel_map import ChannelMap
from graphopt.ir.graph import Graph, Node
from graphopt.ir.legality import Legality

__all__ = ["SMALL_VALUE", "Dims", "GemmSite", "Values", "absorbs", "can_pad", "constant_source",
           "gemm_site", "numel", "shape_of"]

Dims = tuple["int | str", ...]
#: the value of a small constant tensor, or None when it is not a constant the backend can read
Values = Callable[[str], "np.ndarray | None"]
#: the largest constant a backend's ``Values`` hands the rules (bounds, scalars, shapes, axes)
SMALL_VALUE = 64

_SITE_OPS = {"Conv": "conv", "ConvTranspose": "conv_transpose", "Linear": "linear",
             "Gemm": "linear", "MatMul": "linear"}


@dataclass(frozen=True)
class GemmSite:
    """A GEMM-like node whose channels may be padded (names are IR tensor names)."""

    node: Node
    op: str  # "conv" | "conv_transpose" | "linear"
    x: str
    weight: str
    bias: str | None
    c_in: int
    c_out: int
    groups: int
    in_shape: Dims
    out_shape: Dims
    in_axis: int
    out_axis: int
    kernel: int  # product of the kernel's spatial sizes (1 for a linear)
    w_layout: str  # "out_in" | "in_out"
    bias_per_channel: bool = True  # False: a Gemm C broadcast over N writes to the padding

    @property
    def depthwise(self) -> bool:
        return self.groups > 1 and self.groups == self.c_in


def shape_of(graph: Graph, tensor: str) -> Dims | None:
    info = graph.tensor(tensor)
    return None if info is None else info.shape


def numel(shape: Dims | None) -> int:
    """Elements, symbolic dims counted as 1 (as the planner does)."""
    return math.prod(d if isinstance(d, int) else 1 for d in shape or ())


def constant_source(graph: Graph, tensor: str) -> str:
    """The constant behind an ``Identity`` chain (ONNX exporters share weights that way), or
    ``tensor`` itself; a site records the source, its backend replaces the node's input."""
    seen = 0
    while (p := graph.producer.get(tensor)) is not None and p.op_type == "Identity" and \
            p.inputs and seen < 8:
        tensor, seen = p.inputs[0], seen + 1
    return tensor


def _constant(graph: Graph, tensor: str) -> str | None:
    """Why ``tensor`` is not a constant the rewrite may replace, or None when it is one."""
    info = graph.tensor(tensor)
    if info is None or info.kind == "activation":
        return "computed, not a constant"
    if info.kind == "input":
        return "a graph input (overridable at run time)"
    return None


def gemm_site(graph: Graph, node: Node) -> GemmSite | str | None:
    """The site of a GEMM-like ``node``; a reason string if it cannot be padded; None if not one."""
    op = _SITE_OPS.get(node.op_type)
    if op is None or len(node.inputs) < 2 or node.attrs.get("grouped") or (
            node.op_type == "MatMul" and len(node.inputs) > 2):
        return None
    x, w = node.inputs[0], constant_source(graph, node.inputs[1])
    b = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
    b = constant_source(graph, b) if b else None
    why = _constant(graph, w)
    if why is not None:
        return f"the weight is {why}"
    if b is not None and _constant(graph, b) is not None:
        return f"the bias is {_constant(graph, b)}"
    w_shape, in_shape = shape_of(graph, w), shape_of(graph, x)
    out_shape = shape_of(graph, node.outputs[0]) if node.outputs else None
    if not w_shape or in_shape is None or out_shape is None or not out_shape:
        return "unknown shapes"
    if not all(isinstance(d, int) for d in w_shape):
        return "the weight's shape is not static"
    if 0 in (*in_shape, *out_shape, *w_shape):
        return "a zero-size tensor: no work to speed up"
    groups = int(node.attrs.get("group", 1) or 1)
    layout, bias_ok, kernel = "out_in", True, 1
    if op == "linear":
        if len(w_shape) != 2:
            return f"the {node.op_type} weight is not a 2-D matrix"
        if len(in_shape) < 2 and node.op_type == "MatMul":
            return "MatMul of a 1-D input"
        trans_b = node.op_type == "Linear" or bool(node.attrs.get("transB", 0))
        c_out, c_in = w_shape if trans_b else w_shape[::-1]
        layout = "out_in" if trans_b else "in_out"
        in_axis = 0 if node.attrs.get("transA", 0) else len(in_shape) - 1
        out_axis = len(out_shape) - 1
        b_shape = shape_of(graph, b) if b else None
        bias_ok = b_shape is None or (len(b_shape) >= 1 and b_shape[-1] == c_out)
    else:
        if len(in_shape) < 3:
            return f"a {node.op_type} without spatial dims"
        spatial = len(w_shape) - 2
        kernel = math.prod(w_shape[2:])
        in_axis, out_axis = len(in_shape) - spatial - 1, len(out_shape) - spatial - 1
        if op == "conv":
            c_out, c_in = w_shape[0], w_shape[1] * groups
        else:
            c_in, c_out, layout = w_shape[0], w_shape[1] * groups, "in_out"
    if not _agrees(in_shape[in_axis], c_in) or not _agrees(out_shape[out_axis], c_out):
        return "the channel dims do not match the weight"
    in_shape = in_shape[:in_axis] + (int(c_in),) + in_shape[in_axis + 1:]  # the weight says so
    out_shape = out_shape[:out_axis] + (int(c_out),) + out_shape[out_axis + 1:]
    return GemmSite(node, op, x, w, b, int(c_in), int(c_out), groups, in_shape, out_shape,
                    in_axis, out_axis, kernel, layout, bias_ok)


def _agrees(dim: int | str, channels: int) -> bool:
    """A symbolic dim (ONNX shape inference lost it) takes the weight's size: a valid model
    cannot run otherwise."""
    return not isinstance(dim, int) or dim == channels


def can_pad(site: GemmSite) -> Legality:
    """Can zero padding keep this site's meaning (cases 2 and 3 say where it cannot)."""
    if site.depthwise:
        return Legality.no("depthwise conv (groups == C_in): per-group padding would multiply "
                           "the work")
    if site.op == "conv_transpose" and site.groups > 1:
        return Legality.no("grouped transposed conv: its per-group weight layout is not handled")
    return Legality.OK


def absorbs(site: GemmSite, cmap: ChannelMap) -> bool:
    """Can zero weights at the padding positions absorb a padded input (identity 1 of
    :mod:`.channel_map`)?"""
    if cmap.axis != site.in_axis or site.depthwise:
        return False
    if site.op == "conv_transpose":
        return site.groups == 1
    return cmap.group_block(site.groups) is not None
