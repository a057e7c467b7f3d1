"""Torch frontend: an ``nn.Module`` plus example inputs becomes a :class:`graphopt.ir.graph.Graph`.

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
Tracing runs on a private copy of the model and the inputs (every tensor they reach, buffers
and a ``StaticCache``'s tensors alike, :mod:`graphopt.frontends.user_state`), under a guard
that puts back, and names, anything of the user's that changed anyway; the exported program
holds the copy's tensors, never the user's.
A ``forward`` that takes ``use_cache`` with the cache on (transformers' default) is traced with
``use_cache=False`` by keyword (:func:`graphopt.frontends.torch_inputs.without_cache`; its config
is untouched): the graph, and the module ``optimize`` returns, give every output but
``past_key_values``, and the plan's warnings say so.
This module traces; :mod:`graphopt.frontends.fx_convert` turns the traced graph into the IR (its
two entry points are re-exported here, where callers have always imported them).
"""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
import re
import sys
from collections.abc import Iterator
from typing import Any

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

from graphopt.errors import GraphoptError, TraceError, first_line, user_code
from graphopt.files.progress import progress
from graphopt.frontends.fx_convert import graph_from_exported_program, graph_from_graph_module
from graphopt.frontends.output_types import as_plain, register_dataclasses
from graphopt.frontends.range_check import check_against
from graphopt.frontends.torch_inputs import without_cache
from graphopt.frontends.user_state import private_copy, user_state_guard
from graphopt.ir.graph import Graph, TensorKind
from graphopt.ir.shape_range import DimRange, ShapeRange

__all__ = ["TRAINING_WARNING", "export_range", "graph_from_exported_program",
           "graph_from_graph_module", "trace_torch"]

logger = logging.getLogger(__name__)

TRAINING_WARNING = ("model is in training mode: dropout/batchnorm are traced in training form; "
                    "call model.eval() before planning for deployment")
_FIX = ("pass example inputs that match forward's signature (a tensor, a tuple of positional "
        "args, or a dict of keyword args); a model that returns a KV cache must not (graphopt "
        "passes use_cache=False when forward takes it; otherwise turn the cache off); remove "
        "data-dependent Python control flow (`if x.sum() > 0:`) or wrap it in torch.cond; "
        "for sizes that vary give dynamic_shapes (torch.export.Dim)")


def trace_torch(model: nn.Module, example_inputs: Any, *, dynamic_shapes: Any = None) -> Graph:
    """Trace ``model`` on ``example_inputs`` (a tensor, a tuple/list of args, or a kwargs dict)."""
    if not isinstance(model, nn.Module):
        raise TraceError(f"trace_torch needs a torch.nn.Module, got {type(model).__name__}",
                         "pass the nn.Module instance itself (load ONNX files with the ONNX "
                         "frontend, TorchScript files with torch.jit.load first)")
    name = type(model).__name__
    with user_state_guard(model, example_inputs, f"tracing {name}"):
        own, inputs, in_place = _private(model, example_inputs)
        args, kwargs = _split_inputs(own, inputs)
        check_against(dynamic_shapes, own, args, kwargs)  # an unknown input is an error
        warnings = [TRAINING_WARNING] if own.training else []
        traced, no_cache = without_cache(own, kwargs)
        warnings += [w for w in (in_place, no_cache) if w]
        modes = [(m, m.training) for m in own.modules()]
        try:
            with user_code(f"{name}.forward"), progress(f"tracing {name} with torch.export"):
                return _trace(traced, args, kwargs, dynamic_shapes, warnings)
        finally:
            for m, was in modes:  # tracing must not flip modes; restore if some forward did
                if m.training != was:
                    logger.warning("forward changed %s.training; restored", type(m).__name__)
                    m.training = was


def _private(model: nn.Module, example_inputs: Any) -> tuple[nn.Module, Any, str | None]:
    """A copy of the model and inputs to trace (export writes through the tensors it does not
    swap for fakes: a cache object's, an attribute's), the parameters shared (export reads
    them as fakes); the model itself, and the warning, when it cannot be copied."""
    try:
        own, inputs = private_copy((model, example_inputs), share_parameters=True)
    except GraphoptError as e:
        return model, example_inputs, (f"{e.problem}: traced {type(model).__name__} itself; "
                                       "its tensors were checked and put back after")
    return own, inputs, None


def _export(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
            dynamic_shapes: Any) -> Any:
    with _quiet_torch():
        return torch.export.export(model, args, kwargs, dynamic_shapes=dynamic_shapes,
                                   strict=False)


def _trace(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], dynamic_shapes: Any,
           warnings: list[str]) -> Graph:
    """torch.export, else make_fx (after registering dataclass outputs, export once more)."""
    name = type(model).__name__
    try:
        ep = _export(model, args, kwargs, dynamic_shapes)
    except Exception as export_err:  # noqa: BLE001 - any export failure falls back
        logger.debug("torch.export failed", exc_info=True)
        try:
            with _quiet_torch():
                gm, kinds, found = _make_fx(model, args, kwargs)
        except Exception as fx_err:  # noqa: BLE001
            logger.debug("make_fx fallback failed", exc_info=True)
            raise TraceError(
                f"could not trace {name}: torch.export failed with "
                f"{_first_lines(export_err)}; the make_fx fallback failed with "
                f"{_first_lines(fx_err)}", _FIX) from None
        ep = _export_again(model, args, kwargs, dynamic_shapes, found, warnings)
        if ep is None:
            cause = _export_cause(model, export_err, dynamic_shapes)
            gm.meta["export_error"] = cause  # prepare's error names it: optimize has no plan
            warnings.insert(0, f"{cause}; traced with make_fx on the example inputs instead: "
                            "Python control flow is specialized to them (the graph holds only "
                            "the branch they took) and shapes are static"
                            + (" (dynamic_shapes could not be kept)" if dynamic_shapes else ""))
            return graph_from_graph_module(gm, name=name, kinds=kinds, warnings=warnings)
    names = _dim_names(model, ep, dynamic_shapes)
    graph = graph_from_exported_program(ep, name=name, warnings=warnings, dim_names=names)
    graph.shape_range = export_range(ep, names) if dynamic_shapes else None
    return graph


def _export_cause(model: nn.Module, err: BaseException, dynamic_shapes: Any) -> str:
    """Torch's reason, first: the warning the fallback leads with, and optimize's error.

    A spec torch.export rejects gets torch's own lines (they say what in its structure is
    wrong), and for ``forward(*args)`` the shape it wants: one entry per parameter, so the
    ``*args`` entry is itself a tuple.
    """
    if not (dynamic_shapes and "dynamic_shapes" in str(err)):
        return f"torch.export failed ({first_line(err)})"
    cause = f"torch.export rejected dynamic_shapes: {_first_lines(err, 1)}"
    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return cause
    star = next((p.name for p in params if p.kind is p.VAR_POSITIONAL), None)
    if star is not None and isinstance(dynamic_shapes, (tuple, list)):
        cause += (f" (forward takes *{star}: torch.export reads dynamic_shapes by forward's "
                  f"parameters, so give *{star}'s specs as one tuple, e.g. "
                  f"dynamic_shapes=(({{0: batch, 1: seq}},),))")
    return cause


def _export_again(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                  dynamic_shapes: Any, found: list[type], warnings: list[str]) -> Any:
    """Export once more when the outputs held dataclasses export could not flatten."""
    registered = register_dataclasses(found)
    if not registered:
        return None
    try:
        ep = _export(model, args, kwargs, dynamic_shapes)
    except Exception:  # noqa: BLE001 - another reason: make_fx's graph stands
        logger.debug("torch.export failed again after registering outputs", exc_info=True)
        return None
    warnings.append(f"the model returns {', '.join(registered)}, a dataclass torch.export "
                    "did not know: registered with torch.export.register_dataclass so the "
                    "graph keeps its fields")
    return ep


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
             ) -> tuple[fx.GraphModule, dict[str, TensorKind], list[type]]:
    """Trace with make_fx over functional_call; returns the module, the placeholder kinds and
    the dataclass types the outputs held (returned as dicts of their fields)."""
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
        out = torch.func.functional_call(model, dict(zip(names, state, strict=True)), tuple(a),
                                         kw)
        return as_plain(out, found)

    found: list[type] = []

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
    return gm, kinds, found


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


def export_range(ep: Any, dim_names: dict[str, str]) -> ShapeRange | None:
    """The dynamic dimensions of an exported program's inputs: each one's range from
    ``ep.range_constraints`` and its opt size from the example input (the symbol's hint)."""
    user = set(ep.graph_signature.user_inputs)
    dims: dict[str, DimRange] = {}
    inputs: dict[str, tuple[int | str, ...]] = {}
    for node in ep.graph.nodes:
        val = node.meta.get("val") if node.op == "placeholder" and node.name in user else None
        if not isinstance(val, torch.Tensor):
            continue
        shape: list[int | str] = []
        for d in val.shape:
            expr = getattr(getattr(d, "node", None), "expr", None)
            if expr is None or not getattr(expr, "is_Symbol", False):  # a size, or 4*s77
                shape.append(int(d) if expr is None else re.sub(
                    r"\b[a-z]\d+\b", lambda m: dim_names.get(m[0], m[0]), str(expr)))
                continue
            name = dim_names.get(str(expr), str(expr))
            shape.append(name)
            if name not in dims:
                vr = ep.range_constraints.get(expr)
                top = None if vr is None or str(vr.upper) in ("int_oo", "oo") else int(vr.upper)
                dims[name] = DimRange(name, 0 if vr is None else int(vr.lower),
                                      int(d.node.hint), top, "dynamic_shapes", str(expr))
        inputs[node.name] = tuple(shape)
    return ShapeRange(tuple(dims.values()), inputs) if dims else None


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
    """Like :func:`graphopt.errors.first_line`, but ``n`` lines: when both tracers fail this is
    all the user sees (the traceback is suppressed), and torch often gives the hint and the
    ``Caused by:`` location on the lines after the first (export's data-dependent guard does)."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()][:n]
    return f"{type(err).__name__}: " + " / ".join(ln[:300] for ln in lines)
