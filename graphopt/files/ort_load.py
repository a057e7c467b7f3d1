"""An ONNX Runtime session of a ModelProto with its large weights handed over in memory.

Why: ``optimize`` builds 7-10 sessions of one model (the reference, the guard's probe and
checks, the timings, the deploy candidate). Serialized whole, each one copies every weight
twice (to bytes, then into ORT) and parses them. Here the proto ORT parses holds only the graph
and the small tensors; each tensor of at least :data:`IN_MEMORY_BYTES` is declared external
and given to ORT as an ``OrtValue`` over one copy of its bytes
(``SessionOptions.add_external_initializers``). ``benchmarks/bench_ort_load.py``: GPT-2 4L's
INT8 model (198 MB) builds in 0.26-0.33 s instead of 0.61-0.82 s, and runs as fast; the
outputs are the same (``tests/test_ort_load.py``).

ORT reads those buffers for the session's life, so the session keeps them
(:data:`KEEP_ATTR`). ``options`` must be a fresh ``SessionOptions`` (every caller makes its own):
the initializers are added to it.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx

from graphopt.files.proto_copy import copy_except

__all__ = ["IN_MEMORY_BYTES", "IN_MEMORY_LOCATION", "KEEP_ATTR", "in_memory_session",
           "split_weights", "tensor_nbytes"]

#: a tensor at least this large goes to ORT in memory, not in the serialized proto
IN_MEMORY_BYTES = 1 << 16
#: the ``location`` of every stub :func:`split_weights` writes
IN_MEMORY_LOCATION = "graphopt-in-memory"
#: the session attribute holding the arrays and OrtValues ORT reads
KEEP_ATTR = "_graphopt_in_memory"
_T = onnx.TensorProto
_NUMPY = {_T.FLOAT: np.float32, _T.FLOAT16: np.float16, _T.DOUBLE: np.float64,
          _T.INT8: np.int8, _T.UINT8: np.uint8, _T.INT16: np.int16, _T.UINT16: np.uint16,
          _T.INT32: np.int32, _T.UINT32: np.uint32, _T.INT64: np.int64, _T.UINT64: np.uint64,
          _T.BOOL: np.bool_}


def tensor_nbytes(t: onnx.TensorProto) -> int:
    """A tensor's bytes from its dims and type (8 per element for a type ONNX does not size),
    without reading its data: reading ``raw_data`` copies it."""
    try:
        item = onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    except (KeyError, ValueError):
        item = 8
    return math.prod(t.dims) * item


def _in_memory(t: onnx.TensorProto, inputs: set[str]) -> bool:
    return (t.data_type in _NUMPY and t.name not in inputs and t.data_location != _T.EXTERNAL
            and t.HasField("raw_data") and tensor_nbytes(t) >= IN_MEMORY_BYTES)


def split_weights(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """(the model with its large raw tensors declared external, those tensors by name as
    arrays over the proto's bytes). Nothing is split on a big-endian host, nor a tensor whose
    bytes do not fit its dims (it stays in the proto, for the checker to report)."""
    g = model.graph
    inputs = {i.name for i in g.input}
    big = [t for t in g.initializer if _in_memory(t, inputs)] if sys.byteorder == "little" \
        else []
    if not big:
        return model, {}
    light = copy_except(model, onnx.ModelProto(), "graph")
    copy_except(g, light.graph, "initializer")
    names = {t.name for t in big}
    arrays: dict[str, np.ndarray] = {}
    for t in g.initializer:
        data = t.raw_data if t.name in names else b""
        if len(data) != tensor_nbytes(t):  # a small one, or bytes that do not fit its dims
            light.graph.initializer.append(t)  # (the checker says so)
            continue
        dtype = np.dtype(_NUMPY[t.data_type])
        arrays[t.name] = np.frombuffer(data, dtype=dtype).reshape(tuple(t.dims))
        stub = light.graph.initializer.add()
        stub.name, stub.data_type, stub.data_location = t.name, t.data_type, _T.EXTERNAL
        stub.dims.extend(t.dims)
        for key, value in (("location", IN_MEMORY_LOCATION), ("offset", "0"),
                           ("length", str(arrays[t.name].nbytes))):
            entry = stub.external_data.add()
            entry.key, entry.value = key, value
    return light, arrays


def in_memory_session(model: onnx.ModelProto, options: Any, providers: Sequence[Any]) -> Any:
    """``onnxruntime.InferenceSession`` of ``model`` (module docstring); ``options`` a fresh
    ``SessionOptions`` or None."""
    import onnxruntime as ort

    light, arrays = split_weights(model)
    if options is None:
        options = ort.SessionOptions()
    values = [ort.OrtValue.ortvalue_from_numpy(a) for a in arrays.values()]
    if arrays:
        options.add_external_initializers(list(arrays), values)
    session = ort.InferenceSession(light.SerializeToString(), options,
                                   providers=list(providers))
    setattr(session, KEEP_ATTR, (arrays, values))
    return session
