"""The torch module :func:`graphopt.optimize` returns: the rewritten graph, called like the model.

Kept apart from ``graphopt.api.optimized`` so that optimizing an ``.onnx`` file never imports torch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import fx

from graphopt.backends.torch.quant_ops import has_quantized, move_quantized
from graphopt.errors import GraphoptError

__all__ = ["OptimizedModule"]


# runtime flag name -> (object, attribute) it sets; the precision pass asks for these
_FLAGS = {
    "allow_tf32": ((torch.backends.cuda.matmul, "allow_tf32"),
                   (torch.backends.cudnn, "allow_tf32")),
    "allow_fp16_reduced_precision_reduction": (
        (torch.backends.cuda.matmul, "allow_fp16_reduced_precision_reduction"),),
    "allow_bf16_reduced_precision_reduction": (
        (torch.backends.cuda.matmul, "allow_bf16_reduced_precision_reduction"),),
}


@contextlib.contextmanager
def _runtime_flags(flags: dict[str, Any]) -> Iterator[None]:
    """Set the torch backend flags a plan asks for while the module runs, then restore them.

    They only affect CUDA kernels, so on a machine without a GPU nothing is touched.
    """
    if not flags or not torch.cuda.is_available():
        yield
        return
    saved = []
    for key, value in flags.items():
        for obj, attr in _FLAGS.get(key, ()):
            saved.append((obj, attr, getattr(obj, attr)))
            setattr(obj, attr, bool(value))
    try:
        yield
    finally:
        for obj, attr, old in reversed(saved):
            setattr(obj, attr, old)


class OptimizedModule(torch.nn.Module):
    """The rewritten graph, called like the original model, for inference (no autograd).

    The graph was traced for the example inputs' shapes, or for a shape range
    (``shape_range``: each dynamic dim between its min and max); a call outside them gets a
    ``GraphoptError`` that names them, instead of an error from deep inside an op.
    """

    def __init__(self, graph_module: fx.GraphModule, input_shapes: list[tuple[int, ...] | None],
                 runtime: dict[str, Any] | None = None, *, shape_range: Any = None,
                 input_names: list[str] | None = None) -> None:
        super().__init__()
        self.graph_module = graph_module
        self._input_shapes = input_shapes
        #: a ``graphopt.ir.shape_range.ShapeRange`` and the graph input name of each tensor arg
        self.shape_range = shape_range
        self._input_names = list(input_names or [])
        self._bounds, self._shared = _call_checks(shape_range, input_shapes, self._input_names)
        #: a dim that is an expression of others (``4*t``, ``t+1``): checked by the range
        self._derived = bool(shape_range) and any(
            not isinstance(d, int) and shape_range.dim(d) is None
            for shape in shape_range.inputs.values() for d in shape)
        #: per input, the dtype it was optimized for (None: not a tensor); and each input's
        #: position by name, when there is one name per input (keyword calls)
        self._dtypes = _input_dtypes(graph_module, input_shapes)
        self._positions = ({n: i for i, n in enumerate(self._input_names)}
                           if len(self._input_names) == len(input_shapes) else {})
        self._runtime = dict(runtime or {})
        # the flags only touch CUDA kernels: decided once, not per call
        self._runtime_active = bool(self._runtime) and torch.cuda.is_available()
        self.eval()  # an inference module: BatchNorm folded, dropout gone

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs:
            args = self._by_position(args, kwargs)
        if [a.dtype if isinstance(a, torch.Tensor) else None for a in args] != self._dtypes:
            self._check_types(args)
        shapes = [tuple(a.shape) if isinstance(a, torch.Tensor) else None for a in args]
        if self.shape_range:
            self._check_range(shapes)
        elif shapes != self._input_shapes:
            raise GraphoptError(f"the optimized module was built for inputs of shapes "
                                f"{self._input_shapes}, got {shapes}",
                                "call graphopt.optimize again with example inputs of the "
                                "shapes you will run, or give dynamic_shapes= for a range")
        if not self._runtime_active and not torch.is_grad_enabled():
            return self.graph_module(*args)  # the common inference call: no context overhead
        with torch.no_grad(), _runtime_flags(self._runtime):
            return self.graph_module(*args)

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        """``.to(device)``, ``.cuda()``, ``.half()``: low-bit weights keep their dtypes and an
        INT4 weight is re-packed in its new device's layout (``quant_ops.move_quantized``)."""
        gm = self._modules.get("graph_module")
        if not isinstance(gm, fx.GraphModule) or not has_quantized(gm):
            return super()._apply(fn, recurse)
        apply = super()._apply
        return move_quantized(gm, lambda: apply(fn, recurse))

    def _name(self, i: int) -> str:
        return repr(self._input_names[i]) if self._positions else str(i)

    def _by_position(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        """A keyword call (the model's own input names) as the positional one the graph takes.
        A position with no name (a ``None`` the example passed between named inputs) stays
        ``None``, as traced."""
        names = self._input_names
        if not self._positions:
            raise GraphoptError(f"the optimized module takes its {len(self._input_shapes)} "
                                f"inputs by position, got keywords {sorted(kwargs)}",
                                "pass the inputs by position")
        out: list[Any] = [*args, *[_MISSING] * (len(names) - len(args))]
        for key, value in kwargs.items():
            i = self._positions.get(key) if key is not None else None
            if i is None:
                raise GraphoptError(f"the optimized module has no input named {key!r}; its "
                                    f"inputs are {[n for n in names if n]}", "pass the inputs "
                                    "by these names or by position")
            if i < len(args):
                raise GraphoptError(f"input {key!r} given twice (by position and by name)",
                                    "pass each input once")
            out[i] = value
        missing = [names[i] for i, a in enumerate(out) if a is _MISSING and names[i]]
        if missing:
            raise GraphoptError(f"the optimized module's inputs {missing} are missing",
                                f"pass all of {[n for n in names if n]}, by position or by "
                                "name")
        return tuple(None if a is _MISSING else a for a in out)

    def _check_types(self, args: tuple[Any, ...]) -> None:
        """Why the inputs' types are not the ones optimized for (the call was not common)."""
        if len(args) != len(self._dtypes):
            raise GraphoptError(f"the optimized module takes {len(self._dtypes)} inputs, got "
                                f"{len(args)}", "pass the model's inputs")
        for i, (a, want) in enumerate(zip(args, self._dtypes, strict=True)):
            name = self._name(i)
            if want is None and isinstance(a, torch.Tensor):
                raise GraphoptError(f"input {name} is a tensor; the module was optimized for "
                                    "a non-tensor value there", "pass the value the example "
                                    "inputs had")
            if want is not None and not isinstance(a, torch.Tensor):
                kind = f"{type(a).__module__}.{type(a).__qualname__}"
                raise GraphoptError(f"input {name} is a {kind}, not a torch.Tensor",
                                    "convert it first (torch.from_numpy(a) for a numpy array, "
                                    "torch.as_tensor(a) otherwise)")
            if want is not None and a.dtype != want:
                raise GraphoptError(
                    f"input {name} is {str(a.dtype).removeprefix('torch.')}; the module was "
                    f"optimized for {str(want).removeprefix('torch.')}",
                    f"cast it with .to({want}) (e.g. x.float() for float32)")

    def _check_range(self, shapes: list[tuple[int, ...] | None]) -> None:
        fits = len(shapes) == len(self._input_shapes) and all(
            s is not None and len(s) == rank and all(lo <= s[a] <= hi for a, lo, hi in dims)
            for s, rank, dims in zip(shapes, *self._bounds, strict=False)) and all(
            len({shapes[i][a] for i, a in group}) == 1 for group in self._shared)  # type: ignore[index]
        if fits and not self._derived:
            return  # the common call: every dim within its bounds (~1 us); else say what is off
        if len(shapes) != len(self._input_shapes):
            raise GraphoptError(f"the optimized module takes {len(self._input_shapes)} "
                                f"inputs, got {len(shapes)}", "pass the model's inputs")
        tensors = [s for s in shapes if s is not None]
        wrong = self.shape_range.check(dict(zip(self._input_names, tensors, strict=False)))
        if fits and wrong is None:  # a derived dim (4*t) agrees with the dims it is made of
            return
        if wrong is None:  # the bounds refused what the range's own check cannot place
            wrong = f"input shapes {shapes} are not the {self._input_shapes} (in rank and " \
                    "static dims) the module was optimized for"
        raise GraphoptError(f"{wrong}: the module was optimized for "
                            f"{self.shape_range.describe()}",
                            "call it within that range, or optimize again with a wider "
                            "dynamic_shapes range")


_MISSING = object()


def _input_dtypes(gm: fx.GraphModule, shapes: list[tuple[int, ...] | None]
                  ) -> list[torch.dtype | None]:
    """Each input's dtype from its placeholder's example value (export's and the reader's
    ``meta["val"]``); where that is not known, whatever a tensor brings passes."""
    vals = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    if len(vals) != len(shapes):
        vals = [None] * len(shapes)
    return [None if s is None else v.dtype if isinstance(v, torch.Tensor) else _ANY
            for s, v in zip(shapes, vals, strict=True)]


class _AnyDtype:
    """Equal to every dtype: an input whose dtype was not recorded is not checked."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, torch.dtype)

    def __ne__(self, other: object) -> bool:
        return not isinstance(other, torch.dtype)

    __hash__ = None  # type: ignore[assignment]


_ANY: Any = _AnyDtype()


def _call_checks(shape_range: Any, shapes: list[tuple[int, ...] | None], names: list[str]
                 ) -> tuple[tuple[list[int], list[list[tuple[int, int, float]]]],
                            list[list[tuple[int, int]]]]:
    """What a call is checked against, worked out once: per tensor input its rank and
    (axis, min, max) of every static or ranged dim; and the (input, axis) groups one range dim
    sizes, which must agree (a batch shared by ``input_ids`` and ``attention_mask``)."""
    ranks: list[int] = []
    bounds: list[list[tuple[int, int, float]]] = []
    where: dict[str, list[tuple[int, int]]] = {}
    if not shape_range:
        return (ranks, bounds), []
    named = iter(names)
    for i, shape in enumerate(shapes):
        if shape is None:
            ranks.append(-1)
            bounds.append([])
            continue
        want = shape_range.inputs.get(next(named, ""), shape)
        dims: list[tuple[int, int, float]] = []
        for axis, d in enumerate(want):
            if isinstance(d, int):
                dims.append((axis, d, d))
                continue
            where.setdefault(str(d), []).append((i, axis))
            if (r := shape_range.dim(d)) is not None:
                dims.append((axis, r.min, float("inf") if r.max is None else r.max))
        ranks.append(len(want))
        bounds.append(dims)
    return (ranks, bounds), [group for group in where.values() if len(group) > 1]
