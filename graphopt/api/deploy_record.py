"""``deploy.json``, read back: every field graphopt writes there, checked for its type and range.

The loader acts on two fields (``artifact``, ``compile_mode``); the file names it reads are
fixed by the artifact (``file``, and ``session_config`` or ``compile_config``, the OpenVINO
artifact's inference precision, checked in its own file); the rest say what was decided
and why. Each is checked all the same: a folder moved between machines, or edited, must not
load with a field that says one thing while the loader does another (``"file": "../x.pt2"``:
the file is fixed by the artifact), and a field graphopt never writes (``"device": "cuda"``)
is refused rather than silently ignored.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from graphopt.decisions.deploy.artifact import ARTIFACTS
from graphopt.errors import GraphoptError
from graphopt.files.read import read_small_json

__all__ = ["COMPILE_MODES", "DEPLOY_FILE", "FILES", "read_record"]

DEPLOY_FILE = "deploy.json"
#: each artifact's file in a deploy folder (fixed: deploy.json never names a path)
FILES = {"torch": "model.pt2", "torch.compile": "model.pt2", "onnxruntime": "model.onnx",
         "openvino": "model.onnx"}
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
_SESSION_CONFIG = "model.graphopt.json"
_COMPILE_CONFIG = "model.openvino.json"
#: a settings file beside the model -> (its fixed name, the one artifact that has it)
_SETTINGS = {"session_config": (_SESSION_CONFIG, "onnxruntime"),
             "compile_config": (_COMPILE_CONFIG, "openvino")}


def _text(v: Any) -> bool:
    return isinstance(v, str)


def _seconds(v: Any) -> bool:
    """null or a finite number >= 0 (json reads NaN and Infinity)."""
    return v is None or (type(v) in (int, float) and math.isfinite(v) and v >= 0)


def _candidate(c: Any) -> bool:
    if not isinstance(c, dict) or not set(c) <= {"artifact", "seconds", "within", "note",
                                                 "error"}:
        return False
    return (c.get("artifact") in ARTIFACTS and _seconds(c.get("seconds"))
            and c.get("within") in (None, True, False)
            and all(c.get(k) is None or _text(c.get(k)) for k in ("note", "error")))


#: field -> (check, what it must be)
_FIELDS: dict[str, tuple[Any, str]] = {
    "load": (_text, "a string"),
    "measured": (lambda v: isinstance(v, bool), "true or false"),
    "reason": (_text, "a string"),
    "method": (_text, "a string"),
    "original_s": (_seconds, "null or a number of seconds >= 0"),
    "speedup_vs_torch_module": (_seconds, "null or a ratio >= 0"),
    "speedup_vs_original": (_seconds, "null or a ratio >= 0"),
    "candidates": (lambda v: isinstance(v, list) and len(v) <= 4 * len(ARTIFACTS)
                   and all(_candidate(c) for c in v),
                   "a list of {artifact, seconds, within, note, error}"),
}


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def read_record(folder: Path, limit: int, fix: str) -> dict[str, Any]:
    """``folder``'s ``deploy.json``: a regular small file naming a known artifact, each of its
    fields of the type and range graphopt writes; GraphoptError naming the field and file."""
    path = folder / DEPLOY_FILE
    if not path.exists() and not path.is_symlink():
        raise GraphoptError(f"{folder} is a folder without {DEPLOY_FILE}: not a graphopt deploy "
                            "folder", "give the .pt2 file, or a folder graphopt optimize -o DIR/ "
                            "wrote")
    record = read_small_json(path, limit, f"the deploy record {path}", fix, "a few kB")
    if not isinstance(record, dict) or record.get("artifact") not in ARTIFACTS:
        got = record.get("artifact") if isinstance(record, dict) else type(record).__name__
        raise GraphoptError(f"{path} names no artifact graphopt writes ({str(got)[:60]!r}; "
                            f"expected one of {', '.join(ARTIFACTS)})", fix)
    artifact = record["artifact"]
    if record.get("compile_mode", "default") not in COMPILE_MODES:
        raise GraphoptError(f"{path}: compile_mode {str(record.get('compile_mode'))[:60]!r} is "
                            f"not a torch.compile mode ({', '.join(COMPILE_MODES)})", fix)
    fixed = {"file": FILES[artifact], **{k: name for k, (name, _) in _SETTINGS.items()}}
    for key, value in record.items():
        if key in ("artifact", "compile_mode"):
            continue
        if key in _SETTINGS and _SETTINGS[key][1] != artifact:
            raise GraphoptError(f"{path}: {key} is {_short(value)}; the {artifact} artifact "
                                f"has none (only {_SETTINGS[key][1]}'s has a {key})", fix)
        if key in fixed:
            if value != fixed[key]:
                raise GraphoptError(f"{path}: {key} is {_short(value)}; the {artifact} "
                                    f"artifact's is {fixed[key]!r} (the names are fixed, never "
                                    "read from the record)", fix)
        elif key not in _FIELDS:
            raise GraphoptError(f"{path}: field {_short(key)} is not one graphopt writes",
                                f"remove it (the fields are: artifact, file, compile_mode, "
                                f"{', '.join(_SETTINGS)}, {', '.join(_FIELDS)}), or {fix}")
        elif not _FIELDS[key][0](value):
            raise GraphoptError(f"{path}: {key} is {_short(value)}, not {_FIELDS[key][1]}", fix)
    return record
