"""One exception family for everything a user can get wrong.

Every error names the problem and the fix, so the CLI can print it without a traceback.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = [
    "GraphoptError",
    "ModelLoadError",
    "TraceError",
    "UnknownTargetError",
    "UnsafePathError",
    "UserCodeExit",
    "first_line",
    "user_code",
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


class UserCodeExit(GraphoptError):
    """The user's code (a builder function, ``forward``) called ``sys.exit`` or raised
    ``GeneratorExit``: graphopt stops with a message instead of leaving silently."""


@contextlib.contextmanager
def user_code(what: str) -> Iterator[None]:
    """Run user code (``what`` names it: ``"model.py:build()"``, ``"Net.forward"``) so that a
    ``sys.exit()`` or a stray ``GeneratorExit`` inside it becomes a :class:`UserCodeExit`.

    Both are ``BaseException``s that no ``except Exception`` catches: uncaught, ``sys.exit(0)``
    ends graphopt with status 0 and nothing written, which reads as success.
    ``KeyboardInterrupt`` is left alone: the CLI exits 130 on it, as a shell expects.
    """
    try:
        yield
    except SystemExit as e:
        raise UserCodeExit(f"{what} called sys.exit({e.code!r}); graphopt stopped without "
                           "writing anything",
                           f"remove the sys.exit call from {what} (return instead)") from None
    except GeneratorExit:
        raise UserCodeExit(f"{what} raised GeneratorExit, which only a generator's close() "
                           "may raise", f"fix {what} so it returns normally") from None


def first_line(e: BaseException) -> str:
    """``Type: first line`` of an exception from a library, short enough for an error message."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {(text[0] if text else '')[:300]}"
