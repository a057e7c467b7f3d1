"""The plan's ``deploy`` section as typed records: which artifact to deploy, every candidate's
time, and the speedups the report shows (``graphopt.decisions.deploy.artifact`` decides).

Why in ``ir``: the plan holds the choice, and the plan is ``ir``'s; the decision that fills it
lives in ``decisions/deploy``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from graphopt.ir.records import Record

__all__ = ["ARTIFACTS", "Artifact", "ArtifactTiming", "DeployChoice"]


class Artifact(StrEnum):
    """An artifact graphopt can hand over (its value is the report's and ``deploy.json``'s)."""

    TORCH = "torch"
    TORCH_COMPILE = "torch.compile"
    ONNXRUNTIME = "onnxruntime"
    OPENVINO = "openvino"


#: every artifact graphopt can hand over, simplest to deploy first (OpenVINO last: a second
#: runtime, an optional package, and a compile at load)
ARTIFACTS = (Artifact.TORCH, Artifact.TORCH_COMPILE, Artifact.ONNXRUNTIME, Artifact.OPENVINO)


@dataclass(frozen=True)
class ArtifactTiming(Record):
    """One candidate: its time (measured best, or predicted), whether its outputs are within
    tolerance (None: not checked) and what else the report should say (a compile's seconds,
    why it failed)."""

    artifact: Artifact
    seconds: float | None
    within: bool | None = None
    note: str = ""
    error: str | None = None
    #: measured: its best time in each interleaved round, paired by round with the others'
    #: (the choice's working data: not in the report)
    rounds: tuple[float, ...] = ()

    @property
    def usable(self) -> bool:
        return self.error is None and self.seconds is not None and self.within is not False

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        del out["rounds"]
        return out


@dataclass(frozen=True)
class DeployChoice(Record):
    """The artifact to deploy and why; ``candidates``: every one, in :data:`ARTIFACTS` order;
    ``original_s``: the user's own model, timed beside them (measured only). The speedups are
    the report's, computed once by :meth:`of`."""

    artifact: Artifact
    measured: bool
    reason: str
    method: str
    candidates: tuple[ArtifactTiming, ...]
    original_s: float | None = None
    speedup_vs_torch_module: float | None = None
    speedup_vs_original: float | None = None

    @classmethod
    def of(cls, artifact: str, measured: bool, reason: str,
           candidates: tuple[ArtifactTiming, ...], method: str,
           original_s: float | None = None) -> DeployChoice:
        """The choice with its speedups over the torch module and the original model."""
        rows = {r.artifact: r for r in candidates}
        chosen = rows.get(Artifact(artifact))
        return cls(Artifact(artifact), measured, reason, method, candidates, original_s,
                   _ratio(rows.get(Artifact.TORCH), chosen),
                   None if original_s is None or chosen is None or not chosen.seconds
                   else original_s / chosen.seconds)

    def row(self, artifact: str) -> ArtifactTiming | None:
        return next((r for r in self.candidates if r.artifact == artifact), None)

    @property
    def speedup(self) -> float | None:
        """The chosen artifact's speed over the torch module's (None: either has no time)."""
        return self.speedup_vs_torch_module


def _ratio(slow: ArtifactTiming | None, fast: ArtifactTiming | None) -> float | None:
    if slow is None or fast is None or not slow.seconds or not fast.seconds:
        return None
    return slow.seconds / fast.seconds
