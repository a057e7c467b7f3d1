"""The graph half of graphopt's ``.pt2`` reader: the archive's JSON graph as an ``fx.Graph``,
named and wired as torch's ``GraphModuleDeserializer`` does (:mod:`.pt2_reader` does the rest).

Why apart: this is the part that turns untrusted JSON into code, so every rule it keeps is in
one place: a value's name is a plain identifier, a target is an op this process has registered
(never a module the file names) and one :mod:`.pt2_ops` allows (else ``Refused``), an argument
is of a kind it knows; anything else is ``Unhandled`` (not read) or ``Damaged``.
"""

from __future__ import annotations

import keyword
import math
import operator
from typing import Any

import torch
from torch import fx

from graphopt.backends.torch.pt2_archive import Damaged, Unhandled
from graphopt.backends.torch.pt2_ops import Refused, qualified, refusal

__all__ = ["DTYPES", "GraphBuilder", "one_field", "parse_device", "plain_name"]

DTYPES = {1: torch.uint8, 2: torch.int8, 3: torch.int16, 4: torch.int32, 5: torch.int64,
          6: torch.float16, 7: torch.float32, 8: torch.float64, 9: torch.complex32,
          10: torch.complex64, 11: torch.complex128, 12: torch.bool, 13: torch.bfloat16,
          28: torch.uint16, 29: torch.float8_e4m3fn, 30: torch.float8_e5m2,
          31: torch.float8_e4m3fnuz, 32: torch.float8_e5m2fnuz, 34: torch.uint32,
          35: torch.uint64}
_ENUMS = {  # schema.py's ScalarType, MemoryFormat and Layout codes
    "as_scalar_type": DTYPES,
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


def one_field(d: Any, what: str) -> tuple[str, Any]:
    """The one (kind, value) of a serialized one-field union."""
    if not isinstance(d, dict) or len(d) != 1:
        raise Damaged(f"{what} is not a one-field union: {str(d)[:80]}")
    return next(iter(d.items()))


def parse_device(d: Any) -> torch.device:
    """A serialized device as a ``torch.device``."""
    if not isinstance(d, dict) or not isinstance(d.get("type"), str):
        raise Damaged(f"device {str(d)[:60]}")
    index = d.get("index")
    return torch.device(d["type"]) if index is None else torch.device(d["type"], index)


def plain_name(v: Any) -> str:
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
    if kind not in _SYM or one_field(value, "symbolic output")[0] != "as_name":
        raise Unhandled(f"output {kind} {str(value)[:60]}")
    return plain_name(value["as_name"])


def _target(name: str) -> Any:
    """The callable a serialized target names: an ATen/custom op overload or a sym op."""
    if not isinstance(name, str):
        raise Damaged(f"target {str(name)[:60]}")
    parts = name.split(".")
    try:
        if parts[:2] == ["torch", "ops"] and len(parts) == 5:
            op = getattr(getattr(getattr(torch.ops, parts[2]), parts[3]), parts[4])
            if isinstance(op, torch._ops.OpOverload):
                if (why := refusal(op)) is not None:
                    raise Refused(f"its graph calls {qualified(op)}: {why}")
                return op
        elif len(parts) == 2 and parts[0] in ("_operator", "torch", "math"):
            module = {"_operator": operator, "torch": torch, "math": math}[parts[0]]
            if (fn := getattr(module, parts[1])) in _SYM_OPS:
                return fn
    except (AttributeError, RuntimeError):
        pass
    if parts[:2] == ["torch", "ops"] and len(parts) == 5 and parts[2] != "aten":
        raise Unhandled(f"the op {parts[2]}::{parts[3]}"[:140] + ", not registered in this "
                        f"process (a model library's op: import the module that registers "
                        f"the '{parts[2][:40]}' ops before graphopt.load)")
    raise Unhandled(f"the op {name[:120]} (not an op this process has registered)")


class GraphBuilder:
    """JSON graph -> fx.Graph, named and wired as torch's GraphModuleDeserializer does."""

    def __init__(self) -> None:
        self.graph, self.nodes = fx.Graph(), {}

    def sync(self, name: str, node: fx.Node) -> None:
        if plain_name(name) in self.nodes:
            raise Damaged(f"value {name} defined twice")
        node.name = name  # torch overwrites the name fx's namespace chose
        self.nodes[name] = node

    def sym(self, a: Any, scalar: str) -> Any:
        kind, value = one_field(a, "symbolic argument")
        if kind == "as_name":
            return self.nodes[value]
        if kind != scalar:
            raise Unhandled(f"symbolic argument {str(a)[:60]}")
        return float(value) if scalar == "as_float" else _scalar(scalar, value)

    def arg(self, a: Any) -> Any:
        kind, v = one_field(a, "argument")
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
            return parse_device(v)
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
                    for k, t in (one_field(x, "optional tensor") for x in v)]
        if kind in _SYM_LISTS:
            return [self.sym(x, _SYM_LISTS[kind]) for x in v]
        raise Unhandled(f"argument kind {kind}")

    def node(self, s: dict[str, Any]) -> None:
        target, outputs, name = _target(s["target"]), s["outputs"], plain_name(s.get("name"))
        trace = _stack_trace((s.get("metadata") or {}).get("stack_trace"))
        meta = {"stack_trace": trace} if trace else {}
        if not isinstance(outputs, list):
            raise Damaged(f"node {name} outputs")
        if target in _SYM_OPS:
            args = tuple(self.arg(i["arg"]) for i in s["inputs"])
            node = self.graph.create_node("call_function", target, args, {}, name)
            self.sync(_sym_name(*one_field(outputs[0] if len(outputs) == 1 else None,
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
        items = [one_field(o, "output") for o in outputs]
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
