"""The padding decision's state while it sweeps the graph, shared by its case modules.

:mod:`.padding` (GEMMs and carries), :mod:`.padding_attention` (case 5) and
:mod:`.padding_downstream` (what padding costs the consumers) all read and write one
:class:`Sweep`; it lives here so that they import it, not each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from graphopt.cost.roofline import peak_key, tc_alignment
from graphopt.decisions.channel_map import ChannelMap
from graphopt.decisions.padding_cost import required_multiple
from graphopt.decisions.padding_sites import GemmSite, Values, gemm_site
from graphopt.decisions.padding_steps import PadBackend, PaddingPlan
from graphopt.ir.graph import Graph, Node
from graphopt.ir.options import Options

__all__ = ["Sweep"]


@dataclass
class Sweep:
    """What the decision knows while it sweeps the graph."""

    graph: Graph
    value: Values
    backend: PadBackend
    options: Options
    plan: PaddingPlan
    done: set[str]
    _sites: dict[str, GemmSite | str | None] = field(default_factory=dict)

    def site(self, node: Node) -> GemmSite | str | None:
        """``gemm_site`` of ``node``, found once: the sweep and every dry run ask again."""
        if node.name not in self._sites:
            self._sites[node.name] = gemm_site(self.graph, node)
        return self._sites[node.name]

    @property
    def maps(self) -> dict[str, ChannelMap]:
        return self.plan.maps

    def lookup(self, t: str) -> ChannelMap | None:
        return self.plan.maps.get(t)

    def pending(self, t: str) -> bool:
        return t not in self.done

    def multiple(self, kind: str) -> tuple[int | None, str]:
        m, why = required_multiple(kind, self.backend.target, self.backend.compute_dtype)
        if m is None and self.options.pad == "always":
            m = tc_alignment(peak_key(self.backend.compute_dtype))
            why = f"padded to multiples of {m} although the {why}"
        return m, why

    def cut(self, node: Node | None, reason: str, tensors: list[str] | None = None) -> None:
        """Slice every padded input of ``node`` (None: the graph outputs) to its real channels."""
        name = node.name if node is not None else "output"
        reads = tensors if tensors is not None else list(dict.fromkeys(
            t for t in (node.inputs if node is not None else []) if t in self.maps))
        for t in reads:
            cmap = self.maps[t]
            self.plan.slices.append({"node": name, "source": t, "real": cmap.real,
                                     "padded": cmap.size, "reason": reason})
        if node is not None:
            self.backend.decide(name, "padding_slice",
                                f"slice to real channels before {name}: {reason}")
