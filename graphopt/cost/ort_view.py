"""The units ORT's optimizer sees, and their edges as fusions merge them (:mod:`.ort_fusion`).

Why apart: the matcher (:mod:`.ort_match`) reads a plan's nodes through this view only: each
unit's readers counted per edge, as ORT's ``GetOutputEdgesCount`` does, and kept current as
units merge (a tensor loses a merged reader in O(1), so a weight read by thousands of nodes
stays cheap).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from graphopt.ir.graph import TensorInfo

__all__ = ["OrtUnit", "UnitView", "nth_input"]


@dataclass
class OrtUnit:
    """One node as ORT's optimizer sees it: an original node, or the nodes a rule fused."""

    op: str
    nodes: list[str]
    inputs: list[TensorInfo | None]
    outputs: list[TensorInfo | None]
    rules: list[str] = field(default_factory=list)
    alive: bool = True
    #: computed only from constants: ORT's ConstantFolding runs it once, at session start
    folded: bool = False


class UnitView:
    """The units with their edges, kept up to date as rules merge them."""

    def __init__(self, units: list[OrtUnit], graph_outputs: set[str], ep: str) -> None:
        self.units = units  # graph order; a merged unit leaves a dead entry behind
        self.graph_outputs = graph_outputs
        self.ep = ep
        self.pos = {id(u): i for i, u in enumerate(units)}
        self.producer = {t.name: u for u in units for t in u.outputs if t is not None}
        # tensor -> {id(reader): [reader, edges]}: a weight read by thousands of nodes loses a
        # reader in O(1) when one of them is merged
        self.readers: dict[str, dict[int, list[Any]]] = {}
        for u in units:
            self._read(u)

    def _read(self, u: OrtUnit) -> None:
        for t in u.inputs:
            if t is not None:
                slot = self.readers.setdefault(t.name, {}).setdefault(id(u), [u, 0])
                slot[1] += 1  # one per edge, as ORT counts them

    def edges(self, u: OrtUnit) -> list[OrtUnit]:
        """The units reading ``u``'s outputs, once per edge (ORT's GetOutputEdgesCount)."""
        return [r for t in u.outputs if t is not None
                for r, k in self.readers.get(t.name, {}).values() for _ in range(k)]

    def sole(self, u: OrtUnit | None) -> OrtUnit | None:
        """``u``'s one consumer, when ``u`` has exactly one output edge and no graph output."""
        if u is None:
            return None
        e = self.edges(u)
        return e[0] if len(e) == 1 and not self.is_output(u) else None

    def is_output(self, u: OrtUnit) -> bool:
        return any(t is not None and t.name in self.graph_outputs for t in u.outputs)

    def parent(self, u: OrtUnit, i: int) -> OrtUnit | None:
        t = nth_input(u, i)
        return None if t is None else self.producer.get(t.name)

    def other(self, u: OrtUnit | None, t: TensorInfo | None) -> TensorInfo | None:
        """The input of binary ``u`` that is not ``t``."""
        if u is None:
            return None
        rest = [x for x in u.inputs if x is not None and (t is None or x.name != t.name)]
        return rest[0] if len(rest) == 1 else None

    def merge(self, members: Sequence[OrtUnit], op: str, rule: str) -> OrtUnit:
        """Fuse ``members`` into one unit where the last of them stood."""
        members = sorted(members, key=lambda m: self.pos[id(m)])
        mine = {id(m) for m in members}
        inside = {t.name for m in members for t in m.outputs if t is not None}
        ins: dict[str, TensorInfo] = {}
        for m in members:
            for t in m.inputs:
                if t is not None and t.name not in inside:
                    ins.setdefault(t.name, t)
        outs = [t for m in members for t in m.outputs if t is not None and (
            t.name in self.graph_outputs or
            any(r not in mine for r in self.readers.get(t.name, {})))]
        fused = OrtUnit(op, [n for m in members for n in m.nodes], list(ins.values()), outs,
                        [r for m in members for r in m.rules] + [rule])
        at = self.pos[id(members[-1])]
        for m in members:
            m.alive = False
            for t in m.inputs:
                if t is not None:
                    self.readers.get(t.name, {}).pop(id(m), None)
            for t in m.outputs:
                if t is not None:
                    self.producer.pop(t.name, None)
        self.units[at] = fused
        self.pos[id(fused)] = at
        self.producer.update({t.name: fused for t in outs})
        self._read(fused)
        return fused


def nth_input(u: OrtUnit, i: int) -> TensorInfo | None:
    """``u``'s input ``i``, or None when it has fewer."""
    return u.inputs[i] if i < len(u.inputs) else None
