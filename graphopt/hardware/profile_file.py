"""A hardware profile as a JSON file: what ``graphopt calibrate`` writes and ``--target`` reads.

The file is :meth:`HardwareProfile.to_dict` plus a format tag, so ``graphopt targets --json``
and a calibration file read the same way. A target given as a path ending in ``.json`` is
loaded from here (``registry.get_target``).

A profile file may be hand-edited or come from elsewhere, so reading it trusts nothing: it must
be a regular file (not a FIFO, a device or a link to one) of at most ``MAX_PROFILE_BYTES``,
its JSON at most ``_MAX_DEPTH`` levels deep with no ``NaN``/``Infinity``, and every field of
the right type and in a physical range (rates > 0, memory > 0, latencies >= 0, all finite and
below bounds no device comes near), so that no cost computed from it divides by zero or
overflows. Unknown fields are ignored (with a warning), for files of a later version.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from graphopt.errors import GraphoptError
from graphopt.files.outputs import OutputSet
from graphopt.files.read import read_small_file
from graphopt.hardware.profile import HardwareProfile, Link

__all__ = ["FORMAT", "MAX_PROFILE_BYTES", "is_profile_path", "load_profile", "profile_from_dict",
           "profile_text", "read_profile_file", "save_profile"]

logger = logging.getLogger(__name__)

FORMAT = "graphopt-hardware-profile/1"
_FIX = "write it again with `graphopt calibrate -o FILE.json`"
#: a calibrated profile is a few KB (one overhead per op type); 1 MiB is far above any
MAX_PROFILE_BYTES = 1 << 20
_MAX_DEPTH = 16  # a profile nests 3 levels (the object, a link or rate map, a value)
_MAX_MEMORY = 2**60  # bytes: an exbibyte, beyond any device
_MAX_RATE = 1e24  # FLOP/s or bytes/s: a million times the fastest chip's peak
_MAX_SECONDS = 60.0  # a launch overhead or link latency, generously
_MAX_UNITS = 2**20  # SMs or cores
#: the keys of ``peak_flops``/``vector_flops`` (:class:`HardwareProfile`)
DTYPE_KEYS = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "int8", "int4", "fp4")
_CC = re.compile(r"^\d{1,2}\.\d{1,2}$")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")
_KNOWN = frozenset({"format", *HardwareProfile.__slots__})


def is_profile_path(name: str) -> bool:
    """A target string that names a profile file rather than a table entry."""
    return name.strip().lower().endswith(".json")


def profile_text(profile: HardwareProfile, extra: Mapping[str, Any] | None = None) -> str:
    """The file's text: the format tag, the profile's fields, then ``extra`` top-level fields
    (which :func:`read_profile_file` hands back when asked for by name)."""
    clash = sorted(set(extra or {}) & _KNOWN)
    if clash:
        raise ValueError(f"extra field(s) {clash} would overwrite the profile's own")
    return json.dumps({"format": FORMAT, **profile.to_dict(), **(extra or {})}, indent=2) + "\n"


def save_profile(profile: HardwareProfile, path: str | os.PathLike[str]) -> Path:
    """Write ``profile`` to ``path`` whole (a temporary file renamed over it) or not at all."""
    outputs = OutputSet(())
    target = outputs.write(path, profile_text(profile), "hardware profile")
    outputs.commit()
    return target


# ------------------------------------------------------------------------- field validation

def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _number(value: Any, field: str, low: float, high: float, rule: str) -> float:
    """``value`` as a float in [low, high]; a bool, a string or a non-finite number is not."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{field} = {_show(value)} is not a number")
    try:
        v = float(value)
    except OverflowError:
        v = math.inf
    if not (math.isfinite(v) and low <= v <= high):
        raise ValueError(f"{field} = {_show(value)} must be {rule}")
    return v


def _rate(value: Any, field: str) -> float:
    """FLOP/s or bytes/s: at least 1 (a zero rate divides by zero) and finite."""
    return _number(value, field, 1.0, _MAX_RATE, f"finite and > 0 (between 1 and {_MAX_RATE:g})")


def _seconds(value: Any, field: str) -> float:
    return _number(value, field, 0.0, _MAX_SECONDS,
                   f"finite and >= 0 (seconds, at most {_MAX_SECONDS:g})")


def _whole(value: Any, field: str, high: int) -> int:
    """A positive whole number up to ``high`` (an integral float like 8e10 is one too)."""
    v = _number(value, field, 1, high, f"a whole number from 1 to {high:.3g}")
    if v != int(v):
        raise ValueError(f"{field} = {_show(value)} must be a whole number")
    return int(v)


def _optional_whole(value: Any, field: str, high: int) -> int | None:
    return None if value is None else _whole(value, field, high)


def _text(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{field} = {_show(value)} is not a string")
    return value


def _object(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{field} = {_show(value)} is not an object")
    return value


def _field(d: dict[str, Any], key: str, where: str) -> Any:
    if key not in d:
        raise KeyError(f"{where}.{key}")
    return d[key]


def _link(d: Any, where: str) -> Link:
    d = _object(d, where)
    return Link(_text(_field(d, "name", where), f"{where}.name"),
                _rate(_field(d, "bandwidth_bytes_per_s", where), f"{where}.bandwidth_bytes_per_s"),
                _seconds(_field(d, "latency_s", where), f"{where}.latency_s"))


def _rates(d: Any, where: str, *, seconds: bool = False, dtypes: bool = False
           ) -> dict[str, float]:
    """A map of rates (or of seconds); ``dtypes``: its keys are peak-table dtypes."""
    out = {}
    for k, v in _object(d, where).items():
        if dtypes and k not in DTYPE_KEYS:
            raise ValueError(f"{where} has the key {_show(k)}, which is not a dtype "
                             f"(one of {', '.join(DTYPE_KEYS)})")
        out[k] = (_seconds if seconds else _rate)(v, f"{where}.{k}")
    return out


def _compute_capability(cc: Any) -> tuple[int, int] | None:
    if cc is None:
        return None
    if not isinstance(cc, str) or not _CC.match(cc):
        raise ValueError(f"compute_capability = {_show(cc)} is not MAJOR.MINOR like '9.0'")
    major, _, minor = cc.partition(".")
    return int(major), int(minor)


def _capabilities(value: Any) -> frozenset[str]:
    if not isinstance(value, list):
        raise ValueError(f"capabilities = {_show(value)} is not a list of names")
    return frozenset(_text(c, "capabilities[]") for c in value)


def profile_from_dict(d: dict[str, Any]) -> HardwareProfile:
    """The inverse of :meth:`HardwareProfile.to_dict`; a missing or malformed field raises
    ``ValueError`` (``KeyError`` when missing) naming it."""
    d = _object(d, "the profile")
    kind = d["kind"]
    if kind not in ("cpu", "gpu"):
        raise ValueError(f"kind {_show(kind)} is neither 'cpu' nor 'gpu'")
    peak = _rates(d["peak_flops"], "peak_flops", dtypes=True)
    if not peak:
        raise ValueError("peak_flops is empty: give the peak of at least one dtype")
    unknown = sorted(k for k in d if k not in _KNOWN)
    if unknown:
        logger.warning("hardware profile: ignoring unknown field(s) %s",
                       ", ".join(_show(k) for k in unknown[:5]))
    peer = d.get("peer_link")
    return HardwareProfile(
        name=_text(d["name"], "name"), display_name=_text(d["display_name"], "display_name"),
        kind=kind, vendor=_text(d["vendor"], "vendor"),
        generation=_text(d["generation"], "generation"), peak_flops=peak,
        memory_bytes=_whole(d["memory_bytes"], "memory_bytes", _MAX_MEMORY),
        bandwidth_bytes_per_s=_rate(d["bandwidth_bytes_per_s"], "bandwidth_bytes_per_s"),
        host_link=_link(d["host_link"], "host_link"), source=_text(d["source"], "source"),
        compute_capability=_compute_capability(d.get("compute_capability")),
        sm_count=_optional_whole(d.get("sm_count"), "sm_count", _MAX_UNITS),
        cores=_optional_whole(d.get("cores"), "cores", _MAX_UNITS),
        vector_flops=_rates(d.get("vector_flops", {}), "vector_flops", dtypes=True),
        l2_bytes=_optional_whole(d.get("l2_bytes"), "l2_bytes", _MAX_MEMORY),
        smem_per_sm_bytes=_optional_whole(d.get("smem_per_sm_bytes"), "smem_per_sm_bytes",
                                          _MAX_MEMORY),
        peer_link=None if peer is None else _link(peer, "peer_link"),
        capabilities=_capabilities(d.get("capabilities", [])),
        launch_overhead_s=_seconds(d.get("launch_overhead_s", 5e-6), "launch_overhead_s"),
        op_overhead_s=_rates(d.get("op_overhead_s", {}), "op_overhead_s", seconds=True),
        measured_rates=_rates(d.get("measured_rates", {}), "measured_rates"),
    )


# ------------------------------------------------------------------------------- the file

def _depth(text: str) -> int:
    """How deep the JSON nests (strings skipped); stops counting past ``_MAX_DEPTH``."""
    depth = deepest = 0
    for m in _BRACKET.finditer(_STRING.sub("", text)):
        depth += 1 if m.group() in "[{" else -1
        if depth > deepest:
            deepest = depth
            if deepest > _MAX_DEPTH:
                break
    return deepest


def _no_constant(name: str) -> Any:
    raise ValueError(f"it holds {name}, which is not a JSON number (every number must be "
                     "finite)")


def _parse(p: Path) -> Any:
    try:
        text = read_small_file(p, MAX_PROFILE_BYTES, f"hardware profile {str(p)!r}", _FIX,
                               "a profile is a few KB").decode("utf-8")
        if _depth(text) > _MAX_DEPTH:
            raise ValueError(f"it nests more than {_MAX_DEPTH} levels deep (a profile nests 3)")
        return json.loads(text, parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:  # JSONDecodeError too
        raise GraphoptError(f"cannot read hardware profile {str(p)!r}: {e}", _FIX) from None


def load_profile(path: str | os.PathLike[str]) -> HardwareProfile:
    """Read a profile file; a missing, unreadable, oversized or malformed file, or a field out
    of range, is a GraphoptError naming the file and the field."""
    return read_profile_file(path)[0]


def read_profile_file(path: str | os.PathLike[str], extra: frozenset[str] = frozenset()
                      ) -> tuple[HardwareProfile, dict[str, Any]]:
    """:func:`load_profile`, and the top-level fields named in ``extra`` (absent ones
    left out; their values unchecked: the caller checks them)."""
    p = Path(path)
    data = _parse(p)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise GraphoptError(f"{str(p)!r} is not a graphopt hardware profile (format "
                            f"{_show(got)}, expected {FORMAT!r})", _FIX)
    kept = {k: data.pop(k) for k in sorted(extra - _KNOWN) if k in data}
    try:
        return profile_from_dict(data), kept
    except (KeyError, TypeError, ValueError) as e:
        what = f"missing field {e}" if isinstance(e, KeyError) else str(e)
        raise GraphoptError(f"hardware profile {str(p)!r} is malformed: {what}", _FIX) from None
