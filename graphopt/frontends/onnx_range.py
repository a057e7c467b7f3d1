"""An ONNX model's symbolic input dims (``dim_param``) as a shape range.

ONNX Runtime runs a symbolic dim at any size; graphopt plans it at an opt size the user names
(``dynamic_shapes={"seq": 512}`` or ``{"seq": (1, 512, 2048)}``, CLI ``--dynamic seq=1:512:2048``)
or at a stated default: 1 for a leading (batch) dim, 128 for any other. The checks run at those
sizes too, never at a silent made-up one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from graphopt.errors import GraphoptError
from graphopt.frontends.onnx_symbolic import opt_point_shapes, unknown_dims
from graphopt.ir.graph import Graph, TensorInfo
from graphopt.ir.shape_range import MAX_DIM_VALUE, DimRange, ShapeRange

__all__ = ["DEFAULT_BATCH", "DEFAULT_OTHER", "default_opt", "free_input_dims", "onnx_range",
           "parse_dim_spec"]

#: opt size of a symbolic leading dim (one request) and of any other (a typical sequence)
DEFAULT_BATCH, DEFAULT_OTHER = 1, 128


def parse_dim_spec(name: str, value: Any) -> DimRange:
    """``8`` (opt) or ``(min, opt, max)`` (max None for unbounded) -> a DimRange.
    ``min = opt = max`` is a symbolic dim fixed at one size: planned and checked there only."""
    fix = (f"give {name!r} an opt size (e.g. {name}=512) or (min, opt, max) "
           f"(e.g. {name}=1:512:2048 on the CLI)")
    if isinstance(value, bool):
        raise GraphoptError(f"dim {name!r}: {value!r} is not a size", fix)
    if isinstance(value, int):
        lo, opt, hi = 1, value, None
    elif isinstance(value, (tuple, list)) and len(value) == 3:
        lo, opt, hi = value
    else:
        raise GraphoptError(f"dim {name!r}: {value!r} is neither a size nor (min, opt, max)", fix)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (lo, opt)) or \
            not (hi is None or isinstance(hi, int)):
        raise GraphoptError(f"dim {name!r}: sizes must be integers, got {value!r}", fix)
    if lo < 1 or opt < lo or (hi is not None and hi < opt):
        raise GraphoptError(f"dim {name!r}: need 1 <= min <= opt <= max (min = max fixes it "
                            f"at one size), got {value!r}", fix)
    if max(lo, opt, hi or 0) > MAX_DIM_VALUE:
        raise GraphoptError(f"dim {name!r}: {value!r} is larger than any tensor dim (at most "
                            "2**62)", fix)
    return DimRange(name, lo, opt, hi, "dynamic_shapes")


def onnx_range(graph: Graph, spec: Mapping[str, Any] | None) -> Graph:
    """``graph`` with ``shape_range`` set from its inputs' symbolic dims and ``spec``.

    An unnamed symbolic input dim ("?") is named ``<input>_<axis>`` so it can be given a size.
    """
    if spec is not None and not isinstance(spec, Mapping):
        raise GraphoptError(f"dynamic_shapes for an ONNX model is a dict of symbolic dim "
                            f"sizes, got {type(spec).__name__}",
                            "pass e.g. dynamic_shapes={'batch': (1, 8, 64), 'seq': 512}")
    _check_keys(graph, spec)
    dims: dict[str, DimRange] = {}
    defaults: list[str] = []
    for _, axis, d in free_input_dims(graph):
        if d in dims:
            continue
        if spec is not None and d in spec:
            dims[d] = parse_dim_spec(d, spec[d])
        else:
            dims[d] = DimRange(d, 1, default_opt(axis), None, "default")
            defaults.append(f"{d}={default_opt(axis)}")
    inputs: dict[str, tuple[int | str, ...]] = {}
    for name in graph.inputs:
        t = graph.tensors.get(name)
        if t is None or t.shape is None or t.is_static:
            continue
        shape = tuple(f"{name}_{i}" if d == "?" else d for i, d in enumerate(t.shape))
        if shape != t.shape:
            graph.tensors[name] = TensorInfo(t.name, shape, t.dtype, t.kind)
        inputs[name] = shape
    unknown = sorted(set(spec or ()) - set(dims))
    if unknown:
        have = ", ".join(dims) or "none"
        raise GraphoptError(f"dynamic_shapes names {', '.join(unknown)}, which no input of "
                            f"the model has as a symbolic dim (it has: {have})",
                            "name the model's own symbolic dims (see the inputs in "
                            "`graphopt plan model.onnx`)")
    if defaults:
        graph.warnings.append(
            f"symbolic dims planned and checked at default sizes: {', '.join(defaults)} "
            f"(leading dims {DEFAULT_BATCH}, others {DEFAULT_OTHER}); give your own with "
            "dynamic_shapes={'name': opt or (min, opt, max)} or --dynamic name=min:opt:max")
    graph.shape_range = ShapeRange(tuple(dims.values()), inputs) if dims else None
    if dims:
        _size_at_opt(graph, {name: r.opt for name, r in dims.items()})
    return graph


def default_opt(axis: int) -> int:
    """The stated opt size of a symbolic dim nobody sized: a leading dim is one request."""
    return DEFAULT_BATCH if axis == 0 else DEFAULT_OTHER


def free_input_dims(graph: Graph) -> list[tuple[str, int, str]]:
    """(input, axis, dim name) of every symbolic input dim, in input order: an unnamed one
    ("?") named ``<input>_<axis>``. A dim written as an expression of the inputs' plain dims
    (``4*t``, ``t + 1``: how graphopt exports a torch range with derived dims) is sized from
    them and is no dim of its own: left out."""
    shapes = [(name, t.shape) for name in graph.inputs
              if (t := graph.tensors.get(name)) is not None and t.shape is not None]
    plain = {d for _, shape in shapes for d in shape if isinstance(d, str) and d.isidentifier()}
    out = []
    for name, shape in shapes:
        for axis, d in enumerate(shape):
            if isinstance(d, int) or (not d.isidentifier() and d != "?" and
                                      unknown_dims((d,), plain) == 0):
                continue
            out.append((name, axis, f"{name}_{axis}" if d == "?" else str(d)))
    return out


def _size_at_opt(graph: Graph, opt: dict[str, int]) -> None:
    """Dims no inferencer could write as an expression of the input dims take their size in
    the model's static twin at the opt point (:func:`.onnx_symbolic.opt_point_shapes`): the
    plan at opt is then the static export's, and such a dim stays that size over the range."""
    known = set(opt)
    vague = [name for name, t in graph.tensors.items()
             if t.shape is not None and unknown_dims(t.shape, known)]
    if not vague or graph.source_model is None:
        return
    proto = graph.source_model
    at = {n.name: i for i, n in enumerate(proto.graph.node)}
    first = [i for i, n in enumerate(proto.graph.node) if n.op_type == "Constant"]
    order = [*first, *(at[n.name] for n in graph.nodes if n.name in at and at[n.name]
                       not in first)]
    order += sorted(set(range(len(proto.graph.node))) - set(order))
    twin = opt_point_shapes(proto, order, opt)
    sized = []
    for name in vague:
        t, static = graph.tensors[name], twin.get(name)
        if static is None or len(static) != len(t.shape):
            continue
        shape = tuple(s if unknown_dims((d,), known) else d
                      for d, s in zip(t.shape, static, strict=True))
        graph.tensors[name] = TensorInfo(t.name, shape, t.dtype, t.kind)
        sized.append(name)
    if sized:
        more = f" and {len(sized) - 3} more" if len(sized) > 3 else ""
        graph.warnings.append(
            f"{len(sized)} tensors have sizes known only at the opt point (no expression of the "
            f"input dims gives them; planned at that size over the whole range): "
            f"{', '.join(sized[:3])}{more}")


def _check_keys(graph: Graph, spec: Mapping[str, Any] | None) -> None:
    """Every key of ``spec`` is a dim's name (a string): an axis number or an input name's
    tuple is ONNX-meaningless here, and would fail later as a TypeError."""
    bad = [k for k in spec or () if not isinstance(k, str)]
    if not bad:
        return
    names = [d for _, _, d in free_input_dims(graph)]
    raise GraphoptError(f"dynamic_shapes for an ONNX model is keyed by symbolic dim name, got "
                        f"the key {bad[0]!r} ({type(bad[0]).__name__})",
                        f"use the dims' names: {', '.join(dict.fromkeys(names)) or 'none'} "
                        "(e.g. dynamic_shapes={'seq': (1, 512, 2048)})")
