"""The CLI's ``--dynamic`` option: shape ranges written on the command line.

Two forms, one per kind of model:

* ONNX: ``--dynamic NAME=OPT`` or ``--dynamic NAME=MIN:OPT:MAX`` for a symbolic dim
  (``dim_param``) of the model; ``MAX`` may be ``inf``.
* ``file.py:function``: ``--dynamic INPUT.AXIS=NAME:MIN:MAX`` makes axis AXIS of forward's
  argument INPUT a ``torch.export.Dim(NAME, min=MIN, max=MAX)``; the same NAME on several axes
  is one dim (a batch shared by ``input_ids`` and ``attention_mask``). The example input's size
  is the opt point. The builder function can also return ``(module, inputs, dynamic_shapes)``.

Several ranges: repeat the option or separate them with commas.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from graphopt.errors import GraphoptError

__all__ = ["parse_dynamic"]

_TORCH = re.compile(r"^(\w+)\.(\d+)=(\w+):(\d+):(\d+|inf)$")
_ONNX = re.compile(r"^([^=\s]+)=(\d+)(?::(\d+):(\d+|inf))?$")
_FIX = ("write --dynamic NAME=OPT or NAME=MIN:OPT:MAX for an ONNX model's symbolic dim, or "
        "--dynamic INPUT.AXIS=NAME:MIN:MAX for forward's argument INPUT (e.g. x.0=batch:1:64)")


def parse_dynamic(specs: Sequence[str] | None, torch_model: bool) -> Any:
    """The ``dynamic_shapes`` argument for ``graphopt.plan``/``optimize`` from ``--dynamic``
    values, or None when none were given."""
    items = [s.strip() for spec in specs or () for s in spec.split(",") if s.strip()]
    if not items:
        return None
    return _torch(items) if torch_model else _onnx(items)


def _onnx(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        m = _ONNX.match(item)
        if m is None:
            raise GraphoptError(f"--dynamic {item!r} is not NAME=OPT or NAME=MIN:OPT:MAX", _FIX)
        name, first, opt, top = m.groups()
        if opt is None:
            out[name] = int(first)
        else:
            out[name] = (int(first), int(opt), None if top == "inf" else int(top))
    return out


def _torch(items: list[str]) -> dict[str, dict[int, Any]]:
    from torch.export import Dim

    dims: dict[str, Any] = {}
    out: dict[str, dict[int, Any]] = {}
    for item in items:
        m = _TORCH.match(item)
        if m is None:
            raise GraphoptError(f"--dynamic {item!r} is not INPUT.AXIS=NAME:MIN:MAX (a torch "
                                "model's range)", _FIX)
        arg, axis, name, lo, top = m.groups()
        key = (int(lo), None if top == "inf" else int(top))
        dim = dims.get(name)
        if dim is None:
            dim = Dim(name, min=key[0]) if key[1] is None else Dim(name, min=key[0], max=key[1])
            dims[name] = dim
            dims[name + "\0range"] = key
        elif dims[name + "\0range"] != key:
            raise GraphoptError(f"--dynamic gives dim {name} two ranges",
                                f"give {name} one MIN:MAX on every axis it sizes")
        out.setdefault(arg, {})[int(axis)] = dim
    return out
