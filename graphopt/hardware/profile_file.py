"""A hardware profile as a JSON file: what ``graphopt calibrate`` writes and ``--target`` reads.

The file is :meth:`HardwareProfile.to_dict` plus a format tag, so ``graphopt targets --json``
and a calibration file read the same way. A target given as a path ending in ``.json`` is
loaded from here (``registry.get_target``).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from graphopt.errors import GraphoptError
from graphopt.hardware.profile import HardwareProfile, Link

__all__ = ["FORMAT", "is_profile_path", "load_profile", "profile_from_dict", "save_profile"]

FORMAT = "graphopt-hardware-profile/1"
_FIX = "write it again with `graphopt calibrate -o FILE.json`"


def is_profile_path(name: str) -> bool:
    """A target string that names a profile file rather than a table entry."""
    return name.strip().lower().endswith(".json")


def save_profile(profile: HardwareProfile, path: str | os.PathLike[str]) -> Path:
    """Write ``profile`` to ``path`` whole (a temporary file renamed over it) or not at all."""
    from graphopt._io import OutputSet

    outputs = OutputSet(())
    text = json.dumps({"format": FORMAT, **profile.to_dict()}, indent=2) + "\n"
    target = outputs.write(path, text, "hardware profile")
    outputs.commit()
    return target


def _link(d: Any, where: str) -> Link:
    if not isinstance(d, dict):
        raise ValueError(f"{where} is not an object")
    return Link(str(d["name"]), float(d["bandwidth_bytes_per_s"]), float(d["latency_s"]))


def _rates(d: Any, where: str) -> dict[str, float]:
    if not isinstance(d, dict):
        raise ValueError(f"{where} is not an object")
    out = {str(k): float(v) for k, v in d.items()}
    bad = [k for k, v in out.items() if not (math.isfinite(v) and v >= 0)]
    if bad:
        raise ValueError(f"{where}: {', '.join(bad)} must be finite and >= 0")
    return out


def profile_from_dict(d: dict[str, Any]) -> HardwareProfile:
    """The inverse of :meth:`HardwareProfile.to_dict`; a missing or malformed field raises
    ``ValueError`` naming it."""
    cc = d.get("compute_capability")
    major, _, minor = str(cc).partition(".") if cc else ("", "", "")
    peer = d.get("peer_link")
    kind = d["kind"]
    if kind not in ("cpu", "gpu"):
        raise ValueError(f"kind {kind!r} is neither 'cpu' nor 'gpu'")
    bandwidth = float(d["bandwidth_bytes_per_s"])
    if not bandwidth > 0:
        raise ValueError("bandwidth_bytes_per_s must be > 0")
    return HardwareProfile(
        name=str(d["name"]), display_name=str(d["display_name"]), kind=kind,
        vendor=str(d["vendor"]), generation=str(d["generation"]),
        peak_flops=_rates(d["peak_flops"], "peak_flops"),
        memory_bytes=int(d["memory_bytes"]), bandwidth_bytes_per_s=bandwidth,
        host_link=_link(d["host_link"], "host_link"), source=str(d["source"]),
        compute_capability=(int(major), int(minor)) if cc else None,
        sm_count=d.get("sm_count"), cores=d.get("cores"),
        vector_flops=_rates(d.get("vector_flops", {}), "vector_flops"),
        l2_bytes=d.get("l2_bytes"), smem_per_sm_bytes=d.get("smem_per_sm_bytes"),
        peer_link=None if peer is None else _link(peer, "peer_link"),
        capabilities=frozenset(str(c) for c in d.get("capabilities", ())),
        launch_overhead_s=float(d.get("launch_overhead_s", 5e-6)),
        op_overhead_s=_rates(d.get("op_overhead_s", {}), "op_overhead_s"),
        measured_rates=_rates(d.get("measured_rates", {}), "measured_rates"),
    )


def load_profile(path: str | os.PathLike[str]) -> HardwareProfile:
    """Read a profile file; a missing, unreadable or malformed file is a GraphoptError."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise GraphoptError(f"hardware profile {str(p)!r} does not exist",
                            f"check the path, or {_FIX}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise GraphoptError(f"cannot read hardware profile {str(p)!r}: {e}", _FIX) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise GraphoptError(f"{str(p)!r} is not a graphopt hardware profile (format {got!r}, "
                            f"expected {FORMAT!r})", _FIX)
    try:
        return profile_from_dict(data)
    except (KeyError, TypeError, ValueError) as e:
        what = f"missing field {e}" if isinstance(e, KeyError) else str(e)
        raise GraphoptError(f"hardware profile {str(p)!r} is malformed: {what}", _FIX) from None
