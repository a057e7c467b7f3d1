"""Calibration data for ``--calibration F`` / ``calibration=``: the file format and its loader.

Format (one of):

1. ``F.npz`` with one array per model input, named like the input. An array with one more
   axis than the input holds batches along axis 0 (batch ``i`` is ``arr[i]``); an array with
   the input's rank is cut along axis 0 into batches of the input's static batch size (one
   batch if that dim is symbolic). Every input must give the same number of batches.
2. A directory of ``*.npz`` files, each one batch (arrays named like the inputs, with the
   inputs' ranks), read in file-name order.
3. In Python: a list of ``{input_name: array}`` dicts, one per batch.

Static dims must match the model's; values are converted to the input's dtype when the kinds
agree (float to float, int to int). Anything else is a GraphoptError that says what to fix.
"""

from __future__ import annotations

import logging
import os
import zipfile
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from graphopt.errors import GraphoptError

__all__ = ["GUARD_SAMPLES", "load_calibration"]

logger = logging.getLogger(__name__)

#: the guard measures on at most this many batches (each guard round runs them all); static
#: quantization calibrates on every batch
GUARD_SAMPLES = 8
_FIX = ("write an .npz with one array per model input (named like the input, batches along "
        "axis 0) or a directory of such .npz files, one batch each")


def _inputs(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    inits = {t.name for t in model.graph.initializer}
    return {vi.name: vi for vi in model.graph.input if vi.name not in inits}


def _spec(vi: onnx.ValueInfoProto) -> tuple[list[int | None], np.dtype]:
    tt = vi.type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
            for d in tt.shape.dim]
    return dims, np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type))


_ZIP_MAGIC, _NPY_MAGIC = b"PK\x03\x04", b"\x93NUMPY"


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    """The arrays of one ``.npz``; anything else (a ``.npy``, text, a damaged archive) is a
    GraphoptError naming the file and the format, never numpy's or zipfile's exception."""
    try:
        with path.open("rb") as f:
            head = f.read(len(_NPY_MAGIC))
    except OSError as e:
        raise GraphoptError(f"cannot read calibration file {path}: {e.strerror or e}",
                            _FIX) from None
    if head.startswith(_NPY_MAGIC):
        raise GraphoptError(f"calibration file {path} is a single .npy array, not an .npz "
                            "archive of named arrays", f"{_FIX}; e.g. np.savez('calib.npz', "
                            "<input name>=array)")
    if not head.startswith(_ZIP_MAGIC):
        raise GraphoptError(f"calibration file {path} is not an .npz archive (it does not "
                            "start like a zip file)", _FIX)
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise GraphoptError(f"cannot read calibration file {path}: it is a damaged or "
                            f"incomplete .npz archive ({e})", _FIX) from None
    odd = sorted(k for k, v in arrays.items() if not isinstance(v, np.ndarray))
    if odd:  # np.load hands back the raw bytes of zip members that are not .npy arrays
        raise GraphoptError(f"calibration file {path} is a zip archive with members that are "
                            f"not .npy arrays: {', '.join(odd)}", _FIX)
    return arrays


def _batches_of(name: str, arr: np.ndarray, dims: list[int | None]) -> list[np.ndarray]:
    if arr.ndim == len(dims) + 1:
        return list(arr)
    if arr.ndim == len(dims):
        b = dims[0] if dims else None
        if not b or arr.shape[0] == b:
            return [arr]
        if arr.shape[0] % b:
            raise GraphoptError(f"calibration array {name!r} has {arr.shape[0]} rows, not a "
                                f"multiple of the model's batch size {b}", _FIX)
        return [arr[i:i + b] for i in range(0, arr.shape[0], b)]
    raise GraphoptError(f"calibration array {name!r} has rank {arr.ndim}; input {name!r} has "
                        f"rank {len(dims)} (give rank {len(dims)} or {len(dims) + 1})", _FIX)


def _check(batch: dict[str, Any], specs: dict[str, tuple[list[int | None], np.dtype]],
           where: str) -> dict[str, np.ndarray]:
    missing = sorted(set(specs) - set(batch))
    if missing:
        raise GraphoptError(f"{where} has no array for model input(s) {', '.join(missing)} "
                            f"(it has: {', '.join(sorted(batch)) or 'nothing'})", _FIX)
    out = {}
    for name, (dims, dtype) in specs.items():
        arr = np.asarray(batch[name])
        if len(dims) != arr.ndim or any(d is not None and d != s
                                        for d, s in zip(dims, arr.shape, strict=True)):
            shown = ["?" if d is None else d for d in dims]
            raise GraphoptError(f"{where}: input {name!r} has shape {list(arr.shape)}, the model "
                                f"wants {shown}", _FIX)
        if arr.dtype != dtype:
            if arr.dtype.kind != dtype.kind and not (arr.dtype.kind in "iu" and dtype.kind in "iu"):
                raise GraphoptError(f"{where}: input {name!r} is {arr.dtype}, the model wants "
                                    f"{dtype}", _FIX)
            arr = arr.astype(dtype)
        out[name] = arr
    return out


def load_calibration(source: str | os.PathLike[str] | Sequence[dict[str, Any]],
                     model: onnx.ModelProto) -> list[dict[str, np.ndarray]]:
    """Batches ``{input: array}`` from a file, folder or list (formats 1-3), checked against
    ``model``'s inputs."""
    specs = {n: _spec(vi) for n, vi in _inputs(model).items()}
    if not isinstance(source, (str, os.PathLike)):
        batches = [_check(dict(b), specs, f"calibration batch {i}") for i, b in enumerate(source)]
    else:
        path = Path(source)
        if path.is_dir():
            files = sorted(path.glob("*.npz"))
            if not files:
                raise GraphoptError(f"calibration folder {path} holds no .npz files", _FIX)
            batches = [_check(_read_npz(f), specs, f"calibration file {f.name}") for f in files]
        elif path.is_file():
            arrays = _read_npz(path)
            missing = sorted(set(specs) - set(arrays))
            if missing:
                raise GraphoptError(f"calibration file {path} has no array for model input(s) "
                                    f"{', '.join(missing)} (it has: {', '.join(sorted(arrays))})",
                                    _FIX)
            split = {n: _batches_of(n, arrays[n], specs[n][0]) for n in specs}
            counts = {n: len(b) for n, b in split.items()}
            if len(set(counts.values())) > 1:
                raise GraphoptError(f"calibration inputs give different batch counts: {counts}",
                                    _FIX)
            n_batches = next(iter(counts.values()), 0)
            batches = [_check({n: split[n][i] for n in specs}, specs, f"{path} batch {i}")
                       for i in range(n_batches)]
        else:
            raise GraphoptError(f"calibration data {path} does not exist", _FIX)
    if not batches:
        raise GraphoptError("the calibration data holds no batches", _FIX)
    logger.info("calibration: %d batch(es) for inputs %s", len(batches), ", ".join(specs))
    return batches
