"""This machine's CPU, calibrated once and cached: what ``target="cpu"`` plans with.

The detected host profile guesses its per-op fixed costs, rates and bandwidth, and predicts the
zoo at 0.08-0.28x of its measured time; a calibration (``measure.calibrate``) brings that to
0.8-1.1x. So a target that names this machine's CPU (``"cpu"``, ``"host"``) is replaced by a
calibration of this host kept in the user's cache folder, made on first use (about 10 s, one
line on stderr) and read on every later one. The rules:

1. **Which targets.** Only the names ``cpu`` and ``host``. A ``HardwareProfile`` or a profile
   file given explicitly is used as is; so are GPUs and table CPUs. With
   ``GRAPHOPT_HOST_ISA`` set (a stand-in ISA, ``hardware.detect``) the host is described as
   another CPU, which no measurement of this one matches: not calibrated.
2. **Where.** ``$XDG_CACHE_HOME/graphopt/`` (``~/.cache/graphopt/`` when unset or relative,
   as the XDG spec says), one file per key: ``host-<16 hex digits of the key's SHA-256>.json``,
   a profile file (``hardware.profile_file``) with the key beside its fields (``host_cache``).
3. **The key** is what changes the numbers: graphopt's calibration version
   (``calibrate.CALIBRATION_VERSION``), the CPU model and its ISA flags, the intra-op thread
   count, and the Python, torch, ONNX Runtime and OpenVINO versions (None: not installed;
   OpenVINO's fixed costs are measured where it is, ``calibrate_openvino``, so installing it
   remakes the calibration with its costs).
4. **Trust.** The file is read with the bounded, validated profile reader; one that is
   missing, unreadable, damaged, of another format, another key or not a calibration of this
   CPU is remade, never used. A calibration made while the CPU was busy (a load average above
   the CPU count, the test ``profile``'s own note uses: threads then wait for descheduled
   peers, and every number is of the neighbours) is used and cached but marked, and remade on
   a later use, at least ``_BUSY_RETRY_S`` after, that finds the CPU idle.
5. **Writes** go to a temp file in the same folder, fsynced, then renamed over the target, so
   a reader sees the old file or the new one, never part of one. The calibration runs under an
   exclusive lock (``host-<hash>.lock``, ``flock``): a second process waits, then reads what
   the first wrote, rather than calibrating at the same time (each would time the other).
6. **The way out:** ``GRAPHOPT_NO_CALIBRATE=1``, ``--no-calibrate`` on the CLI, or
   ``with host_calibration(False):`` in Python; then the uncalibrated host is used. If
   calibrating fails, or the folder cannot be written, the plan still goes on (uncalibrated,
   or calibrated for this process only) with a warning.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from graphopt.errors import GraphoptError
from graphopt.hardware.detect import HOST_ISA_ENV, host_cpu_profile
from graphopt.hardware.profile import HardwareProfile
from graphopt.hardware.profile_file import profile_text, read_profile_file
from graphopt.hardware.registry import HOST_NAMES, TargetSpec, is_this_machine
from graphopt.measure import calibrate as calibration
from graphopt.measure.calibrate_openvino import with_openvino_costs

__all__ = ["NO_CALIBRATE_ENV", "cache_folder", "cache_key", "cache_path", "cached_host_profile",
           "calibration_wanted", "default_threads", "host_calibration", "host_target"]

logger = logging.getLogger(__name__)

#: set to 1 (or true/yes/on) to plan "cpu" with the uncalibrated host
NO_CALIBRATE_ENV = "GRAPHOPT_NO_CALIBRATE"
_KEY_FIELD = "host_cache"
_MADE_FIELD = "host_cache_made"  # when, and the load average if the CPU was busy
#: a calibration made on a busy CPU is remade after this long, when the CPU is idle
_BUSY_RETRY_S = 600.0
#: how long a process waits for another one's calibration before making its own
_LOCK_WAIT_S = 120.0

#: path -> what this process made there but could not cache (a profile), or None when
#: calibrating failed: not tried again in this process
_unsaved: dict[Path, HardwareProfile | None] = {}

_wanted: contextvars.ContextVar[bool | None] = contextvars.ContextVar("host_calibration",
                                                                     default=None)


@contextlib.contextmanager
def host_calibration(enabled: bool) -> Iterator[None]:
    """Within the block, ``target="cpu"`` uses the cached calibration (``False``: never);
    it overrides ``GRAPHOPT_NO_CALIBRATE``. Per thread and task (a context variable)."""
    token = _wanted.set(bool(enabled))
    try:
        yield
    finally:
        _wanted.reset(token)


def calibration_wanted(calibrate: bool | None = None) -> bool:
    """``calibrate`` if given, else :func:`host_calibration`'s setting, else the env var."""
    if calibrate is not None:
        return calibrate
    if (inside := _wanted.get()) is not None:
        return inside
    return os.environ.get(NO_CALIBRATE_ENV, "").strip().lower() not in ("1", "true", "yes", "on")


def host_target(target: TargetSpec, *, threads: int | None = None,
                calibrate: bool | None = None) -> TargetSpec:
    """``target`` with each name of this machine's CPU (``"cpu"``, ``"host"``) replaced by
    its cached calibration (module doc, rule 1); anything else is handed back unchanged, for
    ``registry.resolve_targets`` to resolve and check.

    Args:
        threads: the intra-op threads the model will run with (default: torch's).
        calibrate: False: never calibrate; None: as :func:`calibration_wanted` says.
    """
    items = target.split(",") if isinstance(target, str) else target
    if isinstance(target, HardwareProfile) or not isinstance(items, Sequence) \
            or isinstance(items, (bytes, bytearray)):
        return target
    hosts = [isinstance(t, str) and t.strip().lower() in HOST_NAMES for t in items]
    if not any(hosts) or not calibration_wanted(calibrate) or os.environ.get(HOST_ISA_ENV):
        return target
    profile = cached_host_profile(threads)
    if isinstance(target, str) and len(items) == 1:
        return profile
    return [profile if host else t for t, host in zip(items, hosts, strict=True)]


def default_threads() -> int:
    """The intra-op threads torch runs with: its setting once imported; before, its default
    (``OMP_NUM_THREADS``, else ``MKL_NUM_THREADS``, else the physical cores), so that an ONNX
    plan finds the cache without importing torch."""
    if "torch" in sys.modules:
        return int(sys.modules["torch"].get_num_threads())
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        value = os.environ.get(var, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return host_cpu_profile().cores or os.cpu_count() or 1


def _version(*distributions: str) -> str | None:
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def cache_key(threads: int) -> dict[str, Any]:
    """What the calibrated numbers depend on (module doc, rule 3); read without importing
    torch."""
    host = host_cpu_profile()
    return {"calibration": calibration.CALIBRATION_VERSION, "cpu": _model(host),
            "isa": sorted(host.capabilities), "threads": int(threads),
            "python": ".".join(platform.python_version_tuple()[:2]),
            "torch": _version("torch"),
            "onnxruntime": _version("onnxruntime", "onnxruntime-gpu", "onnxruntime-openvino"),
            "openvino": _version("openvino")}


def cache_folder() -> Path:
    """``$XDG_CACHE_HOME/graphopt``; ``~/.cache/graphopt`` when it is unset or relative."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".cache"
    return root / "graphopt"


def cache_path(key: dict[str, Any]) -> Path:
    """The file of one key: ``host-<16 hex digits of its SHA-256>.json``."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_folder() / f"host-{digest}.json"


def cached_host_profile(threads: int | None = None) -> HardwareProfile:
    """This host calibrated with ``threads`` intra-op threads (default: torch's): read from
    the cache, or measured now and cached (module doc)."""
    host = host_cpu_profile()
    key = cache_key(threads or default_threads())
    path = cache_path(key)
    if path in _unsaved:
        return _unsaved[path] or host
    if (found := _read(path, key)) is not None:
        return found
    with _locked(path.with_suffix(".lock")):
        if (found := _read(path, key)) is not None:  # made by another process meanwhile
            return found
        profile = _make(path, key)
    return profile or host


def _model(profile: HardwareProfile) -> str:
    return profile.display_name.split(" (host")[0]


def _read(path: Path, key: dict[str, Any]) -> HardwareProfile | None:
    """The cached profile at ``path`` if it is whole, of ``key`` and of this CPU; else None
    (logged: the caller remakes it)."""
    try:
        if not path.exists():
            return None
    except OSError as e:  # a path the OS refuses (too long, a file as a folder): made anew
        logger.warning("cannot read the host calibration cache at %s (%s): calibrating for "
                       "this run; set XDG_CACHE_HOME to a usable folder", path.parent,
                       e.strerror or e)
        return None
    try:
        profile, extra = read_profile_file(path, frozenset({_KEY_FIELD, _MADE_FIELD}))
    except GraphoptError as e:
        logger.info("host calibration cache: remaking %s: %s", path, e.problem)
        return None
    problem = ("it was made for another key" if extra.get(_KEY_FIELD) != key else
               "it is not a calibration of this CPU" if not (
                   profile.calibrated and is_this_machine(profile)) else
               _stale(extra.get(_MADE_FIELD)))
    if problem:
        logger.info("host calibration cache: remaking %s: %s", path, problem)
        return None
    logger.debug("host calibration cache: %s", path)
    return profile


def _busy() -> float | None:
    """The 1-minute load average if it is above the CPU count (the CPU is busy), else None."""
    try:
        load, cpus = os.getloadavg()[0], os.cpu_count() or 1
    except OSError:  # not on every platform
        return None
    return load if load > cpus else None


def _stale(made: Any) -> str | None:
    """Why a cached calibration made while the CPU was busy is remade now, or None."""
    if not isinstance(made, dict) or not isinstance(made.get("busy_load"), (int, float)):
        return None
    when = made.get("time")
    age = time.time() - when if isinstance(when, (int, float)) else _BUSY_RETRY_S
    if age < _BUSY_RETRY_S or _busy() is not None:
        return None
    return (f"it was made while the CPU was busy (load {made['busy_load']:.1f}) and the CPU "
            "is idle now")


def _measure(threads: int) -> HardwareProfile:
    """The calibration itself, OpenVINO's costs included where it is installed (tests replace
    it)."""
    return with_openvino_costs(calibration.calibrate(threads=threads), threads)


def _make(path: Path, key: dict[str, Any]) -> HardwareProfile | None:
    """Calibrate (one line on stderr) and write the cache; None if calibrating failed."""
    line = (f"graphopt: calibrating this CPU for target 'cpu' with {key['threads']} "
            f"thread(s), once (about 10 s; cached in {path.parent}; "
            f"{NO_CALIBRATE_ENV}=1 or --no-calibrate skips it)")
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
    logger.info("%s", line)
    started, busy = time.perf_counter(), _busy()
    try:
        profile = _measure(key["threads"])
    except Exception as e:  # noqa: BLE001 - the plan goes on without the measurements
        logger.warning("calibrating this CPU failed (%s: %s); planning with the uncalibrated "
                       "host profile", type(e).__name__, e)
        _unsaved[path] = None
        return None
    logger.info("host calibration: %.1f s", time.perf_counter() - started)
    busy = max(busy or 0.0, _busy() or 0.0) or None
    if busy:
        logger.warning("the CPU was busy while calibrating (load %.1f on %d CPUs): its numbers "
                       "include waits for other jobs; they are cached until a later run finds "
                       "the CPU idle", busy, os.cpu_count() or 1)
    made = {"time": round(time.time()), "busy_load": busy}
    try:
        _write_atomic(path, profile_text(profile, {_KEY_FIELD: key, _MADE_FIELD: made}))
    except OSError as e:
        logger.warning("cannot cache the host calibration in %s (%s): it is used for this "
                       "run only; set XDG_CACHE_HOME to a writable folder", path.parent,
                       e.strerror or e)
        _unsaved[path] = profile
    return profile


def _write_atomic(path: Path, text: str) -> None:
    """``text`` to ``path`` through a temp file in its folder, fsynced and renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` for the block, waited for up to ``_LOCK_WAIT_S``;
    without one (no fcntl, a read-only folder, the wait over) the block runs anyway."""
    try:
        import fcntl

        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    except (ImportError, OSError) as e:
        logger.debug("host calibration cache: no lock (%s)", e)
        yield
        return
    try:
        deadline, waited = time.monotonic() + _LOCK_WAIT_S, False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not waited:
                    logger.info("waiting for another process calibrating this CPU (%s)", path)
                    waited = True
                if time.monotonic() > deadline:
                    logger.warning("another process has held %s for %.0f s: calibrating "
                                   "without waiting for it", path, _LOCK_WAIT_S)
                    break
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # releases the lock
