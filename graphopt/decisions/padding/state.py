"""The padding family's state: what its cases read while the sweep runs, and what they return.

A case (:mod:`.gemm`, :mod:`.attention`, the carry in :mod:`.sweep`) is a function of the
:class:`SweepState` and one node that returns an :class:`Outcome`: the steps, maps, slices and
decisions it makes. Only :func:`~graphopt.decisions.padding.plan_padding` folds outcomes into
the plan, so no case writes state another reads mid-decision (the dry runs of
:mod:`.downstream` see the sweep as it was before the node).
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass, field

from graphopt.cost.roofline import peak_key, tc_alignment
from graphopt.decisions.padding.channel_map import ChannelMap
from graphopt.decisions.padding.cost import required_multiple
from graphopt.decisions.padding.sites import GemmSite, Values, gemm_site
from graphopt.decisions.padding.steps import PadBackend, Step
from graphopt.ir.decision_details import Detail, PaddingSliceDetail
from graphopt.ir.graph import Graph, Node
from graphopt.ir.options import Options
from graphopt.ir.plan_sections import PadSlice, PerCallPad

__all__ = ["Decided", "Outcome", "SweepState", "cut"]


@dataclass(frozen=True)
class Decided:
    """One decision for the backend to record (``PadBackend.decide``), in the order made."""

    node: str
    detail: Detail  # a padding, padding_carry or padding_slice record
    reason: str
    applied: bool = True


@dataclass(frozen=True)
class Outcome:
    """What a case decided for one node; ``a + b`` is ``a`` then ``b``."""

    steps: tuple[Step, ...] = ()
    maps: tuple[tuple[str, ChannelMap], ...] = ()  # tensor -> its padded map from now on
    slices: tuple[PadSlice, ...] = ()
    pads: tuple[PerCallPad, ...] = ()
    padded: tuple[str, ...] = ()
    carried: int = 0
    decided: tuple[Decided, ...] = ()

    def __add__(self, other: Outcome) -> Outcome:
        return Outcome(self.steps + other.steps, self.maps + other.maps,
                       self.slices + other.slices, self.pads + other.pads,
                       self.padded + other.padded, self.carried + other.carried,
                       self.decided + other.decided)


@dataclass(frozen=True)
class SweepState:
    """What the cases know while the sweep runs: read-only views of the sweep's maps (padded
    tensors so far) and ``done`` (tensors already produced), which only the sweep extends."""

    graph: Graph
    value: Values
    backend: PadBackend
    options: Options
    maps: Mapping[str, ChannelMap]
    done: Set[str]
    _sites: dict[str, GemmSite | str | None] = field(default_factory=dict, repr=False)

    def site(self, node: Node) -> GemmSite | str | None:
        """``gemm_site`` of ``node``, found once (a cache: the sweep and every dry run ask)."""
        if node.name not in self._sites:
            self._sites[node.name] = gemm_site(self.graph, node)
        return self._sites[node.name]

    def lookup(self, t: str) -> ChannelMap | None:
        return self.maps.get(t)

    def pending(self, t: str) -> bool:
        return t not in self.done

    def multiple(self, kind: str) -> tuple[int | None, str]:
        m, why = required_multiple(kind, self.backend.target, self.backend.compute_dtype)
        if m is None and self.options.pad == "always":
            m = tc_alignment(peak_key(self.backend.compute_dtype))
            why = f"padded to multiples of {m} although the {why}"
        return m, why


def cut(state: SweepState, node: Node | None, reason: str,
        tensors: list[str] | None = None) -> Outcome:
    """Slice every padded input of ``node`` (None: the graph outputs) to its real channels."""
    name = node.name if node is not None else "output"
    reads = tensors if tensors is not None else list(dict.fromkeys(
        t for t in (node.inputs if node is not None else []) if t in state.maps))
    slices = tuple(PadSlice(name, t, state.maps[t].real, state.maps[t].size, reason)
                   for t in reads)
    decided = () if node is None else (
        Decided(name, PaddingSliceDetail(), f"slice to real channels before {name}: {reason}"),)
    return Outcome(slices=slices, decided=decided)
