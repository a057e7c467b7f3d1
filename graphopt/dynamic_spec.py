"""The CLI's ``--dynamic`` option: shape ranges written on the command line.

Two forms, one per kind of model:

* ONNX: ``--dynamic NAME=OPT`` or ``--dynamic NAME=MIN:OPT:MAX`` for a symbolic dim
  (``dim_param``) of the model; ``MAX`` may be ``inf``. ``MIN = OPT = MAX`` fixes the symbolic
  dim at that one size (ONNX has no other way to say so); every size is at least 1.
* ``file.py:function``: ``--dynamic INPUT.AXIS=NAME:MIN:MAX`` makes axis AXIS of forward's
  argument INPUT a ``torch.export.Dim(NAME, min=MIN, max=MAX)``; the same NAME on several axes
  is one dim (a batch shared by ``input_ids`` and ``attention_mask``). The example input's size
  is the opt point. ``MIN < MAX``: ``torch.export.Dim`` refuses ``MIN = MAX``, and a dim of one
  size is static (leave the axis out: it stays at the example's size). The builder function
  can also return ``(module, inputs, dynamic_shapes)``.

Several ranges: repeat the option or separate them with commas. Every size is at most
``MAX_DIM_VALUE`` (2**62: a tensor dim is an int64).

:func:`check_against` checks a torch ``dynamic_shapes`` against the model and its example
inputs before torch.export runs: an input forward does not take, an axis past the input's
rank, or a range the example's size is outside of would otherwise make torch.export fail, and
graphopt fall back to a static trace with only a warning to say so.
"""

from __future__ import annotations

import inspect
import keyword
import re
from collections.abc import Mapping, Sequence
from typing import Any

from graphopt.errors import GraphoptError
from graphopt.shape_range import MAX_DIM_VALUE

__all__ = ["check_against", "parse_dynamic"]

_TORCH = re.compile(r"^(\w+)\.(\d+)=(\w+):(\d+):(\d+|inf)$")
_ONNX = re.compile(r"^([^=\s]+)=(\d+)(?::(\d+):(\d+|inf))?$")
_FIX = ("write --dynamic NAME=OPT or NAME=MIN:OPT:MAX for an ONNX model's symbolic dim, or "
        "--dynamic INPUT.AXIS=NAME:MIN:MAX for forward's argument INPUT (e.g. x.0=batch:1:64)")
#: most characters of one --dynamic item shown in a message
_SHOW = 80


def parse_dynamic(specs: Sequence[str] | None, torch_model: bool) -> Any:
    """The ``dynamic_shapes`` argument for ``graphopt.plan``/``optimize`` from ``--dynamic``
    values, or None when none were given."""
    items = [s.strip() for spec in specs or () for s in spec.split(",") if s.strip()]
    if not items:
        return None
    return _torch(items) if torch_model else _onnx(items)


def _show(item: str) -> str:
    return repr(item if len(item) <= _SHOW else item[:_SHOW] + "...")


def _number(text: str, item: str) -> int:
    """A size of ``item``, refused above ``MAX_DIM_VALUE`` (before ``int`` reads 5000 digits)."""
    digits = text.lstrip("0") or "0"  # int() refuses 5000 digits, leading zeros included
    if len(digits) > len(str(MAX_DIM_VALUE)) or int(digits) > MAX_DIM_VALUE:
        raise GraphoptError(f"--dynamic {_show(item)}: {text[:30]}{'...' if len(text) > 30 else ''}"
                            f" is larger than any tensor dim (at most 2**62)",
                            "give the sizes the model will really run at")
    return int(digits)


def _onnx(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        m = _ONNX.match(item)
        if m is None:
            raise GraphoptError(f"--dynamic {_show(item)} is not NAME=OPT or NAME=MIN:OPT:MAX",
                                _FIX)
        name, first, opt, top = m.groups()
        if name in out:
            raise GraphoptError(f"--dynamic gives the symbolic dim {name!r} twice",
                                f"give {name} once: {name}=OPT or {name}=MIN:OPT:MAX")
        if opt is None:
            out[name] = _number(first, item)
        else:
            out[name] = (_number(first, item), _number(opt, item),
                         None if top == "inf" else _number(top, item))
    return out


def _torch(items: list[str]) -> dict[str, dict[int, Any]]:
    from torch.export import Dim

    dims: dict[str, Any] = {}
    ranges: dict[str, tuple[int, int | None]] = {}
    out: dict[str, dict[int, Any]] = {}
    for item in items:
        m = _TORCH.match(item)
        if m is None:
            raise GraphoptError(f"--dynamic {_show(item)} is not INPUT.AXIS=NAME:MIN:MAX (a "
                                "torch model's range)", _FIX)
        arg, axis_text, name, lo_text, top = m.groups()
        axis = _number(axis_text, item)
        key = (_number(lo_text, item), None if top == "inf" else _number(top, item))
        _check_torch_range(item, arg, axis, name, key)
        if name not in dims:
            dims[name] = Dim(name, min=key[0]) if key[1] is None else \
                Dim(name, min=key[0], max=key[1])
            ranges[name] = key
        elif ranges[name] != key:
            raise GraphoptError(f"--dynamic gives dim {name} two ranges",
                                f"give {name} one MIN:MAX on every axis it sizes")
        if axis in out.setdefault(arg, {}):
            raise GraphoptError(f"--dynamic gives {arg}.{axis} twice",
                                f"give one NAME:MIN:MAX for axis {axis} of {arg}")
        out[arg][axis] = dims[name]
    return out


def _check_torch_range(item: str, arg: str, axis: int, name: str,
                       key: tuple[int, int | None]) -> None:
    """What ``torch.export.Dim`` would refuse with an AssertionError, said as a user error."""
    if not name.isidentifier() or keyword.iskeyword(name):
        raise GraphoptError(f"--dynamic {_show(item)}: the dim name {name!r} is not a Python "
                            "identifier (torch.export.Dim needs one)",
                            f"name the dim with letters first, e.g. {arg}.{axis}=batch:1:64")
    lo, hi = key
    if hi is not None and hi <= lo:
        what = (f"one size (min {lo} = max {hi}): a dim of one size is static, and "
                "torch.export.Dim needs max > min" if hi == lo else
                f"min {lo} above max {hi}")
        raise GraphoptError(f"--dynamic {_show(item)} gives dim {name} {what}",
                            f"give MIN < MAX (e.g. {arg}.{axis}={name}:1:64), or leave {arg}.{axis}"
                            " out of --dynamic to keep it at the example's size")


# --- checking a torch dynamic_shapes against the model ------------------------------------------
def check_against(dynamic_shapes: Any, model: Any, example_inputs: Any) -> None:
    """Raise GraphoptError where a torch ``dynamic_shapes`` does not fit ``model.forward`` and
    ``example_inputs`` (a tensor, a tuple of args, or a kwargs dict): an input forward does not
    take, a tuple of the wrong length, an axis past the input's rank, a range the example's
    size is outside of. Anything it cannot read is left to torch.export."""
    if not dynamic_shapes:
        return
    try:
        sig = inspect.signature(model.forward)
    except (AttributeError, TypeError, ValueError):
        return
    if isinstance(example_inputs, Mapping):
        args, kwargs = (), dict(example_inputs)
    elif isinstance(example_inputs, (tuple, list)):
        args, kwargs = tuple(example_inputs), {}
    else:
        args, kwargs = (example_inputs,), {}
    try:
        given = dict(sig.bind(*args, **kwargs).arguments)
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
