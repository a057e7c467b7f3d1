"""Graph edits of the ONNX padding pass: its state, per-call Pads, Slices back to real channels.

Both are exact copies of values (zeros appended, real channels selected), so they change no
numbers; the pass's cost model charges each as one memory-bound kernel. A padded tensor gets a
new name (``<name>_padded``); the original name, when anything still reads it (a cut consumer,
a graph output, a subgraph), is produced by a Slice (prefix maps) or Gather (scattered maps)
placed right after the producer, so cut consumers and graph outputs need no rewiring. New nodes
carry ``doc_string = "graphopt:padding"``; replaced constants nobody reads any more are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from graphopt._order import stable_topo_order, unique_name
from graphopt.decisions.channel_map import ChannelMap
from graphopt.onnx_rewrites.context import OnnxContext
from graphopt.onnx_rewrites.padding_rules import ModelInfo, subgraph_refs

__all__ = ["PadState", "finish", "slice_node", "topo_order"]

_TAG = "graphopt:padding"


def topo_order(nodes: list[onnx.NodeProto], available: set[str]) -> list[onnx.NodeProto]:
    """``nodes`` in a topological order, as close to the file's as possible (subgraph reads
    count as inputs)."""
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    deps = [{producer[t] for t in {*n.input, *subgraph_refs(n)} if t in producer
             and t not in available} for n in nodes]
    order = stable_topo_order(deps)
    placed = set(order)
    order += [i for i in range(len(nodes)) if i not in placed]  # a cycle: left as it is
    return [nodes[i] for i in order]


@dataclass
class PadState:
    """The sweep's knowledge: the map and padded name of every padded tensor, and the edits."""

    model: onnx.ModelProto
    info: ModelInfo
    ctx: OnnxContext
    maps: dict[str, ChannelMap] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)  # real name -> padded tensor name
    produced: set[str] = field(default_factory=set)
    need_slice: dict[str, str] = field(default_factory=dict)
    before: dict[int, list[onnx.NodeProto]] = field(default_factory=dict)
    replaced: set[str] = field(default_factory=set)
    used_names: set[str] = field(default_factory=set)
    padded: list[str] = field(default_factory=list)
    carried: int = 0
    slices: list[dict[str, Any]] = field(default_factory=list)
    pads: list[dict[str, Any]] = field(default_factory=list)

    def unique(self, hint: str) -> str:
        return unique_name(hint, self.used_names)

    def add_initializer(self, hint: str, value: np.ndarray) -> str:
        name = self.unique(f"graphopt_pad/{hint}")
        self.model.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def replace_input(self, node: onnx.NodeProto, index: int, hint: str,
                      value: np.ndarray) -> None:
        self.replaced.add(node.input[index])
        node.input[index] = self.add_initializer(hint, value)

    def lookup(self, t: str) -> ChannelMap | None:
        return self.maps.get(t)

    def pending(self, t: str) -> bool:
        return t not in self.produced

    def set_padded(self, node: onnx.NodeProto, cmap: ChannelMap) -> None:
        """``node``'s first output becomes the padded tensor; the real name is kept for a Slice."""
        real = node.output[0]
        self.names[real] = node.output[0] = self.unique(f"{real}_padded")
        self.maps[real] = cmap

    def read_padded(self, node: onnx.NodeProto) -> None:
        for i, t in enumerate(node.input):
            if t in self.maps:
                node.input[i] = self.names[t]

    def cut(self, t: str, at: str, reason: str) -> None:
        """Consumers of the real tensor read ``t`` itself: a Slice will produce it."""
        cmap = self.maps[t]
        self.need_slice.setdefault(t, reason)
        self.slices.append({"node": at, "source": t, "real": cmap.real, "padded": cmap.size,
                            "reason": reason})

    def cut_inputs(self, node: onnx.NodeProto, reason: str) -> None:
        for t in dict.fromkeys(i for i in node.input if i in self.maps):
            self.cut(t, node.name, reason)
        self.ctx.decide(node.name, "padding_slice",
                        f"slice to real channels before {node.name}: {reason}")

    def pad_per_call(self, x: str, rank: int, src: ChannelMap, dst: ChannelMap, at: int,
                     node: onnx.NodeProto) -> str:
        """A ``Pad`` of ``x`` with zeros at the end of the channel axis, before node ``at``."""
        pads = np.zeros(2 * rank, dtype=np.int64)
        pads[rank + dst.axis] = dst.size - src.size
        out = self.unique(f"{x}_pad_{node.name}")
        pad = helper.make_node("Pad", [x, self.add_initializer(f"{node.name}_pads", pads)], [out],
                               name=self.unique(f"{node.name}/graphopt_pad"), doc_string=_TAG)
        self.before.setdefault(at, []).append(pad)
        self.pads.append({"node": node.name, "source": x, "from": src.size, "to": dst.size})
        return out


def slice_node(st: PadState, real: str) -> onnx.NodeProto:
    """The real channels of a padded tensor, under its original name: Slice, or Gather."""
    cmap, src = st.maps[real], st.names[real]
    name = st.unique(f"{real}/graphopt_slice")
    if cmap.is_prefix:
        args = [st.add_initializer(f"{real}_{k}", np.asarray([v], dtype=np.int64))
                for k, v in (("starts", 0), ("ends", cmap.real), ("axes", cmap.axis))]
        return helper.make_node("Slice", [src, *args], [real], name=name, doc_string=_TAG)
    idx = st.add_initializer(f"{real}_index", np.asarray(cmap.positions, dtype=np.int64))
    return helper.make_node("Gather", [src, idx], [real], name=name, axis=cmap.axis,
                            doc_string=_TAG)


def finish(st: PadState, order: list[onnx.NodeProto]) -> None:
    """Emit Pads and Slices in place, drop replaced constants nobody reads, fix value_info."""
    g = st.model.graph
    for t in st.maps:
        if t in st.info.outputs or t in st.info.implicit:
            st.cut(t, "<graph output>" if t in st.info.outputs else "<subgraph>",
                   "graph output" if t in st.info.outputs else "read inside a subgraph")
    padded_of = {p: r for r, p in st.names.items()}
    nodes: list[onnx.NodeProto] = []
    for i, n in enumerate(order):
        nodes += st.before.get(i, [])
        nodes.append(n)
        nodes += [slice_node(st, padded_of[o]) for o in n.output
                  if o in padded_of and padded_of[o] in st.need_slice]
    del g.node[:]
    g.node.extend(nodes)
    read = {i for n in g.node for i in (*n.input, *subgraph_refs(n))} | set(st.info.outputs)
    keep = [t for t in g.initializer if t.name not in st.replaced or t.name in read]
    del g.initializer[:]
    g.initializer.extend(keep)
    live = [n for n in g.node if n.op_type != "Constant" or n.output[0] not in st.replaced
            or n.output[0] in read]
    del g.node[:]
    g.node.extend(live)
    exists = {o for n in g.node for o in n.output} | {t.name for t in g.initializer}
    vis = [vi for vi in g.value_info if vi.name in exists]
    del g.value_info[:]
    g.value_info.extend(vis)
