"""Exporting a shape range to ONNX: the dynamic dims stay symbolic (``dim_param``).

The TorchScript exporter takes ``dynamic_axes`` per input and output name, the dynamo exporter
torch.export's ``dynamic_shapes``; both are made here from the module's
:class:`~graphopt.ir.shape_range.ShapeRange`. Which output axes vary is measured, not guessed: the
model runs at the range's min and max too, and an output axis whose size changes is dynamic. The
same runs give the inputs and outputs the export is checked at, besides the example.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils import _pytree as pytree

from graphopt.frontends.range_inputs import range_points
from graphopt.ir.shape_range import ShapeRange, dim_expression

__all__ = ["ExportRange", "export_range"]


@dataclass
class ExportRange:
    """What both exporters need to keep a range, and where to check the export."""

    shape_range: ShapeRange
    #: ONNX input/output name -> {axis: dim name}, for ``torch.onnx.export(dynamic_axes=...)``
    dynamic_axes: dict[str, dict[int, str]]
    #: torch.export's ``dynamic_shapes``, keyed by forward's parameters, for ``dynamo=True``
    dynamic_shapes: Any
    #: (feeds, expected outputs) at the range's min and max
    checks: list[tuple[dict[str, np.ndarray], list[np.ndarray]]] = field(default_factory=list)

    @property
    def dim_sizes(self) -> dict[str, tuple[int, int, int | None]]:
        """Dim name -> (min, opt, max): ``optimize_onnx(dynamic_shapes=...)`` of the export."""
        return {d.name: (d.min, d.opt, d.max) for d in self.shape_range.dims}


def export_range(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                 names: list[str], out_names: list[str], expected: list[np.ndarray],
                 rng: ShapeRange) -> ExportRange:
    """The export arguments for ``rng``; ``names`` are the ONNX names of the tensor leaves of
    ``(args, kwargs)`` in order, ``expected`` the model's outputs on the example."""
    leaves, spec = pytree.tree_flatten((args, kwargs))
    where = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
    tensors = tuple(leaves[i] for i in where)
    shapes = list(rng.inputs.values())  # in graph-input order: the tensor leaves' order
    axes: dict[str, dict[int, str]] = {}
    for name, shape in zip(names, shapes, strict=False):
        dyn = {i: str(d) for i, d in enumerate(shape) if not isinstance(d, int)}
        if dyn:
            axes[name] = dyn
    checks = []
    varying: dict[int, dict[int, list[tuple[dict[str, int], int]]]] = {}
    for _, values, moved in range_points(tensors, list(rng.inputs), rng):
        filled = list(leaves)
        for i, t in zip(where, moved, strict=True):
            filled[i] = t
        a, kw = pytree.tree_unflatten(filled, spec)
        with torch.no_grad():
            out = [t.detach().cpu().numpy() for t in pytree.tree_leaves(model(*a, **kw))
                   if isinstance(t, torch.Tensor)]
        checks.append(({n: t.detach().cpu().numpy() for n, t in zip(names, moved, strict=False)},
                       out))
        for k, (o, e) in enumerate(zip(out, expected, strict=False)):
            for axis, (got, want) in enumerate(zip(o.shape, e.shape, strict=False)):
                if got != want:
                    varying.setdefault(k, {}).setdefault(axis, []).append((values, got))
    for k, out_axes in varying.items():
        if k < len(out_names):
            axes[out_names[k]] = {axis: _axis_name(rng, expected[k].shape[axis], sizes, k, axis)
                                  for axis, sizes in out_axes.items()}
    return ExportRange(rng, axes, _dynamic_shapes(model, args, kwargs, shapes, rng), checks)


def _axis_name(rng: ShapeRange, opt: int, sizes: list[tuple[dict[str, int], int]], k: int,
               axis: int) -> str:
    """The range dim an output axis follows (its size at opt and at each checked point),
    else a name of its own."""
    for d in rng.dims:
        if d.opt == opt and all(values[d.name] == got for values, got in sizes):
            return d.name
    return f"output_{k}_dim{axis}"


def _dynamic_shapes(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                    shapes: list[tuple[int | str, ...]], rng: ShapeRange) -> Any:
    """torch.export's ``dynamic_shapes`` for (args, kwargs): one ``Dim`` per range dim,
    shared by every axis it sizes, keyed by ``forward``'s parameter names.

    Why keyed by name: torch.export binds ``(args, kwargs)`` to ``forward``'s signature and
    matches the spec against that binding, so an ``(args, kwargs)`` pair is read as two inputs
    ("`inputs` has 1 elements, but `dynamic_shapes` has 2"). Binding the specs the same way gives
    the structure torch expects (a ``*args`` parameter a tuple, ``**kwargs`` a dict)."""
    from torch.export import Dim

    dims = {d.name: Dim(d.name, min=d.min, max=d.max) if d.max is not None
            else Dim(d.name, min=d.min) for d in rng.dims}
    it = iter(shapes)  # the tensor leaves' shapes, in pytree order

    def leaf(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            shape = next(it, ())
            spec = {i: dim_expression(str(d), dims) for i, d in enumerate(shape)
                    if not isinstance(d, int)}
            return {i: d for i, d in spec.items() if d is not None} or None
        return None

    arg_specs = tuple(pytree.tree_map(leaf, a) for a in args)
    kw_specs = {k: pytree.tree_map(leaf, v) for k, v in kwargs.items()}
    try:
        return dict(inspect.signature(model.forward).bind(*arg_specs, **kw_specs).arguments)
    except (TypeError, ValueError):  # forward's signature is unreadable: torch's flat order
        return (*arg_specs, *kw_specs.values()) if kw_specs else arg_specs

