"""fx edits of the padding backend: per-call pads, slices back to the real channels.

Both are exact copies of values (zeros appended or gathered, real channels selected), so they
change no numbers; the padding decision charged each as one memory-bound kernel.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from graphopt.backends.torch.context import RewriteContext
from graphopt.decisions.padding import ChannelMap

__all__ = ["PadState", "insert_call", "pad_per_call", "refresh_meta", "slice_real"]

logger = logging.getLogger(__name__)

_aten = torch.ops.aten
_counter = itertools.count()


@dataclass
class PadState:
    """The map of every padded fx node, and the slice made for each (made once, shared)."""

    gm: fx.GraphModule
    ctx: RewriteContext
    maps: dict[fx.Node, ChannelMap] = field(default_factory=dict)
    sliced: dict[fx.Node, fx.Node] = field(default_factory=dict)
    changed: bool = False


def insert_call(st: PadState, target: Any, args: tuple[Any, ...], *,
                after: fx.Node | None = None, before: fx.Node | None = None) -> fx.Node:
    g = st.gm.graph
    with g.inserting_after(after) if after is not None else g.inserting_before(before):
        node = g.call_function(target, args)
    node.meta["graphopt_rule"] = "padding"
    st.changed = True
    return node


def _index_buffer(st: PadState, idx: list[int], before: fx.Node) -> fx.Node:
    name = f"_graphopt_pad_index_{next(_counter)}"
    while hasattr(st.gm, name):
        name = f"_graphopt_pad_index_{next(_counter)}"
    st.gm.register_buffer(name, torch.tensor(idx, dtype=torch.long))
    with st.gm.graph.inserting_before(before):
        return st.gm.graph.get_attr(name)


def slice_real(st: PadState, src: fx.Node, at: fx.Node) -> fx.Node:
    """The real channels of padded ``src`` (a view for a prefix map, else a gather)."""
    cmap = st.maps[src]
    if src not in st.sliced:
        if cmap.is_prefix:
            node = insert_call(st, _aten.slice.Tensor, (src, cmap.axis, 0, cmap.real), after=src)
        else:
            node = insert_call(st, _aten.index_select.default, (src, cmap.axis, src), after=src)
            node.args = (src, cmap.axis, _index_buffer(st, list(cmap.positions), node))
        node.meta["val"] = src.meta.get("val")  # real-shaped vals until refresh_meta
        st.sliced[src] = node
    logger.debug("slice %s (%d of %d) before %s", src.name, cmap.real, cmap.size, at.name)
    return st.sliced[src]


def pad_per_call(st: PadState, x: fx.Node, src: ChannelMap, dst: ChannelMap,
                 at: fx.Node) -> fx.Node:
    """Per-call copy of ``x`` (laid out as ``src``) into the padded layout ``dst``."""
    v = x.meta.get("val")
    nd = len(v.shape) if isinstance(v, torch.Tensor) else dst.axis + 1
    pad = [0] * (2 * (nd - dst.axis))
    if src.positions == dst.positions:  # tail pad with zeros
        pad[-1] = dst.size - src.size
        return insert_call(st, _aten.constant_pad_nd.default, (x, pad, 0.0), before=at)
    base, zero = x, src.zero_slot()  # gather; padded slots read a zero slot
    if zero is None:
        pad[-1], zero = 1, src.size
        base = insert_call(st, _aten.constant_pad_nd.default, (x, pad, 0.0), before=at)
    idx = [zero] * dst.size
    for s, d in zip(src.positions, dst.positions, strict=True):
        idx[d] = s
    node = insert_call(st, _aten.index_select.default, (base, dst.axis, base), before=at)
    node.args = (base, dst.axis, _index_buffer(st, idx, node))
    return node


def refresh_meta(gm: fx.GraphModule, example_inputs: tuple[Any, ...]) -> None:
    """Re-derive ``meta["val"]`` so later passes see the padded shapes."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    try:
        inputs = [mode.from_tensor(t) if isinstance(t, torch.Tensor) else t
                  for t in example_inputs]
        FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*inputs)
    except Exception as e:  # meta is advisory; the module itself is already correct
        logger.warning("padding: could not refresh shape metadata: %s", e)
