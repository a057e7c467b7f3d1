"""Reading a small file a user names (a hardware profile, a session config), safely.

The path may name anything: a FIFO (``open`` would wait for a writer forever), a link to
``/dev/zero`` (read until memory runs out), a file swapped between the check and the open, or
one far larger than graphopt ever writes. :func:`read_small_file` refuses all of them with a
GraphoptError before or while reading, and reads at most ``limit`` bytes.
:func:`check_regular` says the same for a file another reader opens (ONNX Runtime, the .pt2
reader): what the path is, from a stat, without opening it.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from graphopt.errors import GraphoptError

__all__ = ["check_regular", "path_kind", "read_small_file", "read_small_json"]

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def _not_regular(what: str, mode: int, fix: str) -> GraphoptError:
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    return GraphoptError(f"{what} is {kind}, not a regular file (a symbolic link is followed)",
                         fix)


def path_kind(path: str | os.PathLike[str]) -> str | None:
    """What ``path`` is when it is not a regular file (links followed), from a stat, never an
    open: "a directory", "a named pipe (FIFO)", "a socket", "a symbolic link to nothing
    (TARGET)", "missing"...; None for a regular file."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            try:
                return f"a symbolic link to nothing ({os.readlink(path)[:200]})"
            except OSError:
                return "a symbolic link to nothing"
        return "missing"
    except OSError as e:
        return f"a path that cannot be examined ({e.strerror or e})"
    if stat.S_ISREG(st.st_mode):
        return None
    return next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")


def check_regular(path: str | os.PathLike[str], what: str, fix: str,
                  missing: str | None = None) -> None:
    """GraphoptError unless ``path`` is a regular file (links followed), naming what it is;
    ``missing``: the problem to say when nothing is there (default: "WHAT does not exist")."""
    kind = path_kind(path)
    if kind == "missing":
        raise GraphoptError(missing or f"{what} does not exist", fix)
    if kind is not None:
        raise GraphoptError(f"{what} is {kind}, not a regular file", fix)


def read_small_file(path: Path, limit: int, what: str, fix: str, typical: str) -> bytes:
    """The bytes of ``path``, a regular file (checked before and after opening; opened
    non-blocking, so a FIFO swapped in does not wait for a writer) of at most ``limit`` bytes.

    Args:
        what: the file as errors name it, e.g. ``"hardware profile 'cpu.json'"``.
        fix: what to do about it, for every error.
        typical: how big such a file really is, for the too-large error.
    """
    too_big = GraphoptError(f"{what} is larger than {limit // 2**20} MiB ({typical})",
                            f"check the path, or {fix}")
    try:
        st = os.stat(path)  # follows symbolic links: a link to /dev/zero is a character device
    except FileNotFoundError:
        if os.path.islink(path):  # a dangling link is there, and is not a file
            raise GraphoptError(f"{what} is {path_kind(path)}, not a regular file",
                                f"check the path, or {fix}") from None
        raise GraphoptError(f"{what} does not exist", f"check the path, or {fix}") from None
    except OSError as e:
        raise GraphoptError(f"cannot read {what}: {e}", fix) from None
    if not stat.S_ISREG(st.st_mode):
        raise _not_regular(what, st.st_mode, fix)
    if st.st_size > limit:
        raise too_big
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) |
                     getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise GraphoptError(f"cannot read {what}: {e}", fix) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):  # replaced between the stat and the open
            raise _not_regular(what, mode, fix)
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as e:
        raise GraphoptError(f"cannot read {what}: {e}", fix) from None
    finally:
        os.close(fd)
    if size > limit:  # grew after the stat
        raise too_big
    return b"".join(chunks)


def read_small_json(path: Path, limit: int, what: str, fix: str, typical: str) -> Any:
    """The JSON value in ``path`` (:func:`read_small_file`'s checks, then parsed); text that is
    not UTF-8 JSON, or nests too deep to parse, is a GraphoptError naming ``what``."""
    raw = read_small_file(path, limit, what, fix, typical)
    try:
        return json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise GraphoptError(f"cannot read {what}: {type(e).__name__}: {str(e)[:200]}",
                            fix) from None
