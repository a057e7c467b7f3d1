"""Library noise kept off stderr while graphopt calls a library, and only then (issue 35, item 3).

graphopt prints its own lines. The libraries it calls add theirs: torch's profiler (kineto)
writes ``USDT:... profiler_start`` / ``profiler_stop`` straight to file descriptor 2 each time a
profile starts and stops (``sys.stderr`` never sees them), torch warns from ``copyreg`` when a
traced module is copied, the ONNX exporters print progress, and ``onnxruntime.quantization``
logs "consider pre-processing" through the root logger. :func:`library_quiet` wraps such a call
and drops exactly the known noise, for the call only:

* **fd 2** points at an unlinked temporary file; a reader thread tails it every ``POLL_S`` and
  writes every line to the saved original descriptor, except the known noise lines
  (``NOISE_LINES``). A partial line that cannot become noise is forwarded at once, so
  graphopt's own progress line (``files.progress``: tqdm's ``\\r`` refreshes on ``sys.stderr``,
  which is fd 2) keeps showing on a terminal. One reader keeps the order, and the file is
  drained on exit, also when the call raises: a library's error text always reaches stderr.
  A file, not a pipe: a C library writing while it holds the GIL can never block on a pipe
  that the reader (which needs the GIL) has not emptied.
* **warnings**: the known ones (``NOISE_WARNINGS``) are ignored under
  ``warnings.catch_warnings``, which puts the process's own filter list back on exit.
* **logging**: a filter on each logger that logs a known record (``NOISE_LOGS``) drops those
  records and is removed on exit, as is any handler that the library's ``logging.warning``
  added to a root logger that had none (its implicit ``basicConfig``).

The fd swap and the warning filters are process-wide while they last, so only the outermost of
nested or concurrent calls installs them (a lock and a depth count), and each wraps the noisy
call alone, never a whole command. A thread that writes to fd 2 meanwhile goes through the same
filter: only known noise is dropped. A process started inside the call that outlives it would
keep writing to the file: wrap no such call. :func:`silenced_fds` is the blunt tool for what
must never reach a descriptor at all (the exporters' graph dumps on fd 1, which is the report's).

Everything shows again with :func:`set_verbose` (``graphopt --verbose``) or, for the Python
API, ``GRAPHOPT_VERBOSE=1``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterator

__all__ = ["NOISE_LINES", "NOISE_LOGS", "NOISE_WARNINGS", "VERBOSE_ENV", "NoiseFilter",
           "library_quiet", "set_verbose", "silenced_fds", "verbose"]

VERBOSE_ENV = "GRAPHOPT_VERBOSE"
#: seconds between two reads of the captured fd 2 (a progress refresh shows this much late)
POLL_S = 0.05

#: (how the line starts, the whole line) of what libraries write to fd 2 that says nothing to
#: a graphopt user: kineto's trace markers (``USDT:``; ``STAGE:`` in older torch)
NOISE_LINES: tuple[tuple[bytes, re.Pattern[bytes]], ...] = (
    (b"USDT:", re.compile(rb"USDT:.*\] profiler_(start|stop)\s*")),
    (b"STAGE:", re.compile(rb"STAGE:.*ActivityProfilerController\.cpp:\d+\] .*")),
)
#: (category, message regex from the start) of library warnings a graphopt user cannot act on
NOISE_WARNINGS: tuple[tuple[type[Warning], str], ...] = (
    # torch's pytree, when copy.deepcopy copies a traced module's specs (via copyreg)
    (FutureWarning, r"`isinstance\(treespec, LeafSpec\)` is deprecated"),
)
#: (logger, message regex) of log records of the same kind: onnxruntime.quantization's advice,
#: twice per call, and the dynamo exporter's note on each torchvision op it skips
NOISE_LOGS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("root", re.compile(r"Please consider (to run )?pre-processing before quantization")),
    ("torch.onnx._internal.exporter._registration",
     re.compile(r"torchvision is not installed\. Skipping torchvision::")),
)

_verbose = False
_lock = threading.Lock()
_depth = {"python": 0, "fd": 0}


def set_verbose(on: bool = True) -> None:
    """Library output shown in this process (the CLI's ``--verbose``)."""
    global _verbose
    _verbose = on


def verbose() -> bool:
    """Whether library output is shown: :func:`set_verbose`, or ``GRAPHOPT_VERBOSE`` set."""
    return _verbose or os.environ.get(VERBOSE_ENV, "") not in ("", "0")


class NoiseFilter:
    """Bytes in, bytes to show out: whole lines matching ``NOISE_LINES`` are dropped; the rest
    passes, a partial line as soon as it cannot be the start of a noise line."""

    def __init__(self) -> None:
        self._held = b""

    def feed(self, data: bytes) -> bytes:
        self._held += data
        out = []
        *lines, self._held = self._held.split(b"\n")
        out.extend(line + b"\n" for line in lines if not _noise(line))
        if self._held and not any(start.startswith(self._held) or self._held.startswith(start)
                                  for start, _ in NOISE_LINES):
            out.append(self._held)  # a progress refresh, or text that cannot be noise
            self._held = b""
        return b"".join(out)

    def close(self) -> bytes:
        """What is held at the end (a last line without its newline), unless it is noise."""
        rest, self._held = self._held, b""
        return b"" if _noise(rest) else rest


def _noise(line: bytes) -> bool:
    line = line.rstrip(b"\r")
    return any(line.startswith(start) and pattern.fullmatch(line)
               for start, pattern in NOISE_LINES)


class _Forward(threading.Thread):
    """Tails ``src`` (the file fd 2 writes into) and writes what is not noise to ``dst``."""

    def __init__(self, src: int, dst: int) -> None:
        super().__init__(name="graphopt-quiet", daemon=True)
        self.src, self.dst, self.done = src, dst, threading.Event()
        self.lines = NoiseFilter()

    def run(self) -> None:
        offset = 0
        while True:
            last = self.done.is_set()  # read once more after it is set: nothing is left behind
            while chunk := os.pread(self.src, 1 << 16, offset):
                offset += len(chunk)
                self._write(self.lines.feed(chunk))
            if last:
                break
            self.done.wait(POLL_S)
        self._write(self.lines.close())

    def _write(self, data: bytes) -> None:
        while data:
            try:
                data = data[os.write(self.dst, data):]
            except OSError:  # stderr closed: nowhere to show it
                return


def _flush() -> None:
    for stream in {id(s): s for s in (sys.stdout, sys.stderr, sys.__stderr__) if s}.values():
        with contextlib.suppress(Exception):
            stream.flush()


@contextlib.contextmanager
def _filtered_stderr() -> Iterator[None]:
    """fd 2 through :class:`NoiseFilter` for the block (module docstring)."""
    _flush()
    try:
        saved = os.dup(2)
    except OSError:  # no fd 2 (embedded interpreters): nothing to filter
        yield
        return
    with tempfile.TemporaryFile(prefix="graphopt-stderr-") as sink:
        forward = _Forward(sink.fileno(), saved)
        os.dup2(sink.fileno(), 2)
        forward.start()
        try:
            yield
        finally:
            _flush()  # what Python buffered during the call goes through the filter too
            os.dup2(saved, 2)
            forward.done.set()
            forward.join()
            os.close(saved)


class _DropKnown(logging.Filter):
    """On a logger: drops its records that match ``NOISE_LOGS`` (a logger's filter sees the
    records logged on it, so it goes on the logger that logs them)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad record is the handler's to report
            return True
        return not any(record.name == name and p.match(message) for name, p in NOISE_LOGS)


@contextlib.contextmanager
def _python_quiet() -> Iterator[None]:
    """Known warnings ignored and known log records dropped, for the block."""
    root = logging.getLogger()
    handlers, drop = list(root.handlers), _DropKnown()
    loggers = [logging.getLogger(None if name == "root" else name)
               for name in dict.fromkeys(name for name, _ in NOISE_LOGS)]
    with warnings.catch_warnings():
        for category, message in NOISE_WARNINGS:
            warnings.filterwarnings("ignore", message=message, category=category)
        for logger in loggers:
            logger.addFilter(drop)
        try:
            yield
        finally:
            for logger in loggers:
                logger.removeFilter(drop)
            if not handlers:  # logging.warning() configured a bare root: undo it
                for handler in [h for h in root.handlers if h not in handlers]:
                    root.removeHandler(handler)
                    handler.close()


@contextlib.contextmanager
def _outermost(kind: str) -> Iterator[bool]:
    with _lock:
        _depth[kind] += 1
        first = _depth[kind] == 1
    try:
        yield first
    finally:
        with _lock:
            _depth[kind] -= 1


@contextlib.contextmanager
def library_quiet(*, stderr: bool = True) -> Iterator[None]:
    """The known library noise dropped for the block (module docstring); everything else
    passes. ``stderr=False``: warnings and logging only, fd 2 left alone (a call with no
    C-level output, where swapping a process-wide descriptor buys nothing)."""
    if verbose():
        yield
        return
    with contextlib.ExitStack() as stack:
        if stack.enter_context(_outermost("python")):
            stack.enter_context(_python_quiet())
        if stderr and stack.enter_context(_outermost("fd")):
            stack.enter_context(_filtered_stderr())
        yield


@contextlib.contextmanager
def silenced_fds(*fds: int, to: int | None = None) -> Iterator[None]:
    """Each of ``fds`` pointed at ``os.devnull`` (or at descriptor ``to``) for the block, and
    back after; a descriptor that is not open is left alone (embedded interpreters)."""
    saved: list[tuple[int, int]] = []
    _flush()
    with open(os.devnull, "w") as null:
        target = null.fileno() if to is None else to
        try:
            for fd in fds:
                try:
                    saved.append((fd, os.dup(fd)))
                except OSError:
                    continue
                os.dup2(target, fd)
            yield
        finally:
            _flush()
            for fd, copy in reversed(saved):
                os.dup2(copy, fd)
                os.close(copy)
