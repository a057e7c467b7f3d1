"""torch -> ONNX, fast first: the TorchScript exporter, then the dynamo exporter if it fails.

Why this order: measured on ``tests/zoo.py`` ``ResidualMLP(1000)`` (6,003 torch nodes, batch 16;
``benchmarks/bench_onnx_export.py``), ``torch.onnx.export(dynamo=True)`` takes minutes (255 s
on the development VM) while the TorchScript ("legacy", ``dynamo=False``) exporter takes ~15 s.
The legacy exporter lacks symbolics for ops that real models call: transformers' decoder LLMs
call ``aten::diff``, Mixtral's experts ``aten::histc`` and ``aten::_grouped_mm``; graphopt lends
it those for the export (``graphopt.frontends.export_symbolics``, which also gives the dynamo
exporter transformers' grouped-GEMM op). It still cannot export everything (BERT's ``forward``
rejects its argument passing). So graphopt tries the legacy exporter, runs its result once in
ONNX Runtime against the torch outputs, and only when the export raises, or its model does not
run or does not match (max |torch - ort| > 1e-5 of the output's scale; torch's own inf and NaN
must come back where they were), exports again with ``dynamo=True`` (model-local functions
inlined). Either way the result is one ``ModelProto`` with every weight in memory, written at
exactly the requested opset (:func:`supported_opsets`; anything else is a ``GraphoptError``);
graphopt then applies its decisions at the ONNX level (``backends.onnx.pipeline``) instead of
exporting a rewritten module.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
import re
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.inliner
import torch
from torch.utils import _pytree as pytree

from graphopt.errors import GraphoptError, first_line
from graphopt.files.quiet import library_quiet, silenced_fds, verbose
from graphopt.frontends.export_symbolics import dynamo_translations, lent_symbolics
from graphopt.frontends.onnx_export_check import mismatch_all, stateless_run
from graphopt.frontends.onnx_export_range import ExportRange, export_range
from graphopt.frontends.onnx_opsets import (
    LEGACY_OPSET,
    at_opset,
    check_opset,
    exporter_opsets,
    supported_opsets,
)
from graphopt.frontends.onnx_safety import default_opset
from graphopt.frontends.torch_inputs import without_cache
from graphopt.frontends.user_state import private_copy
from graphopt.ir.shape_range import ShapeRange

__all__ = ["ExportResult", "export_torch", "supported_opsets", "torch_feeds"]

logger = logging.getLogger(__name__)



@dataclass
class ExportResult:
    """An exported model, which exporter made it, and the inputs/outputs it was checked on."""

    model: onnx.ModelProto
    exporter: str  # "legacy" | "dynamo"
    seconds: float
    #: graph input name -> example input (numpy), for running the model
    feeds: dict[str, np.ndarray]
    #: the torch model's outputs on ``feeds``, flattened
    outputs: list[np.ndarray]
    #: why the legacy exporter was not used (None when it was)
    fallback_reason: str | None = None
    #: the model's ai.onnx opset
    opset: int | None = None
    notes: dict[str, Any] = field(default_factory=dict)
    #: symbolic dim name -> (min, opt, max) when exported over a shape range, else None
    dim_sizes: dict[str, tuple[int, int, int | None]] | None = None


def _missing_op(e: BaseException) -> str | None:
    """The op the dynamo exporter found no ONNX function for, if that is why it failed."""
    m = re.search(r"No ONNX function found for <OpOverload\(op='([^']+)'", str(e))
    return m.group(1) if m else None


def _split(example_inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,), {}
    if isinstance(example_inputs, dict):
        return (), dict(example_inputs)
    if isinstance(example_inputs, (list, tuple)):
        return tuple(example_inputs), {}
    raise GraphoptError(f"example inputs of type {type(example_inputs).__name__} cannot be "
                        "exported", "pass a tensor, a tuple of tensors or a dict of keyword "
                        "tensors shaped like a real batch")


def _input_names(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
                 ) -> list[str]:
    """Names of the tensor inputs in the exporters' order: forward()'s parameter names where
    each argument is one tensor, else ``input_<i>``."""
    try:
        params = [p.name for p in inspect.signature(model.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    names: list[str] = []
    given = [(params[i] if i < len(params) else f"input_{i}", a) for i, a in enumerate(args)]
    for base, a in [*given, *kwargs.items()]:
        leaves = [x for x in pytree.tree_leaves(a) if isinstance(x, torch.Tensor)]
        names.extend([base] if len(leaves) == 1 else [f"{base}_{j}" for j in range(len(leaves))])
    return names


def torch_feeds(names: list[str], args: tuple[Any, ...], kwargs: dict[str, Any]
                ) -> dict[str, np.ndarray]:
    leaves = [x for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
    return {n: t.detach().cpu().numpy() for n, t in zip(names, leaves, strict=False)}


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The exporters warn (deprecations) and print progress (``[torch.onnx] ...``), and the
    TorchScript exporter's C++ side writes the whole graph to file descriptor 1 when it fails;
    graphopt logs instead. fd 1 is the report's: silenced. fd 2 goes through
    :func:`library_quiet`'s filter, so graphopt's progress line shows. Verbose
    (``files.quiet.verbose``): all of it shown, on stderr."""
    if verbose():
        with contextlib.redirect_stdout(sys.stderr), silenced_fds(1, to=2):
            yield
        return
    with (library_quiet(), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()),
          contextlib.redirect_stderr(io.StringIO()), silenced_fds(1)):
        warnings.simplefilter("ignore")
        yield


class _ExactCall(torch.nn.Module):
    """Calls ``model`` with exactly the example's arguments.

    Why: the TorchScript exporter fills every forward() parameter after the given ones with its
    default, positionally. transformers' forwards also receive some of those by keyword from
    their decorators (``use_cache``: "got multiple values"), and a defaulted int becomes a graph
    input (GPT-2's ``logits_to_keep``). Behind ``forward(*tensors)`` nothing is filled in;
    keyword arguments holding tensors follow the positional ones, the others are bound here.
    """

    def __init__(self, model: torch.nn.Module, tensor_kwargs: list[str],
                 fixed_kwargs: dict[str, Any]) -> None:
        super().__init__()
        self.model = model
        self.tensor_kwargs, self.fixed_kwargs = tensor_kwargs, fixed_kwargs
        # the exporter restores the wrapper's mode on exit, recursively: it must be the model's
        self.train(model.training)

    def forward(self, *tensors: Any) -> Any:
        n = len(tensors) - len(self.tensor_kwargs)
        return self.model(*tensors[:n], **dict(zip(self.tensor_kwargs, tensors[n:], strict=True)),
                          **self.fixed_kwargs)


def _unwrap_names(proto: onnx.ModelProto, attr: str = "model") -> onnx.ModelProto:
    """Drop :class:`_ExactCall`'s scope from every name (``/model/up/Gemm`` -> ``/up/Gemm``,
    ``model.up.weight`` -> ``up.weight``), so names read as the user's model's own. Left as
    they are if that would make two names equal."""
    g = proto.graph
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
           for node in g.node for a in node.attribute):
        return proto  # subgraphs see outer names: leave every name as it is

    def strip(name: str) -> str:
        for prefix, keep in ((f"/{attr}/", "/"), (f"{attr}.", "")):
            if name.startswith(prefix):
                return keep + name[len(prefix):]
        return name

    values = {n for node in g.node for n in (*node.input, *node.output)}
    values |= {t.name for t in g.initializer} | {v.name for v in (*g.input, *g.output)}
    renamed = {n: strip(n) for n in values if n}
    nodes = [node.name for node in g.node]
    if (len(set(renamed.values())) < len(renamed)
            or len({strip(n) for n in nodes}) < len(set(nodes))):
        return proto
    for node in g.node:
        node.name = strip(node.name)
        node.input[:] = [renamed.get(n, n) for n in node.input]
        node.output[:] = [renamed.get(n, n) for n in node.output]
    for t in (*g.initializer, *g.input, *g.output, *g.value_info):
        t.name = renamed.get(t.name, strip(t.name))
    return proto


def _has_tensor(value: Any) -> bool:
    return any(isinstance(x, torch.Tensor) for x in pytree.tree_leaves(value))


def _legacy(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
            names: list[str], out_names: list[str], opset: int,
            dyn: ExportRange | None = None) -> onnx.ModelProto:
    tensor_kwargs = [k for k, v in kwargs.items() if _has_tensor(v)]
    call = _ExactCall(model, tensor_kwargs,
                      {k: v for k, v in kwargs.items() if k not in tensor_kwargs})
    call_args = (*args, *(kwargs[k] for k in tensor_kwargs))
    with tempfile.TemporaryDirectory() as tmp, _quiet():
        # in memory below protobuf's limit (the file's write and read were 0.4 s of the
        # Llama's 4 s); a larger model is written with its weights as external data
        path: Path | io.BytesIO = io.BytesIO() if _state_bytes(model) < _IN_MEMORY_EXPORT \
            else Path(tmp) / "model.onnx"
        with lent_symbolics(opset) as lent:
            logger.debug("symbolics lent to the TorchScript exporter: %s", lent)
            torch.onnx.export(call, call_args, path if isinstance(path, io.BytesIO) else
                              str(path), dynamo=False, opset_version=opset,
                              input_names=names, output_names=out_names,
                              do_constant_folding=True,
                              dynamic_axes=dyn.dynamic_axes if dyn else None)
        if isinstance(path, io.BytesIO):
            return _unwrap_names(onnx.load_model_from_string(path.getvalue()))
        return _unwrap_names(onnx.load(str(path)))  # loads the external data from tmp


#: a model whose parameters and buffers are below this is exported in memory (protobuf's
#: 2 GiB limit, with room for the graph and for constants the export folds)
_IN_MEMORY_EXPORT = 1 << 30


def _state_bytes(model: torch.nn.Module) -> int:
    """The bytes of ``model``'s parameters and buffers; unbounded where one has no size yet
    (a lazy module's placeholder): the file path then, which any size can take."""
    try:
        return sum(t.numel() * t.element_size()
                   for t in (*model.parameters(), *model.buffers()))
    except (RuntimeError, ValueError):
        return _IN_MEMORY_EXPORT


def _dynamo(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
            names: list[str], out_names: list[str], opset: int,
            dynamic_shapes: Any = None) -> onnx.ModelProto:
    with tempfile.TemporaryDirectory() as tmp, _quiet():
        program = torch.onnx.export(model, args, kwargs=kwargs or None, dynamo=True,
                                    dynamic_shapes=dynamic_shapes,
                                    custom_translation_table=dynamo_translations() or None,
                                    opset_version=opset, verbose=False,
                                    input_names=names, output_names=out_names, optimize=True)
        if program is None:  # pragma: no cover - dynamo=True always returns a program
            raise RuntimeError("torch.onnx.export(dynamo=True) returned nothing")
        path = Path(tmp) / "model.onnx"
        program.save(str(path))
        proto = onnx.load(str(path))
    if len(proto.functions):
        proto = onnx.inliner.inline_local_functions(proto)
    return proto


def _both_failed(name: str, why: str, e: BaseException, newest_legacy: int) -> GraphoptError:
    """The error when the TorchScript export was not used (``why``) and dynamo=True raised."""
    op = _missing_op(e)
    if op is not None:
        return GraphoptError(f"ONNX export of {name} failed: {why}; and "
                             f"torch.onnx.export(dynamo=True) has no ONNX function for {op}",
                             f"export at opset {newest_legacy} or older (the TorchScript "
                             "exporter, with graphopt's symbolics), or register a translation "
                             f"for {op} (custom_translation_table)")
    return GraphoptError(f"ONNX export of {name} failed: {why}; and "
                         f"torch.onnx.export(dynamo=True): {first_line(e)}",
                         "make forward() exportable with torch.export (see the error), "
                         "or export the model yourself and pass the .onnx file")


def _name(proto: onnx.ModelProto, model: torch.nn.Module) -> None:
    # the exporters call every graph "main_graph"; reports read better with the class name
    if proto.graph.name in ("", "main_graph"):
        proto.graph.name = type(model).__name__


def export_torch(model: torch.nn.Module, example_inputs: Any, *, opset: int | None = None,
                 verify: bool = True, shape_range: ShapeRange | None = None,
                 dynamic_shapes: Any = None) -> ExportResult:
    """Export ``model`` (eval mode, never modified) for ``example_inputs``' shapes, or over
    ``shape_range`` (its dims stay symbolic; the export is checked at min, opt and max).

    Over a range, the TorchScript exporter may bake a traced size into a Reshape; that export
    then fails the check at min or max in ONNX Runtime, and ``dynamo=True`` exports again with
    ``dynamic_shapes`` (the user's own torch.export spec, which torch.export accepted when
    the module was optimized; else one made from ``shape_range``). The check decides which
    export is kept; when both fail, the error gives both reasons.

    ``opset``: exactly this ai.onnx opset (:func:`supported_opsets`), converting the dynamo
    exporter's model down where it writes a newer one; None: each exporter's own
    (``onnx_opsets.LEGACY_OPSET``, or ``DYNAMO_OPSET`` when the TorchScript exporter fails).

    Raises:
        GraphoptError: the model is in training mode, ``opset`` is outside
            :func:`supported_opsets`, or neither exporter produced a model at ``opset`` that
            reproduces torch.
    """
    if not isinstance(model, torch.nn.Module):
        raise GraphoptError(f"export takes a torch.nn.Module, got {type(model).__name__}",
                            "pass the module, or give graphopt the .onnx file directly")
    if model.training:
        raise GraphoptError(f"{type(model).__name__} is in training mode",
                            "call model.eval() before exporting it")
    check_opset(opset)
    model = private_copy(model)  # tracing runs forward, and some forwards write to self
    args, kwargs = _split(example_inputs)
    model = without_cache(model, kwargs)[0]  # a causal LM as configured: no cache output
    out = stateless_run(model, args, kwargs)
    expected = [t.detach().cpu().numpy() for t in pytree.tree_leaves(out)
                if isinstance(t, torch.Tensor)]
    names = _input_names(model, args, kwargs)
    out_names = [f"output_{i}" for i in range(len(expected))]
    feeds = torch_feeds(names, args, kwargs)
    dyn = (export_range(model, args, kwargs, names, out_names, expected, shape_range)
           if shape_range else None)
    ranges = exporter_opsets()
    start = time.perf_counter()
    why: str | None
    if opset is not None and opset > ranges["TorchScript"][1]:
        why = f"opset {opset} is newer than the TorchScript exporter's {ranges['TorchScript'][1]}"
    else:
        try:
            proto = _legacy(model, args, kwargs, names, out_names, opset or LEGACY_OPSET, dyn)
            why = mismatch_all(proto, feeds, expected, dyn) if verify else None
        except Exception as e:  # any exporter failure means: try the other exporter
            why = f"the TorchScript exporter failed ({first_line(e)})"
    if why is None:
        _name(proto, model)
        seconds = time.perf_counter() - start
        logger.info("exported %s with the TorchScript exporter in %.2fs (%d nodes)",
                    type(model).__name__, seconds, len(proto.graph.node))
        return ExportResult(proto, "legacy", seconds, feeds, expected,
                            opset=default_opset(proto), dim_sizes=dyn and dyn.dim_sizes)
    name = type(model).__name__
    logger.info("TorchScript export of %s not used: %s; trying dynamo=True", name, why)
    try:
        spec = (dynamic_shapes if dynamic_shapes is not None else dyn.dynamic_shapes) \
            if dyn else None
        proto = _dynamo(model, args, kwargs, names, out_names,
                        max(opset or 0, ranges["dynamo"][0]), spec)
    except Exception as e:
        raise _both_failed(name, why, e, ranges["TorchScript"][1]) from None
    if opset is not None:
        proto = at_opset(proto, opset, f"ONNX export of {name} at opset {opset} failed: {why}")
    problem = mismatch_all(proto, feeds, expected, dyn) if verify else None
    if problem is not None:
        raise GraphoptError(f"ONNX export of {name} does not reproduce the model: {why}; "
                            f"and with dynamo=True: {problem}",
                            "export the model yourself and pass the .onnx file")
    _name(proto, model)
    seconds = time.perf_counter() - start
    logger.info("exported %s with torch.onnx.export(dynamo=True) in %.2fs (%d nodes)",
                name, seconds, len(proto.graph.node))
    return ExportResult(proto, "dynamo", seconds, feeds, expected, fallback_reason=why,
                        opset=default_opset(proto), dim_sizes=dyn and dyn.dim_sizes)
