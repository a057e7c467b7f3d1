"""graphopt's own reader for the ``.pt2`` archives :func:`graphopt.backends.torch.saved.save`
writes.

It builds the GraphModule straight from the archive's JSON (the one ``ExportedProgram`` with
its weights unlifted would give: same node names, targets, arguments, weights and code) without
``torch.export.load``, which unpickles members of the archive and spends most of a large load
on what graphopt's module never uses. It is the only way :func:`graphopt.load` reads a file, so
it trusts nothing in it: the zip is read within bounds
(:mod:`graphopt.backends.torch.pt2_archive`), weights
are checked against the bytes present before anything is allocated, every name that becomes
Python code is a plain identifier, and no module a file names is imported. What it does not
read (another schema version, a subgraph or higher-order op, a torchbind object, a pickled
weight, an output container other than tuple, list or dict) is a GraphoptError that names it,
and damage is one that says so. Node metadata: ``stack_trace`` (printable text only), and a
user input's ``meta["val"]`` is a 0-element tensor of its dtype and device.
"""

from __future__ import annotations

import keyword
import math
import operator
import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch import fx

from graphopt.backends.torch.pt2_archive import (
    Archive,
    Damaged,
    Unhandled,
    leaves,
    payloads,
    rebuild,
    structure,
)
from graphopt.errors import GraphoptError, first_line

__all__ = ["build", "open_archive", "read"]

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
# names the generated forward() relies on: a value may not take them (fx's own globals)
_RESERVED = {"self", "torch", "device", "inf", "nan", "NoneType"}
_RESAVE = "save the model again with Optimized.save (graphopt.optimize(...).save(path))"
_SELF_LOAD = ("save the model again with this graphopt's Optimized.save; graphopt.load never "
              "hands a file to torch.export.load, which unpickles: if you trust the file, "
              "call torch.export.load yourself")
_BROKEN = (Damaged, KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError,
           OverflowError, RecursionError, AssertionError, StopIteration, SyntaxError)


def _one(d: Any, what: str) -> tuple[str, Any]:
    if not isinstance(d, dict) or len(d) != 1:
        raise Damaged(f"{what} is not a one-field union: {str(d)[:80]}")
    return next(iter(d.items()))


def _device(d: Any) -> torch.device:
    if not isinstance(d, dict) or not isinstance(d.get("type"), str):
        raise Damaged(f"device {str(d)[:60]}")
    index = d.get("index")
    return torch.device(d["type"]) if index is None else torch.device(d["type"], index)


def _name(v: Any) -> str:
    """A value's name, which becomes a variable of the generated code: a plain identifier."""
    if not isinstance(v, str) or not v.isidentifier() or keyword.iskeyword(v) or \
            v in _RESERVED or v.startswith("__"):
        raise Damaged(f"value name {str(v)[:60]!r} is not a plain identifier")
    return v


def _stack_trace(v: Any) -> str | None:
    """The node's stack trace if it is printable text (print_readable writes it into code as
    a comment, which a carriage return would end)."""
    return v if isinstance(v, str) and v.replace("\n", "").isprintable() else None


def _scalar(kind: str, v: Any) -> Any:
    want = {"as_int": int, "as_bool": bool, "as_string": str}[kind]
    if type(v) is not want:
        raise Damaged(f"argument {kind} is {str(v)[:40]}")
    return v


def _sym_name(kind: str, value: Any) -> str:
    """The name a symbolic output defines (``{"as_name": ...}``); a constant is refused."""
    if kind not in _SYM or _one(value, "symbolic output")[0] != "as_name":
        raise Unhandled(f"output {kind} {str(value)[:60]}")
    return _name(value["as_name"])


def _target(name: str) -> Any:
    """The callable a serialized target names: an ATen/custom op overload or a sym op."""
    if not isinstance(name, str):
        raise Damaged(f"target {str(name)[:60]}")
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
    raise Unhandled(f"the op {name[:120]} (not an op this process has registered)")


class _Builder:
    """JSON graph -> fx.Graph, named and wired as torch's GraphModuleDeserializer does."""

    def __init__(self) -> None:
        self.graph, self.nodes = fx.Graph(), {}

    def sync(self, name: str, node: fx.Node) -> None:
        if _name(name) in self.nodes:
            raise Damaged(f"value {name} defined twice")
        node.name = name  # torch overwrites the name fx's namespace chose
        self.nodes[name] = node

    def sym(self, a: Any, scalar: str) -> Any:
        kind, value = _one(a, "symbolic argument")
        if kind == "as_name":
            return self.nodes[value]
        if kind != scalar:
            raise Unhandled(f"symbolic argument {str(a)[:60]}")
        return float(value) if scalar == "as_float" else _scalar(scalar, value)

    def arg(self, a: Any) -> Any:
        kind, v = _one(a, "argument")
        if kind in ("as_none", "as_int", "as_bool", "as_string"):
            return None if kind == "as_none" else _scalar(kind, v)
        if kind == "as_float":
            return float(v)  # torch writes inf and nan as strings
        if kind == "as_tensor":
            return self.nodes[v["name"]]
        if kind in _ENUMS:
            if v not in _ENUMS[kind]:
                raise Unhandled(f"{kind} code {str(v)[:20]}")
            return _ENUMS[kind][v]
        if kind == "as_device":
            return _device(v)
        if kind == "as_complex":
            return complex(float(v["real"]), float(v["imag"]))
        if kind in _SYM:
            return self.sym(v, kind.replace("sym_", ""))
        if not isinstance(v, list):
            raise Unhandled(f"argument kind {kind}")
        if kind in ("as_ints", "as_bools", "as_strings"):
            return [_scalar(kind[:-1], x) for x in v]
        if not v and kind in ("as_tensors", "as_floats", "as_optional_tensors", *_SYM_LISTS):
            return []
        if kind == "as_floats":
            return [float(x) for x in v]
        if kind == "as_tensors":
            return [self.nodes[t["name"]] for t in v]
        if kind == "as_optional_tensors":
            return [None if k == "as_none" else self.nodes[t["name"]]
                    for k, t in (_one(x, "optional tensor") for x in v)]
        if kind in _SYM_LISTS:
            return [self.sym(x, _SYM_LISTS[kind]) for x in v]
        raise Unhandled(f"argument kind {kind}")

    def node(self, s: dict[str, Any]) -> None:
        target, outputs, name = _target(s["target"]), s["outputs"], _name(s.get("name"))
        trace = _stack_trace((s.get("metadata") or {}).get("stack_trace"))
        meta = {"stack_trace": trace} if trace else {}
        if not isinstance(outputs, list):
            raise Damaged(f"node {name} outputs")
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
            kind = None if i is None else i.get("kind")
            if kind is None and i is not None:  # an older writer: placed by the schema
                kind = 1 if not sa.has_default_value() and not sa.kwarg_only else 2
            if i is None:
                if not sa.has_default_value() and not sa.kwarg_only:
                    raise Damaged(f"{target}: argument {sa.name} missing")
            elif keyword.iskeyword(sa.name) or kind not in (1, 2):
                raise Unhandled(f"{target}: argument {sa.name} of kind {str(kind)[:20]}")
            elif kind == 1:
                args.append(self.arg(i["arg"]))
            else:
                kwargs[sa.name] = self.arg(i["arg"])
        if given:
            raise Damaged(f"{target}: arguments not in its schema {sorted(given)[:5]}")
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
                raise Unhandled(f"output kind {kind}")
            items = [("as_tensor", v) for v in value]
        for idx, (kind, value) in enumerate(items):
            if kind not in ("as_tensor", "as_none", "as_sym_int", "as_sym_float"):
                raise Unhandled(f"multiple-output kind {kind}")
            name = None if kind == "as_none" else value["name"] if kind == "as_tensor" \
                else _sym_name(kind, value)
            item = self.graph.create_node("call_function", operator.getitem, (node, idx),
                                          name=name or "as_none")
            if name:
                self.sync(name, item)
            item.meta.update(meta)
        self.nodes[node.name] = node


def open_archive(path: Path) -> Archive:
    """The archive at ``path``, its zip directory read (a GraphoptError if it cannot be)."""
    try:
        return Archive(path)
    except Damaged as e:
        raise GraphoptError(f"{path} is a damaged zip archive: {e}", _RESAVE) from None


def read(path: str | os.PathLike[str], extra_files: dict[str, Any],
         device: str | torch.device | None = None, *, compile: bool = True) -> fx.GraphModule:
    """The saved program as a GraphModule, weights unlifted (moved to ``device`` when given,
    as ``move_to_device_pass`` would), and each ``extra/`` file named in ``extra_files`` read
    into it as text. A GraphoptError for anything it does not read or finds damaged.
    ``compile=False`` leaves the code to the caller's own ``recompile()``."""
    return build(Path(path), open_archive(Path(path)), extra_files, device, compile)


def build(path: Path, ar: Archive, extra_files: dict[str, Any], device: Any,
          compile: bool = True) -> fx.GraphModule:
    """:func:`read` on an archive already open (``load`` checks graphopt's marker first)."""
    try:
        return _read(ar, extra_files, device, compile)
    except GraphoptError:
        raise
    except Unhandled as e:
        raise GraphoptError(f"{path} is a graphopt archive holding what this graphopt's reader "
                            f"does not read: {e}", _SELF_LOAD) from None
    except _BROKEN as e:
        what = str(e) if isinstance(e, Damaged) else first_line(e)
        raise GraphoptError(f"{path} is a damaged graphopt archive: {what}", _RESAVE) from None


def _mover(to: str | None) -> Any:
    """Puts a weight where it is loaded: ``to``, else the device it was saved from."""
    def move(t: torch.Tensor, saved: Any) -> torch.Tensor:
        dev = torch.device(to) if to is not None else _device(saved)
        if dev == t.device:
            return t
        try:
            return t.to(dev)
        except (RuntimeError, AssertionError) as e:
            raise GraphoptError(f"cannot move the saved model's weights to {dev}: "
                                f"{first_line(e)}", "load it with device='cpu' or another "
                                "device this machine has") from None
    return move


def _program(ar: Archive) -> dict[str, Any]:
    if [n for n in ar.names if n.startswith(ar.root + "models/")] != \
            [ar.root + "models/model.json"] or ar.member(ar.root + "archive_format") != b"pt2" \
            or ar.member(ar.root + "archive_version") != b"0" or \
            ar.member(ar.root + "byteorder") != sys.byteorder.encode():
        raise Unhandled("not one model in archive format pt2 version 0 in this byte order")
    program = ar.json(ar.root + "models/model.json")
    version = program["schema_version"]
    if version["major"] != _SCHEMA_MAJOR or not 0 <= version["minor"] <= _SCHEMA_MINOR:
        raise Unhandled(f"torch.export schema version {version['major']}.{version['minor']} "
                        f"(this reader reads {_SCHEMA_MAJOR}.0-{_SCHEMA_MINOR})")
    gm_json = program["graph_module"]
    if gm_json["graph"].get("custom_obj_values") or gm_json["metadata"].get("custom"):
        raise Unhandled("custom objects or custom metadata")
    return gm_json


def _read(ar: Archive, extra_files: dict[str, Any], device: Any, compile: bool
          ) -> fx.GraphModule:
    gm_json = _program(ar)
    graph_json, signature = gm_json["graph"], gm_json["signature"]
    tree = structure(gm_json["module_call_graph"])
    specs = [_one(s, "input spec") for s in signature["input_specs"]]
    if any(k not in ("parameter", "buffer", "tensor_constant", "user_input") for k, _ in specs) \
            or any(_one(o, "output spec")[0] != "user_output"
                   for o in signature["output_specs"]):
        raise Unhandled("an input or output that is not a weight or a user tensor")
    if len(graph_json["inputs"]) != len(specs):
        raise Damaged("graph inputs and signature differ")
    to = None if device is None else str(torch.device(device))
    move = _mover(to)
    state = payloads(ar, "weights", "weight_", _DTYPES, move)
    constants = payloads(ar, "constants", "tensor_", _DTYPES, move)
    b = _Builder()
    for inp, (kind, spec) in zip(graph_json["inputs"], specs, strict=True):
        ikind, value = _one(inp, "graph input")
        name = value["name"] if ikind == "as_tensor" else None
        if name is None or name != (spec["arg"].get("as_tensor", {}) if kind == "user_input"
                                    else spec["arg"]).get("name"):
            raise Unhandled(f"graph input {str(name)[:60]} is not its spec's")
        node = b.graph.placeholder(_name(name))
        b.sync(name, node)
        if kind == "user_input":  # what make_portable reads: the input's dtype and device
            tv = graph_json["tensor_values"][name]
            if tv["dtype"] not in _DTYPES:
                raise Unhandled(f"input {name} of dtype code {str(tv['dtype'])[:20]}")
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
    if any(isinstance(o, list) for o in outs) or len(outs) != leaves(tree) or \
            (graph_json["is_single_tensor_return"] and tree is not None):
        raise Damaged("graph outputs do not match the output structure")
    b.graph.output(rebuild(tree, iter(outs)))
    gm = _module(b.graph, specs, state, constants, gm_json, compile)
    for key in list(extra_files):  # as torch.export.load: the extra files asked for, as text
        name = f"{ar.root}extra/{key}"
        if name in ar.names:
            extra_files[key] = ar.member(name).decode("utf-8")
    return gm


def _module(graph: fx.Graph, specs: list[tuple[str, Any]], state: dict[str, torch.Tensor],
            constants: dict[str, torch.Tensor], gm_json: dict[str, Any], compile: bool
            ) -> fx.GraphModule:
    """plain_module's unlifting: each weight placeholder -> a get_attr of a registered name."""
    gm = fx.GraphModule(torch.nn.Module(), fx.Graph())
    if gm_json.get("treespec_namedtuple_fields"):
        raise Unhandled("named tuples")
    gm.meta = {"treespec_namedtuple_fields": {}}
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    first_op = next(n for n in graph.nodes if n.op != "placeholder")
    for node, (kind, spec) in zip(placeholders, specs, strict=True):
        if kind == "user_input":
            continue
        target = next(v for k, v in spec.items() if k.endswith("_name"))
        persistent = kind == "parameter" or (kind == "buffer" and spec.get("persistent"))
        source = state if persistent else constants
        if not isinstance(target, str) or target not in source:
            raise Damaged(f"weight {str(target)[:60]} not in the archive")
        value, name = source[target], _name("_".join(target.split(".")))
        if isinstance(value, torch.nn.Parameter):
            gm.register_parameter(name, value)
        else:
            gm.register_buffer(name, value, persistent=bool(persistent))
        with graph.inserting_before(first_op):
            attr = graph.get_attr(name)
        attr.meta = node.meta
        node.replace_all_uses_with(attr)
        graph.erase_node(node)
    if compile:
        gm.graph = graph  # the one compile of the program
    else:  # as torch's _create_graph_module_for_export does on a graph it cannot compile
        gm._graph, graph.owning_module = graph, gm
    return gm
