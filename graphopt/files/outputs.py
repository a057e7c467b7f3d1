"""Outputs are written whole or not at all, and never over the user's inputs.

A command that writes several files (a model, its session config, three reports) writes them as
one :class:`OutputSet`:

1. Every path is checked before any work is written (and, in the CLI, before the slow work
   starts): an empty path, a folder, a read-only file, the same path twice (two claims of one
   file, whatever each is for), a path inside another output's path, or a path that is one of
   the inputs (the same file by realpath, symlink or hard link, e.g. ``-o model.onnx`` or the
   model's external-data file) is refused with an error naming both. A file the work may or may
   not write (which artifact a deploy folder gets is known only after it) is *reserved*
   (:meth:`OutputSet.reserve`): no other output may claim it. Paths are made absolute when
   claimed, before any user code runs: a model builder that calls ``os.chdir`` cannot send a
   report onto another file. The checks run again right before the files are moved into
   place, so a link made meanwhile (by user code) is caught too.
2. Each file is staged as a temp file beside its target, so a failing write (disk full, a
   ``/proc`` path, a render error) leaves nothing behind; staging one target twice is refused
   (the second temp file would replace the first in the set and outlive it). Used as a context
   manager (``with OutputSet(...) as outputs:``), the set removes its temp files when anything
   raises before the commit (a later step's error, Ctrl-C).
3. :meth:`OutputSet.commit` renames the staged files into place; if a rename fails, the files
   already replaced are restored from hard-link backups and new ones removed.

New files get the mode the umask allows (``open()``'s 0666 & ~umask); a replaced file keeps its
mode.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from graphopt.errors import GraphoptError

__all__ = ["OutputSet", "same_file"]

PathLike = str | os.PathLike[str]


def _umask() -> int:
    mask = os.umask(0o022)  # the only portable way to read it is to set it
    os.umask(mask)
    return mask


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()  # follows symlinks: a link to an input is that input
    except OSError:
        return None
    return st.st_dev, st.st_ino


def same_file(a: PathLike, b: PathLike) -> bool:
    """True when ``a`` and ``b`` name one file (same path, symlink or hard link)."""
    pa, pb = Path(a), Path(b)
    if os.path.realpath(pa) == os.path.realpath(pb):
        return True
    ia = _identity(pa)
    return ia is not None and ia == _identity(pb)


class OutputSet:
    """The files one command writes, checked up front and committed together.

    Args:
        protect: the command's input files (model, external data, calibration data...); no
            output may resolve to one of them.
    """

    def __init__(self, protect: Iterable[PathLike] = ()) -> None:
        self._protect = [_absolute(p) for p in protect]
        self._targets: dict[Path, str] = {}  # claimed target -> what it is ("report", ...)
        self._reserved: dict[Path, str] = {}  # reserved target -> what may claim it
        self._given: dict[str, Path] = {}  # the path as the caller spelled it -> its target
        self._staged: dict[Path, Path] = {}  # target -> temp file beside it
        self._made_dirs: list[Path] = []  # folders this set created, removed on abort

    def __enter__(self) -> OutputSet:
        return self

    def __exit__(self, kind: object, error: object, tb: object) -> None:
        if kind is not None:  # the work failed before commit: no temp file outlives it
            self.abort()

    def claim(self, path: PathLike, what: str = "output") -> Path:
        """Check that ``path`` may be written and reserve it; returns it as an absolute Path
        (relative to the folder current now, whatever runs later). A path another output holds
        (claimed or reserved), or one inside another's path, is refused; a reservation made for
        this ``what`` becomes the claim."""
        target = _given_target(path, what)
        mine = self._reserved.pop(target, None)
        try:
            if mine not in (None, what):
                raise GraphoptError(f"two outputs go to the same file: the {mine} {target} and "
                                    f"the {what} {target}", "give each output its own path")
            self._refuse_clash(target, what)
            self._check(target, os.fspath(path), what)
        except GraphoptError:
            if mine is not None:
                self._reserved[target] = mine
            raise
        self._targets[target] = what
        self._given[os.fspath(path)] = target
        return target

    def reserve(self, path: PathLike, what: str) -> Path:
        """Hold ``path`` for a ``what`` the work may write there (claimed then with this
        ``what``): no other output may claim it, nor a path inside it. Its own checks run when
        it is claimed. Reserving it again for the same ``what`` does nothing."""
        target = _given_target(path, what)
        if self._reserved.get(target) == what or self._targets.get(target) == what:
            return target
        self._refuse_clash(target, what)
        self._reserved[target] = what
        return target

    def hold(self, path: PathLike, what: str) -> Path:
        """The target of this ``what``'s own earlier claim of ``path`` (a command claims its
        artifact before the work, and stages it after), else :meth:`claim` it now: a path
        another output claimed (a report on the model's path) is refused, not shared."""
        target = self._given.get(os.fspath(path)) or _absolute(path)
        if self._targets.get(target) == what:
            return target
        return self.claim(path, what)

    def _refuse_clash(self, target: Path, what: str) -> None:
        """Refuse ``target`` when it is, is inside, or holds another output's path."""
        for other, other_what in (*self._targets.items(), *self._reserved.items()):
            if same_file(target, other):
                raise GraphoptError(f"two outputs go to the same file: the {other_what} "
                                    f"{other} and the {what} {target}",
                                    "give each output its own path")
            inner = _inside(target, other) or _inside(other, target)
            if inner:
                inner_what, outer_what = (what, other_what) if inner[0] == target else \
                    (other_what, what)
                raise GraphoptError(f"the {inner_what} path {inner[0]} is inside the "
                                    f"{outer_what} path {inner[1]}: writing one would destroy "
                                    "the other", "give each output its own path, outside "
                                    "the others")

    def _check(self, target: Path, given: str, what: str) -> None:
        """Refuse a target that is an input, a folder, not a regular file or read-only."""
        for src in self._protect:
            if same_file(target, src):
                raise GraphoptError(
                    f"the {what} path {target} is the input file {src}: writing it would "
                    "destroy the input", "write the output to another path")
        if target.is_dir() or given.endswith(("/", os.sep)):
            raise GraphoptError(f"the {what} path {target} is a folder",
                                f"give a file path, e.g. {target / 'out'}{target.suffix}")
        folder = next((p for p in target.parents if p.exists()), None)
        if folder is not None and not folder.is_dir():
            raise GraphoptError(f"the {what} path {target} is inside {folder}, which is a file, "
                                "not a folder", "choose another path (or remove that file)")
        if target.exists() or target.is_symlink():
            if not target.is_file():
                raise GraphoptError(f"the {what} path {target} is not a regular file",
                                    "give a path to a regular file")
            if not os.access(target, os.W_OK) or not target.stat().st_mode & stat.S_IWUSR:
                raise GraphoptError(f"the {what} path {target} is read-only",
                                    "make it writable (chmod u+w) or choose another path")

    def resolve(self, path: PathLike) -> Path:
        """The absolute target ``path`` was claimed as (the folder current at the claim), or
        ``path`` made absolute now if it was not claimed."""
        return self._given.get(os.fspath(path)) or _absolute(path)

    def claim_each(self, paths: Iterable[PathLike | None], what: str = "output") -> None:
        """:meth:`claim` every path given (None skipped; "" is refused, never the current
        folder): a command refuses a bad path among its optional outputs before the work."""
        for path in paths:
            if path is not None:
                self.claim(path, what)

    def claimed(self, path: PathLike) -> bool:
        """Whether ``path`` (this exact path) was claimed already (a reservation is not a
        claim: writing a reserved path claims it, for the ``what`` it was reserved for)."""
        return os.fspath(path) in self._given or _absolute(path) in self._targets

    def write(self, path: PathLike, data: bytes | str, what: str = "output") -> Path:
        """Stage ``data`` for ``path`` (claimed now if it was not)."""
        payload = data.encode("utf-8") if isinstance(data, str) else data
        return self.write_with(path, lambda f: f.write_bytes(payload), what)

    def write_with(self, path: PathLike, writer: Callable[[Path], object],
                   what: str = "output") -> Path:
        """Stage ``path`` by calling ``writer(temp_path)``, a file in the target's folder."""
        try:
            if not self.claimed(path):
                self.claim(path, what)
        except BaseException:
            self.abort()
            raise
        target = self.resolve(path)
        if target in self._staged:  # its first temp file would be dropped from the set
            self.abort()
            raise GraphoptError(f"two outputs go to the same file: {target} (the {what} and "
                                f"the {self._targets.get(target, 'output')} staged before it)",
                                "give each output its own path")
        try:
            self._make_parents(target.parent)
            fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp",
                                            dir=target.parent)
            os.close(fd)
        except OSError as e:
            self.abort()
            raise GraphoptError(f"cannot write {target}: {e.strerror or e}",
                                "choose a writable output path") from None
        tmp = Path(tmp_name)
        self._staged[target] = tmp
        try:
            writer(tmp)
            os.chmod(tmp, (target.stat().st_mode & 0o7777) if target.is_file()
                     else 0o666 & ~_umask())
        except OSError as e:
            self.abort()
            raise GraphoptError(f"cannot write {target}: {e.strerror or e}",
                                "choose a writable output path with free space") from None
        except BaseException:
            self.abort()
            raise
        return target

    def abort(self) -> None:
        """Remove every staged temp file; nothing of this set reaches its target."""
        for tmp in self._staged.values():
            tmp.unlink(missing_ok=True)
        self._staged.clear()
        for folder in reversed(self._made_dirs):
            try:
                folder.rmdir()  # only if still empty
            except OSError:
                pass
        self._made_dirs.clear()

    def _make_parents(self, folder: Path) -> None:
        missing = []
        while not folder.exists() and folder != folder.parent:
            missing.append(folder)
            folder = folder.parent
        for d in reversed(missing):
            d.mkdir()
            self._made_dirs.append(d)

    def commit(self) -> list[Path]:
        """Move every staged file into place, all or none; returns the targets in order."""
        done: list[tuple[Path, Path | None]] = []  # (target, backup of the file it replaced)
        try:
            for target in self._staged:  # again: user code ran since the claim
                self._check(target, str(target), "output")
        except GraphoptError:
            self.abort()
            raise
        try:
            for target, tmp in self._staged.items():
                backup = _backup(target) if target.exists() else None
                done.append((target, backup))
                os.replace(tmp, target)
        except OSError as e:
            for target, backup in reversed(done):
                if backup is not None:
                    os.replace(backup, target)
                else:
                    target.unlink(missing_ok=True)
            self.abort()
            raise GraphoptError(f"cannot write {target}: {e.strerror or e}; no output was "
                                "written", "choose a writable output path") from None
        for _, backup in done:
            if backup is not None:
                backup.unlink(missing_ok=True)
        written = list(self._staged)
        self._staged.clear()
        self._made_dirs.clear()
        return written


def _given_target(path: PathLike, what: str) -> Path:
    """``path`` made absolute; an empty path (the current folder) is refused."""
    if not os.fspath(path):
        raise GraphoptError(f"the {what} path is empty", f"give the {what} a file path")
    return _absolute(path)


def _inside(inner: Path, outer: Path) -> tuple[Path, Path] | None:
    """(inner, outer) when ``inner`` is below ``outer`` (as given, or with links resolved)."""
    for a, b in ((inner, outer), (Path(os.path.realpath(inner)), Path(os.path.realpath(outer)))):
        if b in a.parents:
            return inner, outer
    return None


def _absolute(path: PathLike) -> Path:
    """``path`` made absolute against the current folder, links left as they are (a link to an
    input is caught by :func:`same_file`, which follows it)."""
    return Path(os.path.abspath(os.fspath(path)))


def _backup(target: Path) -> Path:
    """A second name for ``target``'s current content, to restore it if the commit fails."""
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".bak", dir=target.parent)
    os.close(fd)
    backup = Path(name)
    backup.unlink()
    try:
        os.link(target, backup)  # no copy where the file system has hard links
    except OSError:
        shutil.copy2(target, backup)
    return backup
