"""graphopt's own reader for the ``.pt2`` archives :func:`graphopt.backends.torch.saved.save`
writes.

It builds the GraphModule straight from the archive's JSON (the one ``ExportedProgram`` with
its weights unlifted would give: same node names, targets, arguments, weights and code) without
``torch.export.load``, which unpickles members of the archive and spends most of a large load
on what graphopt's module never uses. It is the only way :func:`graphopt.load` reads a file, so
it trusts nothing in it: the zip is read within bounds
(:mod:`graphopt.backends.torch.pt2_archive`), weights
are checked against the bytes present before anything is allocated, every name that becomes
Python code is a plain identifier, no module a file names is imported, every op is one that
computes (:mod:`.pt2_ops`), and every in-place write lands on a buffer or an intermediate,
never on the caller's input (:mod:`.pt2_writes`). What it does not
read (another schema version, a subgraph or higher-order op, a torchbind object, a pickled
weight, an output container other than tuple, list or dict) is a GraphoptError that names it,
and damage is one that says so. Node metadata: ``stack_trace`` (printable text only), and a
user input's ``meta["val"]`` is a 0-element tensor of its dtype and device.
"""

from __future__ import annotations

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
from graphopt.backends.torch.pt2_graph import (
    DTYPES,
    GraphBuilder,
    one_field,
    parse_device,
    plain_name,
)
from graphopt.backends.torch.pt2_ops import Refused
from graphopt.backends.torch.pt2_writes import check as check_writes
from graphopt.backends.torch.pt2_writes import zero_fill
from graphopt.backends.torch.saved_format import RESAVE
from graphopt.errors import GraphoptError, first_line

__all__ = ["build", "open_archive", "read"]

_SCHEMA_MAJOR, _SCHEMA_MINOR = 8, 20  # the versions this reader was written against
_SELF_LOAD = ("save the model again with this graphopt's Optimized.save; graphopt.load never "
              "hands a file to torch.export.load, which unpickles: if you trust the file, "
              "call torch.export.load yourself")
_COMPUTE_ONLY = ("graphopt.load runs a graph that only computes, and Optimized.save never writes "
                 "one that does more: the file was altered or made by another tool; do not "
                 "load it (if it is yours, " + RESAVE + ")")
_BROKEN = (Damaged, KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError,
           OverflowError, RecursionError, AssertionError, StopIteration, SyntaxError)


def open_archive(path: Path) -> Archive:
    """The archive at ``path``, its zip directory read (a GraphoptError if it cannot be)."""
    try:
        return Archive(path)
    except Damaged as e:
        raise GraphoptError(f"{path} is a damaged zip archive: {e}", RESAVE) from None


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
    except Refused as e:
        raise GraphoptError(f"{path} is refused: {e}", _COMPUTE_ONLY) from None
    except Unhandled as e:
        raise GraphoptError(f"{path} is a graphopt archive holding what this graphopt's reader "
                            f"does not read: {e}", _SELF_LOAD) from None
    except _BROKEN as e:
        what = str(e) if isinstance(e, Damaged) else first_line(e)
        raise GraphoptError(f"{path} is a damaged graphopt archive: {what}", RESAVE) from None


def _mover(to: str | None) -> Any:
    """Puts a weight where it is loaded: ``to``, else the device it was saved from."""
    def move(t: torch.Tensor, saved: Any) -> torch.Tensor:
        dev = torch.device(to) if to is not None else parse_device(saved)
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
    specs = [one_field(s, "input spec") for s in signature["input_specs"]]
    if any(k not in ("parameter", "buffer", "tensor_constant", "user_input", "constant_input")
           for k, _ in specs) \
            or any(one_field(o, "output spec")[0] != "user_output"
                   for o in signature["output_specs"]):
        raise Unhandled("an input or output that is not a weight or a user tensor")
    if len(graph_json["inputs"]) != len(specs):
        raise Damaged("graph inputs and signature differ")
    to = None if device is None else str(torch.device(device))
    move = _mover(to)
    state = payloads(ar, "weights", "weight_", DTYPES, move)
    constants = payloads(ar, "constants", "tensor_", DTYPES, move)
    b = GraphBuilder()
    for inp, (kind, spec) in zip(graph_json["inputs"], specs, strict=True):
        ikind, value = one_field(inp, "graph input")
        if kind == "constant_input":  # forward's None between given inputs (inputs_embeds)
            _none_input(b, ikind, spec)
            continue
        name = value["name"] if ikind == "as_tensor" else None
        if name is None or name != (spec["arg"].get("as_tensor", {}) if kind == "user_input"
                                    else spec["arg"]).get("name"):
            raise Unhandled(f"graph input {str(name)[:60]} is not its spec's")
        node = b.graph.placeholder(plain_name(name))
        b.sync(name, node)
        if kind == "user_input":  # what make_portable reads: the input's dtype and device
            tv = graph_json["tensor_values"][name]
            if tv["dtype"] not in DTYPES:
                raise Unhandled(f"input {name} of dtype code {str(tv['dtype'])[:20]}")
            node.meta["val"] = torch.empty(0, dtype=DTYPES[tv["dtype"]],
                                           device=to or parse_device(tv["device"]))
    for s in graph_json["nodes"]:
        b.node(s)
    zero_fill(b.graph)  # no uninitialized byte reaches an output
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


def _none_input(b: GraphBuilder, ikind: str, spec: Any) -> None:
    """A ``constant_input`` spec: an argument export saw as None, a placeholder nothing reads
    (torch's deserializer makes the same). Only None: a file's other constants are not
    values this reader makes."""
    value = spec.get("value") if isinstance(spec, dict) else None
    if ikind != "as_none" or not isinstance(value, dict) or list(value) != ["as_none"]:
        raise Unhandled(f"a constant input {str(spec)[:60]} other than None")
    node = b.graph.placeholder(plain_name(spec.get("name")))
    node.meta["val"] = None


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
        if kind in ("user_input", "constant_input"):
            continue
        target = next(v for k, v in spec.items() if k.endswith("_name"))
        persistent = kind == "parameter" or (kind == "buffer" and spec.get("persistent"))
        source = state if persistent else constants
        if not isinstance(target, str) or target not in source:
            raise Damaged(f"weight {str(target)[:60]} not in the archive")
        flat = "_".join(target.split("."))  # a Sequential's ``0.weight``: ``_0_weight``
        value, name = source[target], plain_name(f"_{flat}" if flat[:1].isdigit() else flat)
        if isinstance(value, torch.nn.Parameter):
            gm.register_parameter(name, value)
        else:
            gm.register_buffer(name, value, persistent=bool(persistent))
        with graph.inserting_before(first_op):
            attr = graph.get_attr(name)
        attr.meta = node.meta
        node.replace_all_uses_with(attr)
        graph.erase_node(node)
    check_writes(graph, gm)  # in place only on buffers that own their bytes, intermediates
    if compile:
        gm.graph = graph  # the one compile of the program
    else:  # as torch's _create_graph_module_for_export does on a graph it cannot compile
        gm._graph, graph.owning_module = graph, gm
    return gm
