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

import keyword
import re
from collections.abc import Sequence
from typing import Any

from graphopt.errors import GraphoptError
from graphopt.ir.shape_range import MAX_DIM_VALUE

__all__ = ["parse_dynamic"]

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
