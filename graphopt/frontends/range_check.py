"""A torch ``dynamic_shapes`` checked against the model before torch.export sees it.

torch.export refuses a spec that names an input ``forward`` does not take, or an axis past an
input's rank, and the frontend would then fall back to a static make_fx trace with only a warning
to show for it. This check makes such a spec an error that lists ``forward``'s inputs and ranks.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from graphopt.errors import GraphoptError

__all__ = ["check_against"]


def check_against(dynamic_shapes: Any, model: Any, args: tuple[Any, ...],
                  kwargs: Mapping[str, Any] | None = None) -> None:
    """Raise GraphoptError where a torch ``dynamic_shapes`` does not fit ``model.forward`` and
    the example inputs (``args`` and ``kwargs`` as the frontend split them): an input forward
    does not take, a tuple of the wrong length, an axis past the input's rank, a range the
    example's size is outside of. Anything it cannot read is left to torch.export."""
    if not dynamic_shapes:
        return
    try:
        sig = inspect.signature(model.forward)
    except (AttributeError, TypeError, ValueError):
        return
    try:
        given = dict(sig.bind(*args, **(kwargs or {})).arguments)
    except TypeError:
        return  # the frontend says what is wrong with the inputs themselves
    kinds = {p.kind for p in sig.parameters.values()}
    for p in sig.parameters.values():  # **kwargs: torch names each keyword input itself
        if p.kind is p.VAR_KEYWORD:
            given.update(given.pop(p.name, {}))
    cls = type(model).__name__
    have = ", ".join(f"{n} ({_rank(v)})" for n, v in given.items()) or "none"
    fix = f"name {cls}.forward's own inputs and axes: {have}"
    if isinstance(dynamic_shapes, Mapping):
        for key, spec in dynamic_shapes.items():
            if not isinstance(key, str) or key not in given:
                why = ("the example inputs do not give" if key in sig.parameters else
                       f"{cls}.forward does not take")
                raise GraphoptError(f"dynamic_shapes names input {key!r}, which {why} (its "
                                    f"inputs: {have})", fix)
            _check_value(key, spec, given[key], fix)
    elif isinstance(dynamic_shapes, (tuple, list)):
        if inspect.Parameter.VAR_POSITIONAL in kinds:
            return  # how torch counts *args entries is its own business
        if len(dynamic_shapes) != len(given):
            raise GraphoptError(f"dynamic_shapes is a {type(dynamic_shapes).__name__} of "
                                f"{len(dynamic_shapes)} entries, but {cls}.forward is given "
                                f"{len(given)} inputs ({have})",
                                "give one entry per input, in order (None for a static one), "
                                "or a dict keyed by input name")
        for (name, value), spec in zip(given.items(), dynamic_shapes, strict=True):
            _check_value(name, spec, value, fix)
    else:
        raise GraphoptError(f"dynamic_shapes for a torch module is a dict or tuple, got "
                            f"{type(dynamic_shapes).__name__}",
                            "pass e.g. {'x': {0: torch.export.Dim('batch', max=64)}}")


def _rank(value: Any) -> str:
    shape = getattr(value, "shape", None)
    if shape is None:
        return type(value).__name__
    return f"{len(shape)} dims: {'x'.join(str(int(d)) for d in shape) or 'scalar'}"


def _check_value(name: str, spec: Any, value: Any, fix: str) -> None:
    """One input's spec against its example value (nested tuples/dicts of tensors too)."""
    if spec is None:
        return
    shape = getattr(value, "shape", None)
    if shape is None:  # a container of tensors: the same container of specs
        if isinstance(value, (tuple, list)) and isinstance(spec, (tuple, list)) \
                and len(spec) == len(value):
            for i, (s, v) in enumerate(zip(spec, value, strict=True)):
                _check_value(f"{name}[{i}]", s, v, fix)
        elif isinstance(value, Mapping) and isinstance(spec, Mapping):
            for k, s in spec.items():
                if k in value:
                    _check_value(f"{name}[{k!r}]", s, value[k], fix)
        return
    ndim = len(shape)
    if isinstance(spec, Mapping):
        axes = list(spec.items())
    elif isinstance(spec, (tuple, list)):
        if len(spec) != ndim:
            raise GraphoptError(f"dynamic_shapes gives input {name!r} {len(spec)} axes, but its "
                                f"example has {ndim} ({_rank(value)})", fix)
        axes = list(enumerate(spec))
    else:
        return  # Dim.AUTO for the whole input and the like: torch.export decides
    for axis, dim in axes:
        if isinstance(axis, bool) or not isinstance(axis, int) or not 0 <= axis < ndim:
            raise GraphoptError(f"dynamic_shapes gives input {name!r} axis {axis!r}, but its "
                                f"example has {ndim} dims (axes 0 to {ndim - 1})", fix)
        _check_size(name, axis, dim, int(shape[axis]))


def _check_size(name: str, axis: int, dim: Any, size: int) -> None:
    """The example's size must lie in a Dim's range: it is the range's opt point."""
    lo, hi = getattr(dim, "min", None), getattr(dim, "max", None)
    label = getattr(dim, "__name__", "the dim")
    if not isinstance(lo, int) or isinstance(dim, (int, bool)):
        return
    if size < lo or (isinstance(hi, int) and size > hi):
        bounds = f"[{lo}, {hi if isinstance(hi, int) else 'inf'}]"
        raise GraphoptError(f"the example's {name}.{axis} is {size}, outside {label}'s range "
                            f"{bounds}; the example's size is the range's opt point",
                            f"give {label} a range that holds {size}, or an example inside "
                            f"{bounds}")
