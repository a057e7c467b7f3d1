"""Torch frontend: an ``nn.Module`` plus example inputs becomes a :class:`graphopt.ir.Graph`.

Strategy, first success wins:

1. ``torch.export.export(model, args, kwargs, strict=False)``. Its graph keeps the high-level ATen
   ops the planner wants to see whole (``aten.linear``, ``aten.conv2d``, ``aten.layer_norm``,
   ``aten.scaled_dot_product_attention``), every node has a FakeTensor ``meta["val"]`` with shape
   and dtype, and ``graph_signature.input_specs`` says which placeholders are parameters, buffers,
   lifted constants or user inputs.
2. If export fails (data-dependent control flow, untraceable Python), ``make_fx`` over
   ``torch.func.functional_call`` with real tensors. Python control flow is run, not captured, so
   the graph is the branch the example inputs took (a warning says so). Ops are one level lower
   (``aten.t`` + ``aten.addmm``, ``aten.convolution``, ``aten.native_layer_norm``,
   ``aten._softmax``, ``aten._scaled_dot_product_flash_attention_for_cpu``); the op table maps
   those too. Parameters are passed detached and buffers as clones, so in-place updates inside
   ``forward`` (batchnorm running stats) land on the copies.
3. Both fail: :class:`TraceError` with the first lines of each error and what to change.

The user's model is never changed: no ``.eval()``/``.train()``, no writes to parameters or buffers.

Conversion from the fx graph is one linear pass (about 0.1 s for 7,000 fx nodes):

* ``operator.getitem`` on a multi-output op is not a node: it names output ``i`` of the producer;
  an element nobody reads is ``''`` in ``Node.outputs`` and has no TensorInfo.
* Shape asserts (``aten._assert_*``, ``sym_constrain_range*``) get no node; the subgraphs of
  ``torch.no_grad()``/autocast/checkpoint wrappers are inlined with the wrapper's name as prefix.
* An op the table (:mod:`graphopt.frontends.aten_ops`) cannot map keeps its source name as
  ``op_type`` with its tensor inputs; ``Graph.warnings`` lists such ops once, with counts.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
import math
import operator
import re
import sys
from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

from graphopt.errors import TraceError
from graphopt.frontends.aten_ops import (
    ATEN_OPS,
    SKIP_OPS,
    TORCH_DTYPES,
    Call,
    MapResult,
    Ref,
    plain,
)
from graphopt.ir import Graph, Node, TensorInfo, TensorKind

__all__ = ["TRAINING_WARNING", "graph_from_exported_program", "graph_from_graph_module",
           "trace_torch"]

logger = logging.getLogger(__name__)

TRAINING_WARNING = ("model is in training mode: dropout/batchnorm are traced in training form; "
                    "call model.eval() before planning for deployment")
_FIX = ("pass example inputs that match forward's signature (a tensor, a tuple of positional "
        "args, or a dict of keyword args); for transformers models such as GPT-2 set "
        "use_cache=False in the config; remove data-dependent Python control flow "
        "(`if x.sum() > 0:`) or wrap it in torch.cond; for sizes that vary give "
        "dynamic_shapes (torch.export.Dim)")
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


def trace_torch(model: nn.Module, example_inputs: Any, *, dynamic_shapes: Any = None) -> Graph:
    """Trace ``model`` on ``example_inputs`` (a tensor, a tuple/list of args, or a kwargs dict)."""
    if not isinstance(model, nn.Module):
        raise TraceError(f"trace_torch needs a torch.nn.Module, got {type(model).__name__}",
                         "pass the nn.Module instance itself (load ONNX files with the ONNX "
                         "frontend, TorchScript files with torch.jit.load first)")
    args, kwargs = _split_inputs(model, example_inputs)
    warnings = [TRAINING_WARNING] if model.training else []
    modes = [(m, m.training) for m in model.modules()]
    try:
        try:
            with _quiet_torch():
                ep = torch.export.export(model, args, kwargs, dynamic_shapes=dynamic_shapes,
                                         strict=False)
        except Exception as export_err:  # noqa: BLE001 - any export failure falls back
            logger.debug("torch.export failed", exc_info=True)
            try:
                with _quiet_torch():
                    gm, kinds = _make_fx(model, args, kwargs)
            except Exception as fx_err:  # noqa: BLE001
                logger.debug("make_fx fallback failed", exc_info=True)
                raise TraceError(
                    f"could not trace {type(model).__name__}: torch.export failed with "
                    f"{_first_lines(export_err)}; the make_fx fallback failed with "
                    f"{_first_lines(fx_err)}", _FIX) from None
            warnings.append(
                f"torch.export failed ({_first_lines(export_err, 1)}); traced with make_fx on "
                "the example inputs instead: Python control flow is specialized to them (the "
                "graph holds only the branch they took) and shapes are static")
            return graph_from_graph_module(gm, name=type(model).__name__, kinds=kinds,
                                           warnings=warnings)
        names = _dim_names(model, ep, dynamic_shapes)
        return graph_from_exported_program(ep, name=type(model).__name__, warnings=warnings,
                                           dim_names=names)
    finally:
        for m, was in modes:  # tracing must not flip modes; restore if some forward did
            if m.training != was:
                logger.warning("forward changed %s.training; restored", type(m).__name__)
                m.training = was


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


# --- inputs and tracing -------------------------------------------------------------------------
def _split_inputs(model: nn.Module, example: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Normalize example inputs to (args, kwargs) and check them against forward's signature."""
    cls = type(model).__name__
    if example is None:
        raise TraceError(f"no example inputs given for {cls}",
                         "pass example inputs: trace_torch(model, torch.randn(1, 3, 224, 224)), "
                         "a tuple of positional args, or a dict of keyword args")
    if isinstance(example, dict):
        if not all(isinstance(k, str) for k in example):
            raise TraceError("example input dict keys must be forward's parameter names",
                             "use a dict like {'input_ids': ids, 'attention_mask': mask}")
        args, kwargs = (), dict(example)
    elif isinstance(example, (tuple, list)):
        args, kwargs = tuple(example), {}
    else:
        args, kwargs = (example,), {}
    for leaf in pytree.tree_leaves((args, kwargs)):
        if type(leaf).__module__ == "numpy":
            raise TraceError(f"example inputs hold a numpy value ({type(leaf).__name__})",
                             "convert it with torch.as_tensor(...) before tracing")
    try:
        sig = inspect.signature(model.forward)
    except (TypeError, ValueError):
        return args, kwargs
    try:
        sig.bind(*args, **kwargs)
    except TypeError as err:
        raise TraceError(f"example inputs do not match {cls}.forward{sig}: {err}",
                         "pass one example value per required forward parameter, in order "
                         "(a tuple for several), or a dict keyed by parameter name") from None
    return args, kwargs


def _make_fx(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
             ) -> tuple[fx.GraphModule, dict[str, TensorKind]]:
    """Trace with make_fx over functional_call; returns the module and placeholder kinds."""
    from torch.fx.experimental.proxy_tensor import make_fx

    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    names = list(params) + list(buffers)
    state = [p.detach() for p in params.values()] + [b.detach().clone() for b in buffers.values()]
    flat, spec = pytree.tree_flatten((args, kwargs))
    where = [i for i, v in enumerate(flat) if isinstance(v, torch.Tensor)]
    inputs = [flat[i].detach().clone() for i in where]

    def run(state: list[torch.Tensor], inputs: list[torch.Tensor]) -> Any:
        leaves = list(flat)
        for i, t in zip(where, inputs, strict=True):
            leaves[i] = t
        a, kw = pytree.tree_unflatten(leaves, spec)
        return torch.func.functional_call(model, dict(zip(names, state, strict=True)), tuple(a), kw)

    opts: dict[str, Any] = {"tracing_mode": "real"}
    if "_error_on_data_dependent_ops" in inspect.signature(make_fx).parameters:
        opts["_error_on_data_dependent_ops"] = False  # let `if x.sum() > 0` run on real values
    gm = make_fx(run, **opts)(state, inputs)
    gm.graph.eliminate_dead_code()  # drops unused getitems/empties; keeps in-place mutations
    new_names = [("p_" if i < len(params) else "b_") + re.sub(r"\W", "_", n)
                 for i, n in enumerate(names)] + _input_names(model, args, kwargs)
    kinds: dict[str, TensorKind] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, (node, new) in enumerate(zip(placeholders, new_names, strict=False)):
        if hasattr(node, "_rename"):
            node._rename(new)
        kinds[node.name] = "param" if i < len(names) else "input"
    gm.recompile()
    return gm, kinds


def _input_names(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[str]:
    """Names for the tensor leaves of the inputs, from forward's parameter names."""
    try:
        params = [p.name for p in inspect.signature(model.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    out = []
    for path, leaf in pytree.tree_flatten_with_path((args, kwargs))[0]:
        if not isinstance(leaf, torch.Tensor):
            continue
        top = path[1]
        idx = getattr(top, "idx", None)
        base = (str(getattr(top, "key", "")) if idx is None
                else params[idx] if idx < len(params) else f"arg{idx}")
        rest = [str(getattr(k, "idx", getattr(k, "key", k))) for k in path[2:]]
        out.append(re.sub(r"\W", "_", "_".join([base, *rest])))
    return out


def _dim_names(model: nn.Module, ep: Any, dynamic_shapes: Any) -> dict[str, str]:
    """Map shape symbols (``s0``) to the names of the ``torch.export.Dim`` the user gave."""
    if not dynamic_shapes:
        return {}
    if isinstance(dynamic_shapes, (tuple, list)):
        try:
            params = list(inspect.signature(model.forward).parameters)
        except (TypeError, ValueError):
            return {}
        dynamic_shapes = dict(zip(params, dynamic_shapes, strict=False))
    out: dict[str, str] = {}
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    for arg, spec in dict(dynamic_shapes).items():
        val = getattr(placeholders.get(arg), "meta", {}).get("val")
        if not isinstance(val, torch.Tensor) or spec is None:
            continue
        items = spec.items() if isinstance(spec, dict) else enumerate(spec)
        for i, dim in items:
            size = val.shape[i] if i < val.ndim else None
            if isinstance(size, torch.SymInt) and hasattr(dim, "__name__"):
                out[str(size)] = dim.__name__
    return out


@contextlib.contextmanager
def _quiet_torch() -> Iterator[None]:
    """Keep torch's tracing chatter (partial graphs, guard logs, the fake-tensor traceback of a
    shape mismatch) off the user's stderr; the loggers' levels are restored after.

    A failure reaches the user as the TraceError or the fallback warning; the chatter goes to
    this module's debug log. Whatever a successful export wrote to stderr is passed on.
    Torch's log handlers keep the stderr they were made with, so redirecting ``sys.stderr``
    alone does not catch them: their loggers are raised to CRITICAL (``torch`` for children
    that inherit, the others in case ``TORCH_LOGS`` gave them a level of their own).
    """
    names = ("torch", "torch.export", "torch._export", "torch._subclasses.fake_tensor",
             "torch.fx.experimental.symbolic_shapes", "torch.fx.experimental.proxy_tensor")
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    buf = io.StringIO()
    failed = True
    try:
        for lg in loggers:
            lg.setLevel(logging.CRITICAL)
        with contextlib.redirect_stderr(buf):
            yield
        failed = False
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)
        if failed and buf.getvalue():
            logger.debug("torch.export stderr:\n%s", buf.getvalue())
        elif buf.getvalue():
            sys.stderr.write(buf.getvalue())


def _first_lines(err: BaseException, n: int = 3) -> str:
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()][:n]
    return f"{type(err).__name__}: " + " / ".join(ln[:300] for ln in lines)


# --- fx graph -> Graph --------------------------------------------------------------------------
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
        if key in SKIP_OPS:
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
