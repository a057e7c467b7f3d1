"""graphopt's own reader for the ``.pt2`` archives :func:`graphopt.saved.save` writes.

``torch.export.load`` spends most of a large load on what graphopt's module never uses:
importing torch._dynamo, JSON -> schema dataclasses, FakeTensor metadata for every node, two
more compiles. :func:`read` builds the GraphModule ``plain_module(export_load(path))`` gives
(same node names, targets, arguments, weights and code) straight from the JSON. It returns
None, and ``load`` takes torch's path, for anything it does not know (another schema version,
a subgraph or higher-order op, a torchbind object, pickled weights, an argument or output kind
it does not read): it never guesses. Node metadata: ``stack_trace``, and a user input's
``meta["val"]`` is a 0-element tensor of its dtype and device (make_portable reads the device).
"""

from __future__ import annotations

import io
import json
import keyword
import logging
import math
import operator
import os
import struct
import sys
import zipfile
import zlib
from pathlib import Path
from typing import Any

import torch
from torch import fx

__all__ = ["read"]

logger = logging.getLogger(__name__)

_SCHEMA_MAJOR, _SCHEMA_MINOR = 8, 20  # the versions this reader was written against
_DTYPES = {1: torch.uint8, 2: torch.int8, 3: torch.int16, 4: torch.int32, 5: torch.int64,
           6: torch.float16, 7: torch.float32, 8: torch.float64, 9: torch.complex32,
           10: torch.complex64, 11: torch.complex128, 12: torch.bool, 13: torch.bfloat16,
           28: torch.uint16, 29: torch.float8_e4m3fn, 30: torch.float8_e5m2,
           31: torch.float8_e4m3fnuz, 32: torch.float8_e5m2fnuz, 34: torch.uint32,
           35: torch.uint64}
_ENUMS = {  # schema.py's ScalarType, MemoryFormat and Layout codes
    "as_scalar_type": _DTYPES,
    "as_memory_format": {1: torch.contiguous_format, 2: torch.channels_last,
                         3: torch.channels_last_3d, 4: torch.preserve_format},
    "as_layout": {1: torch.sparse_coo, 2: torch.sparse_csr, 3: torch.sparse_csc,
                  4: torch.sparse_bsr, 5: torch.sparse_bsc, 6: torch._mkldnn, 7: torch.strided}}
# torch.export's symbolic-scalar ops (serialize.py's _SYM_OPS): no schema, positional inputs
_SYM_OPS = {getattr(operator, n) for n in (
    "eq", "ne", "le", "ge", "lt", "gt", "neg", "pos", "mul", "add", "sub", "floordiv", "mod",
    "pow", "truediv", "and_", "or_", "lshift", "rshift")} | {
    math.trunc, torch.sym_not, torch.sym_int, torch.sym_float, torch.sym_ite, torch.sym_max,
    torch.sym_min, torch.sym_sqrt}
_SYM = ("as_sym_int", "as_sym_bool", "as_sym_float")
_SYM_LISTS = {"as_sym_ints": "as_int", "as_sym_bools": "as_bool", "as_sym_floats": "as_float"}


class _Unhandled(Exception):
    """Something this reader does not read: torch's loader takes the archive."""


def _one(d: Any, what: str) -> tuple[str, Any]:
    if not isinstance(d, dict) or len(d) != 1:
        raise _Unhandled(f"{what} is not a one-field union: {str(d)[:80]}")
    return next(iter(d.items()))


def _device(d: dict[str, Any]) -> torch.device:
    index = d.get("index")
    return torch.device(d["type"]) if index is None else torch.device(d["type"], index)


def _sym_name(kind: str, value: Any) -> str:
    """The name a symbolic output defines (``{"as_name": ...}``); a constant is refused."""
    if kind not in _SYM or _one(value, "symbolic output")[0] != "as_name":
        raise _Unhandled(f"output {kind} {value}")
    return value["as_name"]


def _target(name: str) -> Any:
    """The callable a serialized target names: an ATen/custom op overload or a sym op."""
    parts = name.split(".")
    try:
        if parts[:2] == ["torch", "ops"] and len(parts) == 5:
            op = getattr(getattr(getattr(torch.ops, parts[2]), parts[3]), parts[4])
            if isinstance(op, torch._ops.OpOverload) and op is not torch.ops.aten.item.default:
                return op
        elif len(parts) == 2 and parts[0] in ("_operator", "torch", "math"):
            module = {"_operator": operator, "torch": torch, "math": math}[parts[0]]
            if (fn := getattr(module, parts[1])) in _SYM_OPS:
                return fn
    except (AttributeError, RuntimeError):
        pass
    raise _Unhandled(f"target {name}")


class _Builder:
    """JSON graph -> fx.Graph, named and wired as torch's GraphModuleDeserializer does."""

    def __init__(self) -> None:
        self.graph, self.nodes = fx.Graph(), {}

    def sync(self, name: str, node: fx.Node) -> None:
        if name in self.nodes:
            raise _Unhandled(f"value {name} defined twice")
        node.name = name  # torch overwrites the name fx's namespace chose
        self.nodes[name] = node

    def sym(self, a: Any, scalar: str) -> Any:
        kind, value = _one(a, "symbolic argument")
        if kind == "as_name":
            return self.nodes[value]
        if kind != scalar:
            raise _Unhandled(f"symbolic argument {a}")
        return float(value) if scalar == "as_float" else value

    def arg(self, a: Any) -> Any:
        kind, v = _one(a, "argument")
        if kind in ("as_none", "as_int", "as_bool", "as_string"):
            return None if kind == "as_none" else v
        if kind == "as_float":
            return float(v)  # torch writes inf and nan as strings
        if kind == "as_tensor":
            return self.nodes[v["name"]]
        if kind in _ENUMS:
            return _ENUMS[kind][v]  # an unknown code: a KeyError, refused
        if kind == "as_device":
            return _device(v)
        if kind == "as_complex":
            return complex(float(v["real"]), float(v["imag"]))
        if kind in _SYM:
            return self.sym(v, kind.replace("sym_", ""))
        if not isinstance(v, list):
            raise _Unhandled(f"argument kind {kind}")
        if kind in ("as_ints", "as_bools", "as_strings") or (not v and kind in (
                "as_tensors", "as_floats", "as_optional_tensors", *_SYM_LISTS)):
            return list(v)
        if kind == "as_floats":
            return [float(x) for x in v]
        if kind == "as_tensors":
            return [self.nodes[t["name"]] for t in v]
        if kind == "as_optional_tensors":
            return [None if k == "as_none" else self.nodes[t["name"]]
                    for k, t in (_one(x, "optional tensor") for x in v)]
        if kind in _SYM_LISTS:
            return [self.sym(x, _SYM_LISTS[kind]) for x in v]
        raise _Unhandled(f"argument kind {kind}")

    def node(self, s: dict[str, Any]) -> None:
        target, outputs, name = _target(s["target"]), s["outputs"], s.get("name")
        meta = {k: v for k, v in (s.get("metadata") or {}).items() if k == "stack_trace" and v}
        if not name:
            raise _Unhandled(f"unnamed node {s['target']}")
        if target in _SYM_OPS:
            args = tuple(self.arg(i["arg"]) for i in s["inputs"])
            node = self.graph.create_node("call_function", target, args, {}, name)
            self.sync(_sym_name(*_one(outputs[0] if len(outputs) == 1 else None,
                                      "sym op output")), node)
        else:
            args, kwargs = self.split(target, s["inputs"])
            node = self.graph.create_node("call_function", target, args, kwargs, name)
            self.outputs(node, outputs, meta)
        node.meta.update(meta)

    def split(self, target: Any, inputs: list[dict[str, Any]]) -> tuple[tuple, dict]:
        """Positional and keyword arguments as the schema orders them (deserialize_inputs)."""
        given = {i["name"]: i for i in inputs}
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        for sa in target._schema.arguments:
            i = given.pop(sa.name, None)
            if i is None:
                if not sa.has_default_value() and not sa.kwarg_only:
                    raise _Unhandled(f"{target}: argument {sa.name} missing")
            elif keyword.iskeyword(sa.name) or i.get("kind") not in (1, 2):
                raise _Unhandled(f"{target}: argument {sa.name} kind {i.get('kind')}")
            elif i["kind"] == 1:
                args.append(self.arg(i["arg"]))
            else:
                kwargs[sa.name] = self.arg(i["arg"])
        if given:
            raise _Unhandled(f"{target}: arguments not in its schema {sorted(given)}")
        return tuple(args), kwargs

    def outputs(self, node: fx.Node, outputs: list[Any], meta: dict[str, Any]) -> None:
        """deserialize_outputs: name the node after its one value, or a getitem per value."""
        if not outputs:
            return
        items = [_one(o, "output") for o in outputs]
        if len(items) == 1:
            kind, value = items[0]
            if kind == "as_tensor":
                return self.sync(value["name"], node)
            if kind in _SYM:
                return self.sync(_sym_name(kind, value), node)
            if kind == "as_none":
                return node._rename(f"{self.graph._target_to_str(node.target)}_unused")
            if kind != "as_tensors" or not value:
                raise _Unhandled(f"output kind {kind}")
            items = [("as_tensor", v) for v in value]
        for idx, (kind, value) in enumerate(items):
            if kind not in ("as_tensor", "as_none", "as_sym_int", "as_sym_float"):
                raise _Unhandled(f"multiple-output kind {kind}")
            name = None if kind == "as_none" else value["name"] if kind == "as_tensor" \
                else _sym_name(kind, value)
            item = self.graph.create_node("call_function", operator.getitem, (node, idx),
                                          name=name or "as_none")
            if name:
                self.sync(name, item)
            item.meta.update(meta)
        self.nodes[node.name] = node


def _single_out(calls: list[dict[str, Any]]) -> bool:
    """Whether the program returns one tensor (True) or a flat tuple (False), per out_spec."""
    entry = next((e for e in calls if e["fqn"] == "" and e.get("signature")), None)
    if entry is None:
        raise _Unhandled("no root call signature")
    protocol, spec = json.loads(entry["signature"]["out_spec"])
    leaf = lambda t: t.get("type") is None and not t.get("children_spec")  # noqa: E731
    if protocol == 1 and (leaf(spec) or spec.get("type") == "builtins.tuple" and all(
            leaf(c) for c in spec["children_spec"])):
        return leaf(spec)
    raise _Unhandled(f"output structure {protocol} {spec.get('type')}")


class _Archive:
    def __init__(self, data: bytes) -> None:
        self.data, self.view = data, memoryview(data)
        self.zip = zipfile.ZipFile(io.BytesIO(data))
        self.names = set(self.zip.namelist())
        roots = {n.split("/", 1)[0] for n in self.names}
        if len(roots) != 1:
            raise _Unhandled(f"archive roots {sorted(roots)}")
        self.root = roots.pop() + "/"

    def read(self, name: str) -> bytes:  # a small member: zipfile's own checks
        return self.zip.read(self.root + name)

    def stored(self, name: str) -> memoryview:
        """An uncompressed member's bytes, CRC-checked, without zipfile's per-read setup."""
        info = self.zip.getinfo(self.root + name)
        if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 1:
            return memoryview(self.zip.read(info))
        start = info.header_offset
        if self.data[start:start + 4] != b"PK\x03\x04":
            raise _Unhandled(f"{name}: no local header")
        start += 30 + sum(struct.unpack_from("<HH", self.data, start + 26))
        raw = self.view[start:start + info.file_size]
        if len(raw) != info.file_size or zlib.crc32(raw) != info.CRC:
            raise _Unhandled(f"{name}: damaged")
        return raw

    def payloads(self, folder: str, prefix: str, to: str | None) -> dict[str, torch.Tensor]:
        """The tensors a payload config names, each a view of its file's storage, shared by
        the entries of one file (torch's aliasing); moved ``to`` as move_to_device_pass does."""
        files: dict[str, torch.Tensor] = {}
        out: dict[str, torch.Tensor] = {}
        config = self.read(f"data/{folder}/model_{folder}_config.json")
        for fqn, p in json.loads(config)["config"].items():
            meta, path = p.get("tensor_meta"), p["path_name"]
            if p.get("use_pickle") or meta is None or not path.startswith(prefix) or \
                    meta.get("layout", 7) != 7:
                raise _Unhandled(f"payload {fqn} ({path}) is not a plain strided tensor")
            dtype, grad = _DTYPES[meta["dtype"]], bool(meta["requires_grad"])
            if (flat := files.get(path)) is None:
                raw = self.stored(f"data/{folder}/{path}")
                if len(raw) % dtype.itemsize:
                    raise _Unhandled(f"{path}: {len(raw)} bytes for {dtype}")
                flat = torch.frombuffer(bytearray(raw), dtype=dtype) if len(raw) else \
                    torch.zeros([s["as_int"] for s in meta["sizes"]], dtype=dtype)
                if grad:
                    flat.requires_grad_(True)
                device = _device(meta["device"])
                files[path] = flat = flat if device.type == "cpu" else flat.to(device)
            view = torch.as_strided(flat, [s["as_int"] for s in meta["sizes"]],
                                    [s["as_int"] for s in meta["strides"]],
                                    meta["storage_offset"]["as_int"])
            if p.get("is_param"):
                view = torch.nn.Parameter(view, requires_grad=grad)
                out[fqn] = view if to is None else torch.nn.Parameter(view.to(to), grad)
            else:
                out[fqn] = view if to is None else view.to(to)
        return out


def read(path: str | os.PathLike[str], extra_files: dict[str, Any],
         device: str | torch.device | None = None, *, compile: bool = True
         ) -> fx.GraphModule | None:
    """The saved program as ``plain_module(export_load(path))`` (after
    ``move_to_device_pass`` when ``device`` is given) gives it, the archive's ``extra/``
    files put in ``extra_files``; None (logged at debug level) if the archive holds anything
    this reader does not handle. ``compile=False`` leaves the code to the caller's own
    ``recompile()`` (load's strip_unused does one): a 6k-node compile is ~0.3 s."""
    try:
        return _read(Path(path).read_bytes(), extra_files, device, compile)
    except (_Unhandled, KeyError, TypeError, ValueError, zipfile.BadZipFile) as e:
        logger.debug("pt2_reader: %s: %r; using torch.export.load", path, e)
        return None


def _read(data: bytes, extra_files: dict[str, Any], device: Any, compile: bool
          ) -> fx.GraphModule:
    ar = _Archive(data)
    if [n for n in ar.names if n.startswith(ar.root + "models/")] != \
            [ar.root + "models/model.json"] or ar.read("archive_format") != b"pt2" or \
            ar.read("archive_version") != b"0" or ar.read("byteorder").decode() != sys.byteorder:
        raise _Unhandled("not one model in archive format pt2 version 0 in this byte order")
    program = json.loads(ar.read("models/model.json"))
    version = program["schema_version"]
    if version["major"] != _SCHEMA_MAJOR or not 0 <= version["minor"] <= _SCHEMA_MINOR:
        raise _Unhandled(f"schema version {version}")
    gm_json = program["graph_module"]
    if gm_json["graph"].get("custom_obj_values") or gm_json["metadata"].get("custom"):
        raise _Unhandled("custom objects or custom metadata")
    graph_json, signature = gm_json["graph"], gm_json["signature"]
    single = _single_out(gm_json["module_call_graph"])
    specs = [_one(s, "input spec") for s in signature["input_specs"]]
    if any(k not in ("parameter", "buffer", "tensor_constant", "user_input") for k, _ in specs) \
            or any(_one(o, "output spec")[0] != "user_output"
                   for o in signature["output_specs"]):
        raise _Unhandled("an input or output that is not a weight or a user tensor")
    if len(graph_json["inputs"]) != len(specs):
        raise _Unhandled("graph inputs and signature differ")
    to = None if device is None else str(torch.device(device))
    state, constants = ar.payloads("weights", "weight_", to), ar.payloads("constants",
                                                                          "tensor_", to)
    b = _Builder()
    for inp, (kind, spec) in zip(graph_json["inputs"], specs, strict=True):
        ikind, value = _one(inp, "graph input")
        name = value["name"] if ikind == "as_tensor" else None
        if name is None or name != (spec["arg"].get("as_tensor", {}) if kind == "user_input"
                                    else spec["arg"]).get("name"):
            raise _Unhandled(f"graph input {name} is not its spec's")
        node = b.graph.placeholder(name)
        b.sync(name, node)
        if kind == "user_input":  # what make_portable reads: the input's dtype and device
            tv = graph_json["tensor_values"][name]
            node.meta["val"] = torch.empty(0, dtype=_DTYPES[tv["dtype"]],
                                           device=to or _device(tv["device"]))
    for s in graph_json["nodes"]:
        b.node(s)
    if to is not None:  # move_to_device_pass on the graph: baked-in devices
        for node in b.graph.nodes:
            if "device" in node.kwargs:
                node.kwargs = {**node.kwargs, "device": to}
            if node.op == "call_function" and node.target is torch.ops.aten.to.device:
                node.args = (node.args[0], to, *node.args[2:])
    outs = [b.arg(o) for o in graph_json["outputs"]]
    one = graph_json["is_single_tensor_return"]
    if any(isinstance(o, list) for o in outs) or (one and len(outs) != 1):
        raise _Unhandled("graph outputs")
    output = b.graph.output(outs[0] if one else tuple(outs))
    gm = _module(b.graph, specs, state, constants, output, single, gm_json, compile)
    for name in sorted(ar.names):  # as torch.export.load: every extra file, as text
        if name.startswith(ar.root + "extra/"):
            extra_files[name[len(ar.root) + 6:]] = ar.zip.read(name).decode("utf-8")
    return gm


def _module(graph: fx.Graph, specs: list[tuple[str, Any]], state: dict[str, torch.Tensor],
            constants: dict[str, torch.Tensor], output: fx.Node, single: bool,
            gm_json: dict[str, Any], compile: bool) -> fx.GraphModule:
    """plain_module's unlifting: each weight placeholder -> a get_attr of a registered name."""
    gm = fx.GraphModule(torch.nn.Module(), fx.Graph())
    gm.meta = {"treespec_namedtuple_fields": {
        k: v["field_names"] for k, v in gm_json.get("treespec_namedtuple_fields", {}).items()}}
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    first_op = next(n for n in graph.nodes if n.op != "placeholder")
    for node, (kind, spec) in zip(placeholders, specs, strict=True):
        if kind == "user_input":
            continue
        target = next(v for k, v in spec.items() if k.endswith("_name"))
        persistent = kind == "parameter" or (kind == "buffer" and spec.get("persistent"))
        source = state if persistent else constants
        if target not in source:
            raise _Unhandled(f"weight {target} not in the archive")
        value, name = source[target], "_".join(str(target).split("."))
        if isinstance(value, torch.nn.Parameter):
            gm.register_parameter(name, value)
        else:
            gm.register_buffer(name, value, persistent=bool(persistent))
        with graph.inserting_before(first_op):
            attr = graph.get_attr(name)
        attr.meta = node.meta
        node.replace_all_uses_with(attr)
        graph.erase_node(node)
    if single:  # the model returns one tensor, not a 1-tuple
        if not isinstance(output.args[0], tuple) or len(output.args[0]) != 1:
            raise _Unhandled("one output in the spec, not in the graph")
        output.args = (output.args[0][0],)
    if compile:
        gm.graph = graph  # the one compile of the program
    else:  # as torch's _create_graph_module_for_export does on a graph it cannot compile
        gm._graph, graph.owning_module = graph, gm
    return gm
