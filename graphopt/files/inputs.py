"""The files a model was read from: what no output of graphopt may overwrite.

An ``.onnx`` path brings its external-data files; ``file.py:function`` brings the ``.py``;
calibration data (an ``.npz`` or a folder of them) is read too. In-memory models have none.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from graphopt.errors import GraphoptError
from graphopt.frontends.onnx_safety import check_external_data, read_model
from graphopt.frontends.python_spec import is_python_spec

__all__ = ["input_files", "onnx_input_files"]


def onnx_input_files(path: str | os.PathLike[str]) -> list[Path]:
    """``path`` and the external-data files it references."""
    model_path = Path(path)
    files = [model_path]
    try:
        refs = check_external_data(read_model(model_path), model_path.parent)
    except GraphoptError:
        return files  # loading the model reports the problem with its own fix
    return files + sorted({r.path for r in refs})


def input_files(model: Any, calibration: Any = None) -> list[Path]:
    """The files ``model`` (and ``calibration``, when a path) are read from."""
    files: list[Path] = []
    if isinstance(model, (str, os.PathLike)):
        text = os.fspath(model)
        if is_python_spec(text):
            files.append(Path(text.rpartition(":")[0]))
        else:
            files += onnx_input_files(text)
    if isinstance(calibration, (str, os.PathLike)):
        cal = Path(calibration)
        files += sorted(cal.glob("*.npz")) if cal.is_dir() else [cal]
    return files
