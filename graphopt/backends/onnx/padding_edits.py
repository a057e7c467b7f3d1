"""ONNX edits of the padding backend: padded tensor names, per-call Pads, Slices back.

Both are exact copies of values (zeros appended or gathered, real channels selected), so they
change no numbers; the padding decision charged each as one memory-bound kernel. A padded
tensor gets a new name (``<name>_padded``); the original name, when anything still reads it (a
consumer that needs the real channels, a graph output, a subgraph), is produced by a Slice
(prefix maps) or Gather (scattered maps) placed right after the producer, so those readers need
no rewiring. New nodes carry ``doc_string = "graphopt:padding"``; replaced constants nobody
reads any more are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from graphopt.decisions.padding import ChannelMap
from graphopt.ir.order import stable_topo_order, unique_name

__all__ = ["PadState", "subgraph_refs", "topo_order"]

_TAG = "graphopt:padding"


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
    """The padded name and map of every padded tensor, and the edits made so far."""

    model: onnx.ModelProto
    used_names: set[str]
    maps: dict[str, ChannelMap] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)  # real name -> padded tensor name
    before: dict[str, list[onnx.NodeProto]] = field(default_factory=dict)
    replaced: set[str] = field(default_factory=set)

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

    def set_padded(self, node: onnx.NodeProto, cmap: ChannelMap) -> None:
        """``node``'s first output becomes the padded tensor; the real name is kept for a Slice."""
        real = node.output[0]
        self.names[real] = node.output[0] = self.unique(f"{real}_padded")
        self.maps[real] = cmap

    def read_padded(self, node: onnx.NodeProto) -> None:
        for i, t in enumerate(node.input):
            if t in self.maps:
                node.input[i] = self.names[t]

    def _add(self, at: onnx.NodeProto, op: str, inputs: list[str], hint: str,
             **attrs: int) -> str:
        out = self.unique(f"{inputs[0]}_{hint}_{at.name}")
        self.before.setdefault(at.name, []).append(helper.make_node(
            op, inputs, [out], name=self.unique(f"{at.name}/graphopt_{hint}"), doc_string=_TAG,
            **attrs))
        return out

    def pad_per_call(self, x: str, rank: int, src: ChannelMap, dst: ChannelMap,
                     at: onnx.NodeProto) -> str:
        """Copy ``x`` (laid out as ``src``) into layout ``dst`` before ``at``: a tail ``Pad``,
        or a ``Gather`` whose padded slots read a zero slot (one appended if ``src`` has none)."""
        pads = np.zeros(2 * rank, dtype=np.int64)
        if src.positions == dst.positions:
            pads[rank + dst.axis] = dst.size - src.size
            return self._add(at, "Pad", [x, self.add_initializer(f"{at.name}_pads", pads)],
                             "pad")
        base, zero = x, src.zero_slot()
        if zero is None:
            pads[rank + dst.axis], zero = 1, src.size
            base = self._add(at, "Pad", [x, self.add_initializer(f"{at.name}_pads", pads)],
                             "pad")
        idx = [zero] * dst.size
        for s, d in zip(src.positions, dst.positions, strict=True):
            idx[d] = s
        index = self.add_initializer(f"{at.name}_index", np.asarray(idx, dtype=np.int64))
        return self._add(at, "Gather", [base, index], "gather", axis=dst.axis)

    def _slice(self, real: str) -> onnx.NodeProto:
        """The real channels of a padded tensor, under its original name: Slice, or Gather."""
        cmap, src = self.maps[real], self.names[real]
        name = self.unique(f"{real}/graphopt_slice")
        if cmap.is_prefix:
            args = [self.add_initializer(f"{real}_{k}", np.asarray([v], dtype=np.int64))
                    for k, v in (("starts", 0), ("ends", cmap.real), ("axes", cmap.axis))]
            return helper.make_node("Slice", [src, *args], [real], name=name, doc_string=_TAG)
        idx = self.add_initializer(f"{real}_index", np.asarray(cmap.positions, dtype=np.int64))
        return helper.make_node("Gather", [src, idx], [real], name=name, axis=cmap.axis,
                                doc_string=_TAG)

    def finish(self) -> None:
        """Emit Pads, and a Slice for every padded tensor still read by its real name; drop
        replaced constants nobody reads; keep value_info only for tensors that still exist."""
        g = self.model.graph
        outputs = {o.name for o in g.output}
        added = [n for group in self.before.values() for n in group]
        read = {i for n in (*g.node, *added) for i in (*n.input, *subgraph_refs(n))} | outputs
        padded_of = {p: r for r, p in self.names.items()}
        nodes: list[onnx.NodeProto] = []
        for n in g.node:
            nodes += self.before.get(n.name, [])
            nodes.append(n)
            nodes += [self._slice(padded_of[o]) for o in n.output
                      if o in padded_of and padded_of[o] in read]
        del g.node[:]
        g.node.extend(nodes)
        read = {i for n in g.node for i in (*n.input, *subgraph_refs(n))} | outputs
        keep = [t for t in g.initializer if t.name not in self.replaced or t.name in read]
        del g.initializer[:]
        g.initializer.extend(keep)
        live = [n for n in g.node if n.op_type != "Constant" or n.output[0] not in self.replaced
                or n.output[0] in read]
        del g.node[:]
        g.node.extend(live)
        exists = {o for n in g.node for o in n.output} | {t.name for t in g.initializer}
        vis = [vi for vi in g.value_info if vi.name in exists]
        del g.value_info[:]
        g.value_info.extend(vis)
