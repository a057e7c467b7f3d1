"""Legality as a value: may a rewrite run here, and if not, why.

Every ``can_*`` check (``can_pad``, ``can_channels_last``, ``can_quantize``, ...) answers with a
:class:`Legality` rather than "a reason string when it cannot, None when it can": the answer is
data a caller tests (``if legal:``), and the reason is there for the report. onnxscript's
rewrite rules do the same with their ``check()`` result. It lives in the IR package because
decisions, backends and partition all ask legality questions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

__all__ = ["Legality"]


@dataclass(frozen=True)
class Legality:
    """``ok`` when the rewrite keeps the model's meaning here; else ``reason`` says why not.

    Truthy when legal, so ``if not (legal := can_pad(site)): ... legal.reason`` reads as it
    means. Build one with :attr:`OK` or :meth:`no`.
    """

    ok: bool
    reason: str = ""

    OK: ClassVar[Legality]

    @classmethod
    def no(cls, reason: str) -> Legality:
        """Not legal, because ``reason`` (it is shown to people: say what blocks the rewrite)."""
        return cls(False, reason)

    def __bool__(self) -> bool:
        return self.ok

    def __post_init__(self) -> None:  # a programming error, not a user's: no GraphoptError
        if self.ok == bool(self.reason):
            raise ValueError("a legal rewrite carries no reason; an illegal one needs its reason")


Legality.OK = Legality(True)
