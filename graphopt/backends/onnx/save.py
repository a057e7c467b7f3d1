"""Write an optimized ONNX model and its session config as one set, never over an input.

A model under protobuf's 2 GiB limit is one file; a larger one is saved with its weights in
``<name>.data`` beside it. The model, its data file and ``<name>.graphopt.json`` are staged in
one :class:`graphopt.files.outputs.OutputSet`, so a failure leaves no partial set, and no output
may be the input model or one of its external-data files.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import onnx

from graphopt.backends.onnx.session import config_path, render_config
from graphopt.decisions.memory_runtime.ort_session import SessionConfig
from graphopt.files.outputs import OutputSet

__all__ = ["PROTO_LIMIT", "claim_onnx", "save_onnx", "stage_onnx"]

PROTO_LIMIT = 1_800_000_000  # protobuf refuses messages over 2 GiB


def claim_onnx(outputs: OutputSet, path: str | os.PathLike[str],
               model: onnx.ModelProto | None = None) -> None:
    """Claim the model path, its config path and (for a large model) its data path (again:
    the paths this set claimed for them before; another output's path is refused)."""
    target = Path(path)
    outputs.hold(target, "model")
    outputs.hold(config_path(target), "session config")
    if model is not None and model.ByteSize() >= PROTO_LIMIT:
        outputs.hold(target.with_name(f"{target.name}.data"), "model data")


def stage_onnx(outputs: OutputSet, model: onnx.ModelProto, path: str | os.PathLike[str],
               session: SessionConfig | dict[str, Any] | None = None) -> None:
    """Stage the model (and its config when ``session`` is given) into ``outputs``."""
    target = outputs.resolve(path)  # absolute as claimed: user code may have changed folder
    cfg = None
    if session is not None:
        cfg = session if isinstance(session, SessionConfig) else SessionConfig.from_dict(session)
    if model.ByteSize() < PROTO_LIMIT:
        outputs.write(target, model.SerializeToString(), "model")
    else:
        data = f"{target.name}.data"
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            onnx.save_model(model, str(Path(tmp) / target.name), save_as_external_data=True,
                            location=data)
            outputs.write_with(target, lambda t: os.replace(Path(tmp) / target.name, t),
                               "model")
            outputs.write_with(target.with_name(data), lambda t: os.replace(Path(tmp) / data, t),
                               "model data")
    if cfg is not None:
        outputs.write(config_path(target), render_config(cfg), "session config")


def save_onnx(model: onnx.ModelProto, path: str | os.PathLike[str],
              session: SessionConfig | dict[str, Any] | None = None, *,
              protect: list[Path] | tuple[Path, ...] = ()) -> Path:
    """Write the model and its session config ``<name>.graphopt.json``, all or nothing;
    ``protect``: input files the outputs must not replace."""
    with OutputSet(protect) as outputs:
        claim_onnx(outputs, path, model)
        stage_onnx(outputs, model, path, session)
        outputs.commit()
    return Path(path)
