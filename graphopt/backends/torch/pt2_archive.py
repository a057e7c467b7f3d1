"""The zip archive under a ``.pt2`` file, read within bounds (graphopt/backends/torch/pt2_reader.py
reads it).

A file from anyone may claim anything: a member's declared size is checked before it is read,
a compressed member is read at most that far (a zip bomb stops there), and all the bytes read
together stay under :data:`budget` (the file's own size twice plus 64 MiB: torch.export.save
stores every member uncompressed, so a real file needs less than its own size). Only the
members graphopt asks for by name are read; nothing is unpickled. Also here: the weight
payloads (checked against the bytes present before anything is allocated) and the program's
call structure (plain tuple, list and dict containers only; no class a file names is imported).
"""

from __future__ import annotations

import io
import json
import math
import struct
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["Archive", "Damaged", "Unhandled", "budget", "leaves", "payloads", "rebuild",
           "structure"]

_CONTAINERS = {"builtins.tuple": tuple, "builtins.list": list, "builtins.dict": dict}
_SLACK = 64 << 20  # room for JSON a future writer may deflate


class Damaged(Exception):
    """The archive is not what it says it is: corrupt, cut, or edited by hand."""


class Unhandled(Exception):
    """A real archive holding something graphopt's reader does not read."""


def budget(size: int) -> int:
    """The most bytes the members read from a file of ``size`` bytes may hold together."""
    return 2 * size + _SLACK


class Archive:
    """One ``.pt2`` zip held in memory; members read by name, each at most once-sized."""

    def __init__(self, path: Path) -> None:
        self.data = path.read_bytes()
        self.view = memoryview(self.data)
        try:
            self.zip = zipfile.ZipFile(io.BytesIO(self.data))
            self.infos = {i.filename: i for i in self.zip.infolist()}
        except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, struct.error,
                OSError, UnicodeDecodeError, NotImplementedError) as e:
            raise Damaged(f"the zip directory is unreadable ({type(e).__name__}: {e})") from None
        self.names = set(self.infos)
        self.left = budget(len(self.data))

    @property
    def root(self) -> str:
        """The one top folder every member sits in (torch writes ``<name>/...``)."""
        roots = {n.split("/", 1)[0] for n in self.names}
        if len(roots) != 1:
            raise Unhandled(f"an archive with top folders {sorted(roots)[:5]}, not one")
        return roots.pop() + "/"

    def _info(self, name: str) -> zipfile.ZipInfo:
        info = self.infos.get(name)
        if info is None:
            raise Damaged(f"member {name} is missing")
        if info.flag_bits & 1:
            raise Unhandled(f"member {name} is encrypted")
        if info.file_size < 0 or info.file_size > self.left:
            raise Damaged(f"member {name} declares {info.file_size} bytes, more than this "
                          f"{len(self.data)}-byte file can hold")
        self.left -= info.file_size
        return info

    def member(self, name: str) -> bytes:
        """A small member's bytes (JSON, a version string), read no further than declared."""
        info = self._info(name)
        if info.compress_type == zipfile.ZIP_STORED:
            return bytes(self._stored(info))
        if info.compress_type != zipfile.ZIP_DEFLATED:
            raise Unhandled(f"member {name} is compressed with method {info.compress_type}")
        try:
            with self.zip.open(info) as f:
                data = f.read(info.file_size + 1)
        except (zipfile.BadZipFile, zlib.error, EOFError, ValueError, OSError) as e:
            raise Damaged(f"member {name} is damaged ({type(e).__name__}: {e})") from None
        if len(data) != info.file_size:
            raise Damaged(f"member {name} holds more or fewer bytes than it declares")
        return data

    def stored(self, name: str) -> memoryview:
        """An uncompressed member's bytes in place (a weight payload), CRC-checked."""
        info = self._info(name)
        if info.compress_type != zipfile.ZIP_STORED:
            raise Unhandled(f"payload {name} is compressed; torch.export.save stores payloads "
                            "uncompressed")
        return self._stored(info)

    def _stored(self, info: zipfile.ZipInfo) -> memoryview:
        start = info.header_offset
        if start < 0 or start + 30 > len(self.data) or \
                self.data[start:start + 4] != b"PK\x03\x04":
            raise Damaged(f"member {info.filename} has no local header")
        start += 30 + sum(struct.unpack_from("<HH", self.data, start + 26))
        raw = self.view[start:start + info.file_size]
        if info.compress_size != info.file_size or len(raw) != info.file_size or \
                zlib.crc32(raw) != info.CRC:
            raise Damaged(f"member {info.filename} is cut or its checksum is wrong")
        return raw

    def json(self, name: str) -> Any:
        """A JSON member, decoded; anything but valid UTF-8 JSON is damage."""
        try:
            return json.loads(self.member(name).decode("utf-8"))
        except (ValueError, RecursionError) as e:
            raise Damaged(f"member {name} is not valid JSON ({type(e).__name__})") from None


# --- weight payloads -----------------------------------------------------------------------------
_LIMIT = 1 << 62  # sizes, strides, offsets and element counts stay far inside torch's int64
_MAX_DIMS = 64


def _int(v: Any, what: str) -> int:
    """``{"as_int": n}`` -> n, a non-negative int (a size, a stride, an offset) that int64
    arithmetic on it cannot overflow."""
    n = v.get("as_int") if isinstance(v, dict) else None
    if type(n) is not int or not 0 <= n < _LIMIT:
        raise Damaged(f"{what} is {str(v)[:60]}, not a non-negative int below 2**62")
    return n


def _layout(fqn: str, meta: dict[str, Any]) -> tuple[list[int], list[int], int, int]:
    """sizes, strides, storage offset of a payload's tensor and the elements of its file it
    needs: the last one it reaches plus one (an empty tensor: its offset). Strides are
    non-negative (no view runs backwards) and every product stays below 2**62."""
    sizes = [_int(s, f"a size of {fqn}") for s in meta["sizes"]]
    strides = [_int(s, f"a stride of {fqn}") for s in meta["strides"]]
    offset = _int(meta["storage_offset"], f"the storage offset of {fqn}")
    if len(sizes) != len(strides) or len(sizes) > _MAX_DIMS:
        raise Damaged(f"{fqn} has {len(sizes)} sizes and {len(strides)} strides")
    numel = math.prod(sizes)
    reach = sum((n - 1) * s for n, s in zip(sizes, strides, strict=True) if n)
    if numel >= _LIMIT or offset + reach >= _LIMIT:
        raise Damaged(f"{fqn} declares sizes {sizes[:8]} and strides {strides[:8]} that "
                      "overflow")
    need = offset if numel == 0 else offset + 1 + reach
    return sizes, strides, offset, need


def payloads(ar: Archive, folder: str, prefix: str, dtypes: dict[int, Any], device: Any
             ) -> dict[str, Any]:
    """The tensors a payload config names, each a view of its file's storage, shared by the
    entries of one file (torch's aliasing). Each view is checked against the bytes its file
    holds before anything is allocated; ``device(tensor, saved_device)`` moves it."""
    import torch

    files: dict[str, torch.Tensor] = {}
    out: dict[str, torch.Tensor] = {}
    config = ar.json(f"{ar.root}data/{folder}/model_{folder}_config.json")
    entries = config.get("config") if isinstance(config, dict) else None
    if not isinstance(entries, dict):
        raise Damaged(f"the {folder} config is not a record of payloads")
    for fqn, p in entries.items():
        meta = p.get("tensor_meta") if isinstance(p, dict) else None
        path = p.get("path_name") if isinstance(p, dict) else None
        if isinstance(p, dict) and p.get("use_pickle"):
            raise Unhandled(f"payload {str(fqn)[:80]} is pickled (graphopt never unpickles)")
        if not isinstance(meta, dict) or not isinstance(path, str):
            raise Damaged(f"payload {str(fqn)[:80]} has no tensor record")
        if meta.get("layout", 7) != 7:
            raise Unhandled(f"payload {fqn} is not a plain strided tensor")
        if not path.startswith(prefix) or "/" in path:
            raise Damaged(f"payload {fqn} names the file {path[:80]!r}")
        dtype = dtypes.get(meta.get("dtype")) if isinstance(meta.get("dtype"), int) else None
        if dtype is None:
            raise Unhandled(f"payload {fqn} has dtype code {str(meta.get('dtype'))[:20]}")
        sizes, strides, offset, need = _layout(fqn, meta)
        if (flat := files.get(path)) is None:
            raw = ar.stored(f"{ar.root}data/{folder}/{path}")
            if len(raw) % dtype.itemsize:
                raise Damaged(f"payload {path} holds {len(raw)} bytes, not whole {dtype}s")
            if need > len(raw) // dtype.itemsize:  # before the copy: nothing allocated yet
                raise Damaged(f"payload {fqn} declares {sizes} {dtype} ({need} elements) over "
                              f"a {len(raw)}-byte file")
            flat = torch.frombuffer(bytearray(raw), dtype=dtype) if len(raw) else \
                torch.empty(0, dtype=dtype)
            if meta.get("requires_grad") is True and dtype.is_floating_point:
                flat.requires_grad_(True)
            files[path] = flat = device(flat, meta.get("device"))
        if flat.dtype != dtype or need > flat.numel():
            raise Damaged(f"payload {fqn} ({dtype}, {need} elements) does not fit its file "
                          f"{path} ({flat.dtype}, {flat.numel()} elements)")
        view = torch.as_strided(flat, sizes, strides, offset)
        out[fqn] = torch.nn.Parameter(view, flat.requires_grad) if p.get("is_param") else view
    return out


# --- the call structure --------------------------------------------------------------------------
def _tree(spec: Any, what: str = "output") -> Any:
    """A pytree spec (protocol 1) of plain containers: None for a leaf, else (type, dict keys or
    None, children). Any other container is refused: its class is never imported."""
    kind = spec.get("type") if isinstance(spec, dict) else 0
    children = spec.get("children_spec") if isinstance(spec, dict) else None
    if not isinstance(children, list):
        raise Damaged(f"output structure {str(spec)[:80]}")
    if kind is None and not children:
        return None
    if kind not in _CONTAINERS:
        raise Unhandled(f"the {what} container {str(kind)[:80]} (tuple, list and dict are "
                        "rebuilt)")
    keys = None
    if kind == "builtins.dict":
        keys = json.loads(spec["context"])
        if not isinstance(keys, list) or len(keys) != len(children) or \
                any(type(k) not in (str, int) for k in keys) or len(set(keys)) != len(keys):
            raise Damaged(f"dict output keys {str(keys)[:80]}")
    return _CONTAINERS[kind], keys, [_tree(c, what) for c in children]


def leaves(tree: Any) -> int:
    return 1 if tree is None else sum(leaves(c) for c in tree[2])


def rebuild(tree: Any, values: Iterator[Any]) -> Any:
    if tree is None:
        return next(values)
    kind, keys, children = tree
    items = [rebuild(c, values) for c in children]
    return dict(zip(keys, items, strict=True)) if kind is dict else kind(items)


def structure(calls: Any) -> Any:
    """The root call's output structure (:func:`_tree`, for :func:`rebuild`); its inputs
    must be flat: positional tensors, no keywords."""
    entry = next((e for e in calls if isinstance(e, dict) and e.get("fqn") == ""
                  and e.get("signature")), None) if isinstance(calls, list) else None
    if entry is None:
        raise Damaged("no root call signature")
    protocol, ins = json.loads(entry["signature"]["in_spec"])
    protocol_out, spec = json.loads(entry["signature"]["out_spec"])
    if protocol != 1 or protocol_out != 1:
        raise Unhandled(f"pytree protocol {protocol}")
    tree = _tree(ins, "input")
    args, kwargs = tree[2] if tree is not None and tree[0] is tuple and len(tree[2]) == 2 \
        else (None, None)
    if args is None or args[0] is not tuple or any(c is not None for c in args[2]) or \
            kwargs is None or kwargs[0] is not dict or kwargs[2]:
        raise Unhandled("inputs given as nested containers or by keyword")
    return _tree(spec)
