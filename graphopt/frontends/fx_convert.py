"""fx graph -> graphopt IR: one linear pass (about 0.1 s for 7,000 fx nodes).

Input is the graph :mod:`graphopt.frontends.torch_frontend` traced (an ``ExportedProgram`` or a
``make_fx`` ``GraphModule``), or any aten-level ``GraphModule`` a rewrite produces; keeping the
conversion apart lets those rewrites re-read their graphs without the tracing machinery.

* ``operator.getitem`` on a multi-output op is not a node: it names output ``i`` of the producer;
  an element nobody reads is ``''`` in ``Node.outputs`` and has no TensorInfo.
* Shape asserts (``aten._assert_*``, ``sym_constrain_range*``) get no node; the subgraphs of
  ``torch.no_grad()``/autocast/checkpoint wrappers are inlined with the wrapper's name as prefix.
* An op the table (:mod:`graphopt.frontends.aten_ops`) cannot map keeps its source name as
  ``op_type`` with its tensor inputs; ``Graph.warnings`` lists such ops once, with counts.
"""

from __future__ import annotations

import logging
import math
import operator
import re
from collections import Counter
from typing import Any

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

from graphopt.frontends.aten_ops import (
    ATEN_OPS,
    SKIP_OPS,
    TORCH_DTYPES,
    Call,
    MapResult,
    Ref,
    plain,
)
from graphopt.ir.graph import Graph, Node, TensorInfo, TensorKind

__all__ = ["computes_nothing", "graph_from_exported_program", "graph_from_graph_module"]

logger = logging.getLogger(__name__)

# Python-level arithmetic that export/make_fx record on SymInts: shape math, no tensor work.
_SYMBOLIC_FNS = {getattr(operator, n) for n in (
    "add", "sub", "mul", "floordiv", "truediv", "mod", "neg", "pow", "eq", "ne", "lt", "le",
    "gt", "ge", "and_", "or_", "not_")} | {getattr(math, n) for n in ("ceil", "floor", "trunc")} \
    | {getattr(torch, n) for n in ("sym_float", "sym_int", "sym_max", "sym_min", "sym_not",
                                   "sym_ite", "sym_sqrt") if hasattr(torch, n)}
_SYMBOL = re.compile(r"\b[su]\d+\b")
_INLINE_HOPS = frozenset(f"higher_order.{n}" for n in (
    "wrap_with_set_grad_enabled", "wrap_with_autocast", "tag_activation_checkpoint",
    "wrap_activation_checkpoint"))


def graph_from_exported_program(ep: torch.export.ExportedProgram, *, name: str = "model",
                                warnings: list[str] | None = None,
                                dim_names: dict[str, str] | None = None) -> Graph:
    """Convert an ``ExportedProgram`` (parameters are placeholders named by its signature)."""
    from torch.export.graph_signature import InputKind, OutputKind

    kind_of = {InputKind.USER_INPUT: "input", InputKind.PARAMETER: "param",
               InputKind.BUFFER: "param"}
    kinds: dict[str, TensorKind] = {}
    for spec in ep.graph_signature.input_specs:
        if getattr(spec.arg, "name", None):
            kinds[spec.arg.name] = kind_of.get(spec.kind, "constant")  # type: ignore[assignment]
    outputs = [s.arg.name for s in ep.graph_signature.output_specs
               if s.kind == OutputKind.USER_OUTPUT and getattr(s.arg, "name", None)]
    return _convert(ep.graph_module, name=name, kinds=kinds, output_names=outputs,
                    warnings=list(warnings or []), source_model=ep, dim_names=dim_names or {})


def graph_from_graph_module(gm: fx.GraphModule, *, name: str = "model",
                            kinds: dict[str, TensorKind] | None = None,
                            warnings: list[str] | None = None) -> Graph:
    """Convert an aten-level ``GraphModule``; placeholders not in ``kinds`` are user inputs."""
    return _convert(gm, name=name, kinds=kinds or {}, output_names=None,
                    warnings=list(warnings or []), source_model=gm, dim_names={})


_KEYS: dict[Any, tuple[str, str, str]] = {}  # target -> (table key, overload, source_op)
_SCHEMAS: dict[Any, list[tuple[str, bool, Any]]] = {}  # OpOverload -> [(name, kw_only, default)]


def _target_key(target: Any) -> tuple[str, str, str]:
    hit = _KEYS.get(target)
    if hit is None:
        if isinstance(target, torch._ops.OpOverload):
            hit = (str(target.overloadpacket), target._overloadname, str(target))
        elif isinstance(target, torch._ops.HigherOrderOperator):
            hit = (f"higher_order.{target.name()}", "", f"higher_order.{target.name()}")
        else:
            mod = getattr(target, "__module__", None) or "builtins"
            src = f"{mod}.{getattr(target, '__name__', target)}"
            hit = (src, "", src)
        _KEYS[target] = hit
    return hit


def computes_nothing(target: Any) -> bool:
    """An fx call target that only asserts or constrains shapes (``aten_ops.SKIP_OPS``): it
    gets no plan node."""
    return _target_key(target)[0] in SKIP_OPS


def _schema(target: Any) -> list[tuple[str, bool, Any]] | None:
    if not isinstance(target, torch._ops.OpOverload):
        return None
    s = _SCHEMAS.get(target)
    if s is None:
        s = [(a.name, a.kwarg_only, a.default_value if a.has_default_value() else None)
             for a in target._schema.arguments]
        _SCHEMAS[target] = s
    return s


class _Converter:
    """One pass over the fx nodes; ``values`` maps an fx node name to its Ref(s).

    Subgraphs of the "run once" higher-order ops (``wrap_with_set_grad_enabled`` from a
    ``torch.no_grad()`` block, ``wrap_with_autocast``, activation checkpointing) are inlined; their
    nodes get the wrapper's name as a prefix (``wrap_with_set_grad_enabled.cos``).
    """

    def __init__(self, kinds: dict[str, TensorKind], dim_names: dict[str, str]) -> None:
        self.kinds = kinds
        self.dim_names = dim_names
        self.tensors: dict[str, TensorInfo] = {}
        self.values: dict[str, Any] = {}
        self.nodes: list[Node] = []
        self.inputs: list[str] = []
        self.unmapped: Counter[str] = Counter()
        self.prefix = ""
        self.root: nn.Module | None = None
        self._sym_cache: dict[str, str] = {}

    def walk(self, gm: nn.Module, prefix: str = "", bind: list[Any] | None = None) -> list[Any]:
        """Convert ``gm``'s nodes; ``bind`` gives a subgraph's placeholder values. Returns the
        resolved output leaves."""
        saved, self.prefix, self.root = (self.prefix, self.root), prefix, gm
        outs: list[Any] = []
        operands = iter(bind or [])
        for n in gm.graph.nodes:  # type: ignore[union-attr]
            name = prefix + n.name
            if n.op in ("call_function", "call_method", "call_module"):
                if name not in self.values:  # getitems were resolved by their producer
                    self.call(n)
            elif n.op == "placeholder" and bind is not None:
                self.values[name] = next(operands, None)
            elif n.op == "placeholder":
                kind = self.kinds.get(n.name, "input")
                val = n.meta.get("val")
                if not isinstance(val, (torch.Tensor, torch.SymInt)):
                    self.values[name] = val  # a constant (None, int, ...) specialized in
                elif self.add_tensor(name, val, kind, False) and kind == "input":
                    self.inputs.append(name)
            elif n.op == "get_attr":
                obj = _fetch(gm, n.target)
                kind = "param" if isinstance(obj, nn.Parameter) else "constant"
                if isinstance(obj, torch.Tensor):
                    self.add_tensor(name, obj, kind, False)
                elif isinstance(obj, torch.ScriptObject):  # packed weights (quantized::linear)
                    self.add_tensor(name, _packed_weight(obj), "param", True)
                else:
                    self.values[name] = str(n.target)  # a subgraph (e.g. a torch.cond branch)
            elif n.op == "output":
                outs = [self.resolve(x) for x in pytree.tree_leaves(n.args[0])
                        if isinstance(x, fx.Node)]
        self.prefix, self.root = saved
        return outs

    def sym(self, v: Any) -> str:
        s = str(v)
        hit = self._sym_cache.get(s)
        if hit is None:
            hit = _SYMBOL.sub(lambda m: self.dim_names.get(m.group(0), m.group(0)), s)
            self._sym_cache[s] = hit
        return hit

    def info(self, name: str, val: Any, kind: TensorKind) -> TensorInfo | None:
        if isinstance(val, torch.Tensor):
            shape = tuple(val.shape)
            if not all(type(d) is int for d in shape):
                shape = tuple(d if type(d) is int else self._dim(d) for d in shape)
            return TensorInfo(name, shape, TORCH_DTYPES.get(val.dtype), kind)
        if isinstance(val, (bool, torch.SymBool)):
            return TensorInfo(name, (), "bool", kind)
        if isinstance(val, (int, torch.SymInt)):
            return TensorInfo(name, (), "int64", kind)
        if isinstance(val, (float, torch.SymFloat)):
            return TensorInfo(name, (), "fp64", kind)
        return None

    def _dim(self, d: Any) -> int | str:
        hint = d.node.maybe_as_int() if hasattr(d, "node") else None
        return hint if hint is not None else self.sym(d)

    def ref(self, name: str, val: Any) -> Ref:
        if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return Ref(name, self.sym(val))
        return Ref(name, val) if isinstance(val, (int, float)) else Ref(name)

    def resolve(self, a: Any) -> Any:
        if isinstance(a, fx.Node):
            name = self.prefix + a.name
            return self.values.get(name, Ref(name))
        if isinstance(a, (list, tuple)):
            return [self.resolve(x) for x in a]
        return a

    def add_tensor(self, name: str, val: Any, kind: TensorKind, used: bool) -> bool:
        info = self.info(name, val, kind)
        if info is None and used:
            info = TensorInfo(name, None, None, kind)
        if info is not None:
            self.tensors[name] = info
        self.values[name] = self.ref(name, val) if info is not None else val
        return info is not None

    def call(self, n: fx.Node) -> None:
        key, overload, source = _target_key(n.target)
        if computes_nothing(n.target):
            return
        if key in _INLINE_HOPS and self.inline(n):
            return
        name = self.prefix + n.name
        val = n.meta.get("val")
        if val is None and "tensor_meta" in n.meta:
            val = _meta_tensor(n.meta["tensor_meta"])
        if isinstance(val, (tuple, list)):
            outputs = self.multi_outputs(n, val)
        else:
            used = bool(n.users)
            outputs = [name] if self.add_tensor(name, val, "activation", used) else []
        schema = _schema(n.target)
        if schema is not None:
            nargs = len(n.args)
            raw = {nm: n.args[i] if i < nargs and not kw else n.kwargs.get(nm, dflt)
                   for i, (nm, kw, dflt) in enumerate(schema)}
        else:
            raw = {f"arg{i}": a for i, a in enumerate(n.args)} | dict(n.kwargs)
        args = {k: self.resolve(v) for k, v in raw.items()}
        c = Call(key, overload, args, self.tensors, [self.tensors.get(o) for o in outputs])
        fn = ATEN_OPS.get(key) or (_symbolic if n.target in _SYMBOLIC_FNS else None)
        result: MapResult | None = None
        if fn is not None:
            try:
                result = fn(c)
            except Exception:  # noqa: BLE001 - an odd call keeps its source name, never crashes
                logger.debug("mapping %s failed; kept unmapped", source, exc_info=True)
        if result is None:
            self.unmapped[source] += 1
            result = _unmapped(source, c)
        op_type, inputs, attrs = result
        if key == "aten.reshape" and attrs.get("alias") and _copies(n):
            attrs = {**attrs, "alias": False}  # a reshape that could not be a view: a copy
        self.nodes.append(Node(name, op_type, source, inputs, outputs, attrs))

    def inline(self, n: fx.Node) -> bool:
        """Convert a wrapper HOP's subgraph in place of the HOP node (False: not a subgraph)."""
        at = next((i for i, a in enumerate(n.args) if isinstance(a, fx.Node)
                   and a.op == "get_attr"), None)
        sub = None if at is None else _fetch(self.root, n.args[at].target)  # type: ignore[arg-type]
        if not isinstance(sub, fx.GraphModule):
            return False
        operands = [self.resolve(a) for a in n.args[at + 1:]]  # type: ignore[operator]
        outs = self.walk(sub, f"{self.prefix}{n.name}.", operands)
        self.values[self.prefix + n.name] = outs
        for u in n.users:
            if u.target is operator.getitem and isinstance(u.args[1], int):
                self.values[self.prefix + u.name] = outs[u.args[1]]
        return True

    def multi_outputs(self, n: fx.Node, val: Any) -> list[str]:
        """getitem users name the elements they read; unread elements are ''."""
        p = self.prefix
        outputs = [""] * len(val)
        whole = False
        for u in n.users:
            if u.target is operator.getitem and isinstance(u.args[1], int):
                i = u.args[1] % len(val)
                if not u.users:  # `a, _, c = x.split(...)`: the element is never read
                    self.values.setdefault(p + u.name, None)
                    continue
                if not outputs[i]:
                    outputs[i] = p + u.name
                    self.add_tensor(outputs[i], val[i], "activation", True)
                self.values[p + u.name] = self.values[outputs[i]]
            else:
                whole = True
        if whole:  # the tuple itself is consumed: every element is read
            for i, o in enumerate(outputs):
                if not o:
                    outputs[i] = f"{p}{n.name}.{i}"
                    self.add_tensor(outputs[i], val[i], "activation", True)
            self.values[p + n.name] = [self.values[o] for o in outputs]
        return outputs


def _symbolic(c: Call) -> MapResult:
    """Python arithmetic on SymInts: shape computation, free at run time."""
    return "Shape", [], {"symbolic": c.packet, "args": [plain(v) for v in c.args.values()]}


def _unmapped(source: str, c: Call) -> MapResult:
    inputs: list[str] = []
    attrs: dict[str, Any] = {}
    for k, v in c.args.items():
        refs = [x for x in (v if isinstance(v, list) else [v]) if isinstance(x, Ref)]
        if refs and all(r.scalar is None for r in refs):
            inputs.extend(r.name for r in refs)
        elif v is not None:
            attrs[k] = plain(v)
    return source, inputs, attrs


def _convert(gm: fx.GraphModule, *, name: str, kinds: dict[str, TensorKind],
             output_names: list[str] | None, warnings: list[str], source_model: Any,
             dim_names: dict[str, str]) -> Graph:
    cv = _Converter(kinds, dim_names)
    out_values = cv.walk(gm)
    if output_names is not None:
        out_values = [cv.values.get(o) for o in output_names]
    outputs: list[str] = []
    for v in out_values:
        for r in v if isinstance(v, list) else [v]:
            if isinstance(r, Ref) and r.scalar is None:
                outputs.append(r.name)
    if cv.unmapped:
        listing = ", ".join(f"{k} x{v}" for k, v in cv.unmapped.most_common(10))
        warnings.append(f"{sum(cv.unmapped.values())} nodes have no canonical op and keep "
                        f"their source name: {listing}")
    logger.info("torch frontend: %d nodes, %d tensors, %d unmapped", len(cv.nodes),
                len(cv.tensors), sum(cv.unmapped.values()))
    return Graph(name=name, source="torch", nodes=cv.nodes, tensors=cv.tensors,
                 inputs=cv.inputs, outputs=outputs, warnings=warnings,
                 source_model=source_model)


def _packed_weight(obj: Any) -> torch.Tensor | None:
    """The weight inside a prepacked params object (``LinearPackedParamsBase.unpack()``)."""
    try:
        w = obj.unpack()[0]
    except Exception:  # noqa: BLE001 - other script objects have no weight to show
        return None
    return w if isinstance(w, torch.Tensor) else None


def _fetch(gm: nn.Module, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part, None)
    return obj


def _meta_tensor(tm: Any) -> Any:
    """Meta tensor(s) from ShapeProp's ``TensorMetadata``, for graphs without ``val``."""
    if isinstance(tm, (list, tuple)) and not hasattr(tm, "dtype"):
        return [_meta_tensor(t) for t in tm]
    if hasattr(tm, "shape") and hasattr(tm, "dtype"):
        return torch.empty(tuple(tm.shape), dtype=tm.dtype, device="meta")
    return None


def _copies(n: fx.Node) -> bool:
    """``reshape`` returns a view when the input's strides allow one and a copy otherwise
    (after a transpose, typically); the traced values say which: a view shares its input's
    storage. Values without storage say nothing: a view is assumed."""
    src = n.args[0] if n.args else None
    before = src.meta.get("val") if isinstance(src, fx.Node) else None
    after = n.meta.get("val")
    if not (isinstance(before, torch.Tensor) and isinstance(after, torch.Tensor)):
        return False
    try:
        return before.untyped_storage()._cdata != after.untyped_storage()._cdata
    except Exception:  # noqa: BLE001 - a tensor subclass without a storage
        return False
