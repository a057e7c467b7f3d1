"""A progress line on stderr for graphopt's long steps (tracing, export, save, calibration, the
accuracy guard): silence for the first ``DELAY_S`` seconds, then ``graphopt: <what> 12s``
refreshed twice a second, cleared when the step ends.

Why a timer and not a bar: these steps call torch (torch.export, ONNX Runtime), which reports
no progress, so the line says what runs and for how long. Shown only where someone watches: on
a terminal (stderr is a TTY), never in a pipe, a log file or a test, and never when quiet
(``graphopt --quiet``, :func:`set_quiet`, or ``GRAPHOPT_QUIET=1``).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator

__all__ = ["DELAY_S", "QUIET_ENV", "progress", "set_quiet", "shown"]

#: a step shorter than this prints nothing (the issue's "longer than about 2 s")
DELAY_S = 2.0
QUIET_ENV = "GRAPHOPT_QUIET"
_REFRESH_S = 0.5
_quiet = False


def set_quiet(quiet: bool = True) -> None:
    """No progress lines in this process (the CLI's ``--quiet``)."""
    global _quiet
    _quiet = quiet


def _stderr() -> object:
    return sys.stderr


def shown() -> bool:
    """Whether a long step would show its line here: a terminal, and not quiet."""
    if _quiet or os.environ.get(QUIET_ENV, "") not in ("", "0"):
        return False
    stream = _stderr()
    return stream is not None and hasattr(stream, "isatty") and stream.isatty()


@contextlib.contextmanager
def progress(what: str) -> Iterator[None]:
    """Show ``what`` with its elapsed time while the block runs longer than ``DELAY_S``."""
    if not shown():
        yield
        return
    from tqdm import tqdm

    stream, done = _stderr(), threading.Event()

    def watch() -> None:
        if done.wait(DELAY_S):
            return
        line = tqdm(desc=f"graphopt: {what}", bar_format="{desc} {elapsed}", file=stream,
                    leave=False, dynamic_ncols=True)
        try:
            while not done.wait(_REFRESH_S):
                line.refresh()
        finally:
            line.close()

    thread = threading.Thread(target=watch, name="graphopt-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
