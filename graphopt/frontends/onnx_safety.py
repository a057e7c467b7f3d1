"""Read an ONNX file without trusting it: path checks, protobuf sanity, confined external data.

A model file is user input. Its bytes may be truncated or not ONNX at all (``onnx.load`` accepts
some garbage), and its external-data ``location`` fields are paths chosen by whoever wrote the
file. So the protobuf is parsed without external data, checked for a graph and an opset, and every
external-data location is resolved (symlinks included) and must stay inside the model's folder
before a single byte of external data is read.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PureWindowsPath

import onnx

from graphopt.errors import ModelLoadError, UnsafePathError
from graphopt.frontends.python_spec import names_python_file, needs_function_error

__all__ = [
    "MIN_OPSET",
    "ExternalRef",
    "check_external_data",
    "check_structure",
    "default_opset",
    "iter_model_tensors",
    "load_external_data",
    "read_model",
    "uses_external_data",
]

logger = logging.getLogger(__name__)

#: Oldest ai.onnx opset graphopt reads: opset 13 moved Softmax to a last-axis default and
#: Squeeze/Unsqueeze/ReduceSum axes to inputs; older graphs would need a second set of rules.
MIN_OPSET = 13
#: Oldest opset read at all: older models are upgraded to MIN_OPSET (frontends/onnx_upgrade.py);
#: opset 1 is the first, so only a model that imports opset 0 or less is refused here.
OLDEST_OPSET = 1

_PROTOBUF_LIMIT = 2**31  # protobuf cannot parse a single message of 2 GiB or more
_CORRUPT_FIX = ("the file is corrupt or truncated: re-export or re-download it, then check it "
                "with `python -c \"import onnx; onnx.checker.check_model('model.onnx')\"`")
_UNSAFE_FIX = ("external data must live in the model's folder: move the data file next to the "
               ".onnx file and re-save with onnx.save_model(model, path, "
               "save_as_external_data=True, location='weights.bin'); do not load models from "
               "untrusted sources")


def read_model(path: Path) -> onnx.ModelProto:
    """Parse ``path`` (external data left on disk) and check it is a usable ONNX model."""
    if names_python_file(os.fspath(path)):  # `optimize model.py`: a spec without :function
        raise needs_function_error(os.fspath(path))
    if not path.exists() and path.suffix.lower() != ".onnx":
        raise ModelLoadError(f"{os.fspath(path)!r} names no file: a model is an .onnx file, "
                             "a 'file.py:function' builder, or a torch.nn.Module",
                             fix="give the .onnx path, 'model.py:build' (a function returning "
                                 "(module, example_inputs)), or the module itself")
    if not path.exists():
        raise ModelLoadError(f"ONNX model not found: {path}",
                             fix="check the path (relative paths start at the current folder)")
    if path.is_dir():
        found = sorted(p.name for p in path.glob("*.onnx"))[:3]
        hint = f" (it holds {', '.join(found)})" if found else ""
        raise ModelLoadError(f"{path} is a directory, not an ONNX file{hint}",
                             fix="pass the path of the .onnx file itself")
    if not path.is_file():
        raise ModelLoadError(f"{path} is not a regular file", fix="pass the path of a .onnx file")
    size = path.stat().st_size
    if size == 0:
        raise ModelLoadError(f"{path} is empty (0 bytes)",
                             fix="re-export or re-download the model; the write was cut off")
    with path.open("rb") as f:
        head = f.read(4)
    if head.startswith(b"PK"):
        raise ModelLoadError(f"{path} is a zip archive (a PyTorch checkpoint?), not ONNX",
                             fix="load the nn.Module with the torch frontend, or export it with "
                                 "torch.onnx.export first")
    try:
        model = onnx.load_model(os.fspath(path), load_external_data=False)
    except Exception as exc:  # DecodeError, ValueError, ...: never let a protobuf trace escape
        fix = _CORRUPT_FIX
        if size >= _PROTOBUF_LIMIT:
            fix = ("a single ONNX file cannot exceed 2 GB: save the weights as external data "
                   "(onnx.save_model(..., save_as_external_data=True))")
        raise ModelLoadError(f"{path} is not a valid ONNX model ({type(exc).__name__}: "
                             f"{str(exc)[:200]})", fix=fix) from exc
    check_structure(model, str(path))
    return model


def default_opset(model: onnx.ModelProto) -> int | None:
    """The ai.onnx opset the model imports, or None if it imports none."""
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    return None


def check_structure(model: onnx.ModelProto, where: str) -> None:
    """Reject what parses but is not a model: no graph, no nodes, no outputs, no or old opset."""
    if not model.HasField("graph") or not model.graph.node:
        raise ModelLoadError(f"{where} has no graph nodes", fix=_CORRUPT_FIX)
    if not model.graph.output:
        raise ModelLoadError(f"{where} has a graph with no outputs", fix=_CORRUPT_FIX)
    opset = default_opset(model)
    if opset is None:
        raise ModelLoadError(f"{where} imports no ai.onnx opset", fix=_CORRUPT_FIX)
    if opset < OLDEST_OPSET:
        raise ModelLoadError(
            f"{where} uses ai.onnx opset {opset}; graphopt reads opset {OLDEST_OPSET} or newer "
            f"(upgrading those below {MIN_OPSET} with onnx.version_converter)",
            fix="re-export with opset_version >= 13 (e.g. torch.onnx.export(..., "
                "opset_version=17))")


def _graph_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    yield from _node_tensors(graph.node)


def _node_tensors(nodes: Iterable[onnx.NodeProto]) -> Iterator[onnx.TensorProto]:
    for node in nodes:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("sparse_tensor"):
                yield attr.sparse_tensor.values
                yield attr.sparse_tensor.indices
            if attr.HasField("g"):
                yield from _graph_tensors(attr.g)
            for sub in attr.graphs:
                yield from _graph_tensors(sub)


def iter_model_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every TensorProto that can hold data: initializers, attributes, subgraphs, functions."""
    yield from _graph_tensors(model.graph)
    for func in model.functions:
        yield from _node_tensors(func.node)


def uses_external_data(model: onnx.ModelProto) -> bool:
    ext = onnx.TensorProto.EXTERNAL
    return any(t.data_location == ext for t in iter_model_tensors(model))


@dataclass(frozen=True, slots=True)
class ExternalRef:
    """One tensor's external data, its location already confined to the model's folder."""

    tensor: onnx.TensorProto
    path: Path
    offset: int
    length: int | None


def _confine(location: str, base: Path, tensor: str) -> Path:
    """Resolve ``location`` under ``base``; refuse absolute paths and escapes (``..``, symlinks)."""
    if not location:
        raise ModelLoadError(f"tensor {tensor!r} has external data without a location",
                             fix=_CORRUPT_FIX)
    win = PureWindowsPath(location)
    if "\x00" in location or os.path.isabs(location) or win.is_absolute() or win.drive \
            or location.startswith("\\"):
        raise UnsafePathError(f"external data of tensor {tensor!r} has the absolute location "
                              f"{location!r}", fix=_UNSAFE_FIX)
    resolved = Path(os.path.realpath(base / location))
    if os.path.commonpath([resolved, base]) != os.fspath(base):
        raise UnsafePathError(f"external data of tensor {tensor!r} points outside the model's "
                              f"folder: {location!r} resolves to {resolved}", fix=_UNSAFE_FIX)
    return resolved


def _int_entry(entries: dict[str, str], key: str, tensor: str) -> int | None:
    raw = entries.get(key)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ModelLoadError(f"tensor {tensor!r} has external data {key}={raw!r}",
                             fix=_CORRUPT_FIX)
    return value


def check_external_data(model: onnx.ModelProto, base_dir: str | os.PathLike[str]
                        ) -> list[ExternalRef]:
    """Validate every external-data reference; read nothing. Unsafe paths are checked first."""
    base = Path(os.path.realpath(base_dir))
    refs: list[ExternalRef] = []
    for t in iter_model_tensors(model):
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        entries = {e.key: e.value for e in t.external_data}
        path = _confine(entries.get("location", ""), base, t.name)
        refs.append(ExternalRef(t, path, _int_entry(entries, "offset", t.name) or 0,
                                _int_entry(entries, "length", t.name)))
    sizes: dict[Path, int] = {}
    for ref in refs:
        if ref.path not in sizes:
            if not ref.path.is_file():
                raise ModelLoadError(
                    f"external data file {ref.path.name!r} of tensor {ref.tensor.name!r} is "
                    f"missing from {base}",
                    fix="copy the data file next to the .onnx file (it must keep the name the "
                        "model records), or re-export the model")
            sizes[ref.path] = ref.path.stat().st_size
        end = ref.offset + (ref.length or 0)
        if ref.offset > sizes[ref.path] or end > sizes[ref.path]:
            raise ModelLoadError(
                f"external data file {ref.path.name!r} is too short for tensor "
                f"{ref.tensor.name!r} (needs bytes {ref.offset}..{end}, file has "
                f"{sizes[ref.path]})", fix=_CORRUPT_FIX)
    return refs


def load_external_data(model: onnx.ModelProto, base_dir: str | os.PathLike[str]) -> int:
    """Validate all references, then read them into ``model`` in place; returns bytes read."""
    refs = check_external_data(model, base_dir)
    by_file: dict[Path, list[ExternalRef]] = {}
    for ref in refs:
        by_file.setdefault(ref.path, []).append(ref)
    total = 0
    for path, group in by_file.items():
        # ``path`` is already resolved: O_NOFOLLOW refuses a symlink swapped in since the check.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as f:
            for ref in sorted(group, key=lambda r: r.offset):
                f.seek(ref.offset)
                data = f.read() if ref.length is None else f.read(ref.length)
                ref.tensor.raw_data = data
                ref.tensor.data_location = onnx.TensorProto.DEFAULT
                del ref.tensor.external_data[:]
                total += len(data)
    logger.debug("read %d bytes of external data from %d file(s)", total, len(by_file))
    return total
