"""The compile config of the OpenVINO artifact: ``<model>.openvino.json`` beside the ONNX model,
the settings ``compile_model`` takes that the model file cannot hold.

The inference precision is a compile-time setting, not part of any model file (ONNX or
OpenVINO IR), so it travels here; the folder's loader compiles with it. Every field is checked
when the file is read: a folder moved between machines, or edited, must not compile with a
setting graphopt never wrote.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphopt.decisions.deploy.openvino import OV_PRECISIONS
from graphopt.errors import GraphoptError
from graphopt.files.read import read_small_json

__all__ = ["CONFIG_SUFFIX", "MAX_THREADS", "CompileConfig", "compile_config_path",
           "read_compile_config", "render_compile_config"]

CONFIG_SUFFIX = ".openvino.json"
#: a thread count above this is no machine's (the ONNX session config's bound too)
MAX_THREADS = 1024
_MAX_BYTES = 1 << 20  # the file is a few hundred bytes
_FIELDS = ("inference_precision", "num_threads", "reason")


@dataclass(frozen=True)
class CompileConfig:
    """``inference_precision``: OpenVINO's ``INFERENCE_PRECISION_HINT`` (``f32``/``bf16``);
    ``num_threads``: ``INFERENCE_NUM_THREADS`` (None: OpenVINO's default, one per physical
    core, as ONNX Runtime's); ``reason``: why that precision."""

    inference_precision: str = "f32"
    num_threads: int | None = None
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"inference_precision": self.inference_precision,
                "num_threads": self.num_threads, "reason": self.reason}

    @classmethod
    def from_dict(cls, data: Any, source: str = "the compile config") -> CompileConfig:
        """The config ``data`` holds; GraphoptError naming ``source`` and the field."""
        fix = (f"write the folder again with graphopt optimize ... -o DIR/ (or "
               f"Optimized.save_deploy); {source} is graphopt's, not edited by hand")
        if not isinstance(data, dict):
            raise GraphoptError(f"{source} is {type(data).__name__}, not a JSON object", fix)
        unknown = sorted(str(k)[:40] for k in data if k not in _FIELDS)
        if unknown:
            raise GraphoptError(f"{source}: field {unknown[0]!r} is not one graphopt writes "
                                f"(the fields are: {', '.join(_FIELDS)})", fix)
        precision = data.get("inference_precision", "f32")
        if precision not in OV_PRECISIONS:
            raise GraphoptError(f"{source}: inference_precision is {_short(precision)}, not "
                                f"one of {', '.join(OV_PRECISIONS)}", fix)
        threads = data.get("num_threads")
        if threads is not None and (type(threads) is not int or
                                    not 1 <= threads <= MAX_THREADS):
            raise GraphoptError(f"{source}: num_threads is {_short(threads)}, not null or a "
                                f"thread count from 1 to {MAX_THREADS}", fix)
        reason = data.get("reason", "")
        if not isinstance(reason, str):
            raise GraphoptError(f"{source}: reason is {_short(reason)}, not a string", fix)
        return cls(precision, threads, reason)


def _short(v: Any) -> str:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def compile_config_path(model_path: str | os.PathLike[str]) -> Path:
    """``model.onnx`` -> ``model.openvino.json``."""
    p = Path(model_path)
    return p.with_name((p.stem if p.suffix else p.name) + CONFIG_SUFFIX)


def render_compile_config(config: CompileConfig) -> str:
    return json.dumps(config.to_dict(), indent=1, sort_keys=True) + "\n"


def read_compile_config(path: Path) -> CompileConfig:
    """The compile config at ``path``; GraphoptError naming the file when it is missing, not a
    regular small file, not JSON or not a config graphopt writes."""
    fix = "write the folder again with graphopt optimize ... -o DIR/ (or Optimized.save_deploy)"
    if not path.exists() and not path.is_symlink():
        raise GraphoptError(f"the OpenVINO compile config {path} is missing (a graphopt "
                            "OpenVINO folder always has one: its inference precision)", fix)
    data = read_small_json(path, _MAX_BYTES, f"the OpenVINO compile config {path}", fix,
                           "graphopt writes a few hundred bytes")
    return CompileConfig.from_dict(data, f"the OpenVINO compile config {path}")
