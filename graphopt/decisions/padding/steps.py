"""The padding plan: what each backend applies, in graph order, and the bookkeeping it reports.

:func:`graphopt.decisions.padding.plan_padding` decides; the torch and ONNX backends turn these
steps into
their own graph edits and decide nothing. Every consumer of a padded tensor that no step says
reads it padded gets the real channels back (a slice), so a step list is always safe to apply.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from graphopt.analysis.record import NodeAnalysis
from graphopt.decisions.padding.carry import Edit
from graphopt.decisions.padding.channel_map import ChannelMap
from graphopt.decisions.padding.sites import GemmSite
from graphopt.hardware.profile import HardwareProfile
from graphopt.ir.decision_details import Detail
from graphopt.ir.graph import Node
from graphopt.ir.legality import Legality
from graphopt.ir.plan_sections import PaddingSummary, PadSlice, PerCallPad

__all__ = ["AttentionStep", "CarryStep", "ContextBackend", "GemmStep", "InputPlan", "PadBackend",
           "PaddingPlan", "Step"]


@dataclass(frozen=True)
class InputPlan:
    """How a GEMM reads its input: unchanged, sliced to real channels, or padded per call."""

    action: str  # "none" | "slice" | "pad"
    reads: ChannelMap  # the layout the GEMM sees
    src: ChannelMap | None = None  # "pad": the layout the copy starts from
    seconds: float = 0.0

    @property
    def from_padded(self) -> bool:
        """Reads the padded tensor (absorbing it, or padding on from it) rather than the real."""
        if self.action == "pad":
            return self.src is not None and self.src.is_padded
        return self.action == "none" and self.reads.is_padded


@dataclass(frozen=True)
class GemmStep:
    """Pad a GEMM-like site: read ``inp``, write ``out`` (weights placed at the maps' positions)."""

    site: GemmSite
    inp: InputPlan
    out: ChannelMap


@dataclass(frozen=True)
class AttentionStep:
    """Pad q, k, v head dims with zeros per call; the softmax scale is fixed at ``scale``."""

    node: Node
    pads: tuple[tuple[str, int, int], ...]  # (tensor, real head dim, padded head dim)
    ready: tuple[str, ...]  # inputs already padded as needed: read as they are
    scale: float | None  # set when the model left it implicit
    out: ChannelMap | None


@dataclass(frozen=True)
class CarryStep:
    """``node`` runs on the padded tensor(s) it reads; its output keeps map ``out``."""

    node: Node
    out: ChannelMap
    edits: tuple[Edit, ...]


Step = GemmStep | AttentionStep | CarryStep


@dataclass(frozen=True)
class PaddingPlan:
    """The steps in graph order, the final map of every padded tensor, and the summary."""

    steps: tuple[Step, ...]
    maps: Mapping[str, ChannelMap]
    padded: tuple[str, ...]  # GEMM and attention nodes padded (cases 1, 2 and 5)
    carried: int  # ops run on padded channels (cases 3 and 4)
    slices: tuple[PadSlice, ...]  # where padded tensors are cut back (case 4)
    pads: tuple[PerCallPad, ...]  # per-call pads of an input (cases 1 and 5)

    def notes(self, mode: str, compute_dtype: str) -> PaddingSummary:
        """What the report says of this padding (the plan's ``rewrites.padding``, a backend's
        ``notes["padding"]``)."""
        return PaddingSummary(mode=mode, compute_dtype=compute_dtype, padded_nodes=self.padded,
                              carried=self.carried, slices=self.slices, per_call_pads=self.pads)


class PadBackend(Protocol):
    """What the decision asks of the backend that will apply it, and where it records."""

    target: HardwareProfile
    compute_dtype: str

    def analysis(self, node: str) -> NodeAnalysis | None: ...

    def can_edit(self, node: Node) -> Legality:
        """Has this backend a legal edit for the node (its own legality, beside ``can_pad``)."""

    def decide(self, node: str, detail: Detail, reason: str, *,
               applied: bool = True) -> Any: ...


class _PassContext(Protocol):
    """What both backends' pass contexts have (``RewriteContext``, ``OnnxContext``)."""

    target: HardwareProfile
    compute_dtype: str

    def plan_node(self, name: str) -> Any: ...

    def decide(self, node: str, detail: Detail, reason: str, *,
               applied: bool = True) -> Any: ...


@dataclass
class ContextBackend:
    """The :class:`PadBackend` parts a pass context already answers, and the backend's nodes
    by IR name; each backend adds what only it knows (``can_edit``, constant values)."""

    ctx: _PassContext
    nodes: dict[str, Any]

    @property
    def target(self) -> HardwareProfile:
        return self.ctx.target

    @property
    def compute_dtype(self) -> str:
        return self.ctx.compute_dtype

    def analysis(self, node: str) -> NodeAnalysis | None:
        plan_node = self.ctx.plan_node(node)
        return None if plan_node is None else plan_node.analysis

    def decide(self, node: str, detail: Detail, reason: str, *,
               applied: bool = True) -> Any:
        return self.ctx.decide(node, detail, reason, applied=applied)
