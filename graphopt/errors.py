"""One exception family for everything a user can get wrong.

Every error names the problem and the fix, so the CLI can print it without a traceback.
"""

from __future__ import annotations

__all__ = [
    "GraphoptError",
    "ModelLoadError",
    "TraceError",
    "UnknownTargetError",
    "UnsafePathError",
    "first_line",
]


class GraphoptError(Exception):
    """Base of all graphopt errors: ``problem`` says what is wrong, ``fix`` what to do."""

    def __init__(self, problem: str, fix: str | None = None) -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(problem if fix is None else f"{problem}\n  fix: {fix}")


class ModelLoadError(GraphoptError):
    """A model file is missing, corrupt, truncated or of an unsupported kind."""


class TraceError(GraphoptError):
    """A torch module could not be traced into a graph."""


class UnknownTargetError(GraphoptError):
    """A target name that is not in the hardware database."""


class UnsafePathError(GraphoptError):
    """A path inside a model (e.g. ONNX external data) points outside the model's folder."""


def first_line(e: BaseException) -> str:
    """``Type: first line`` of an exception from a library, short enough for an error message."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {(text[0] if text else '')[:300]}"
