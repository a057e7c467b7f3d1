"""The bodies of ONNX ``If``/``Loop``/``Scan`` as graphs, so the analysis costs their nodes.

A body reads values of the graph around it by name (outer scope) besides its own inputs. Each
body becomes a model of its own and goes through the same frontend as the main graph (canonical
ops, attribute defaults, shape inference, nested control flow): its inputs are the body's
formal inputs, typed from the node's actual inputs where the body leaves them unshaped (a
``Scan`` slice: the scanned input without its scan axis), and the outer values it reads, typed
as inferred outside; the outer constants it reads come along (small ones with their values, so
shapes computed from them fold; weights as dims-only stubs, as the shape-inference skeleton has
them).

The node's attrs gain ``bodies`` (``(attribute name, Graph)`` pairs; an ``If``'s then branch
first) and ``trip_count``: 1 for an ``If``; a ``Loop``'s constant ``M`` (an ``M`` of 2^31 or
more is the "no limit" of an exported while loop, so unknown); a ``Scan``'s length along the
scan axis of its first scan input when static; None when unknown.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import onnx
from onnx import helper, numpy_helper

from graphopt.frontends.onnx_attrs import ConstValue, const_array
from graphopt.ir.graph import Graph

__all__ = ["BODY_OPS", "control_flow_bodies"]

_A = onnx.AttributeProto
BODY_OPS = frozenset({"If", "Loop", "Scan"})
#: outer constants up to this many elements are copied with their values (shapes, axes, scalars)
_COPY_MAX_ELEMENTS = 1024
#: a Loop trip count at or past this is an exporter's "no limit" (INT64_MAX for a while loop)
_NO_LIMIT = 2**31

#: a body's warnings not passed on: ONNX Runtime's symbolic inference rarely runs on a body
#: (nested bodies, outer-scope values), and ONNX's own inference gave its shapes anyway
_QUIET = ("ONNX Runtime's symbolic shape inference failed",)

Build = Callable[[onnx.ModelProto, str, list[str]], Graph]


def _subgraphs(node: onnx.NodeProto) -> list[tuple[str, onnx.GraphProto]]:
    found = [(a.name, a.g) for a in node.attribute if a.type == _A.GRAPH]
    order = {"then_branch": 0, "else_branch": 1}
    return sorted(found, key=lambda x: order.get(x[0], 2))


def _free_names(g: onnx.GraphProto) -> set[str]:
    """Names ``g`` (and the graphs nested in it) read but do not define: outer-scope reads."""
    defined = {i.name for i in g.input} | {t.name for t in g.initializer} | {
        s.values.name for s in g.sparse_initializer} | {o for n in g.node for o in n.output}
    used = {o.name for o in g.output}
    for n in g.node:
        used.update(i for i in n.input if i)
        for a in n.attribute:
            nested = [a.g] if a.type == _A.GRAPH else list(a.graphs) if a.type == _A.GRAPHS else []
            for sub in nested:
                used |= _free_names(sub)
    return used - defined


def _stub(name: str, data_type: int, dims: list[int]) -> onnx.TensorProto:
    """A dims-only initializer: shape inference reads its type and dims, never its data."""
    t = onnx.TensorProto(name=name, data_type=data_type, dims=dims,
                         data_location=onnx.TensorProto.EXTERNAL)
    t.external_data.add(key="location", value="graphopt-shape-inference-stub")
    return t


def _initializer(name: str, value: ConstValue) -> onnx.TensorProto:
    if isinstance(value, onnx.TensorProto):
        if math.prod(value.dims) <= _COPY_MAX_ELEMENTS or \
                value.data_location == onnx.TensorProto.EXTERNAL:
            t = onnx.TensorProto()
            t.CopyFrom(value)
            t.name = name
            return t
        return _stub(name, value.data_type, list(value.dims))
    if value.size <= _COPY_MAX_ELEMENTS:
        return numpy_helper.from_array(value, name)
    return _stub(name, helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape))


def _shaped(vi: onnx.ValueInfoProto, outer: onnx.ValueInfoProto | None,
            drop_axis: int | None = None) -> onnx.ValueInfoProto:
    """A formal input's type: as the body declares it when shaped, else the actual input's
    (without ``drop_axis``: a Scan slice)."""
    tt = vi.type.tensor_type
    if (vi.type.HasField("tensor_type") and tt.HasField("shape")) or outer is None or \
            not outer.type.tensor_type.HasField("shape"):
        return vi
    out = onnx.ValueInfoProto()
    out.CopyFrom(outer)
    out.name = vi.name
    if drop_axis is not None:
        dims = out.type.tensor_type.shape.dim
        if -len(dims) <= drop_axis < len(dims):
            del dims[drop_axis]
    return out


def _outer(name: str, infos: dict[str, onnx.ValueInfoProto], consts: dict[str, ConstValue]
           ) -> onnx.ValueInfoProto | None:
    """The type of an outer value: as inferred, or an initializer's or constant's own."""
    vi = infos.get(name)
    value = consts.get(name) if vi is None else None
    if isinstance(value, onnx.TensorProto):
        return helper.make_tensor_value_info(name, value.data_type, list(value.dims))
    if value is not None:
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype),
                                             list(value.shape))
    return vi


def _formal_inputs(node: onnx.NodeProto, body: onnx.GraphProto,
                   infos: dict[str, onnx.ValueInfoProto], consts: dict[str, ConstValue]
                   ) -> list[onnx.ValueInfoProto]:
    """The body's inputs, typed from the node's actual inputs where the body leaves them open."""
    formal = list(body.input)

    def actual(i: int) -> onnx.ValueInfoProto | None:
        return _outer(node.input[i], infos, consts) if i < len(node.input) else None

    if node.op_type == "Loop":  # (iteration, cond, carried...) <- (M, cond, carried...)
        return formal[:2] + [_shaped(vi, actual(i + 2)) for i, vi in enumerate(formal[2:])]
    if node.op_type == "Scan":  # (states..., slices...) <- (states..., scanned inputs...)
        n_scan = _attr(node, "num_scan_inputs", 0)
        axes = _attr(node, "scan_input_axes", None) or [0] * n_scan
        n_state = len(formal) - n_scan
        return [_shaped(vi, actual(i), None if i < n_state else axes[i - n_state])
                for i, vi in enumerate(formal)]
    return formal


def _attr(node: onnx.NodeProto, name: str, default: Any) -> Any:
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _trip_count(node: onnx.NodeProto, infos: dict[str, onnx.ValueInfoProto],
                consts: dict[str, ConstValue]) -> int | None:
    if node.op_type == "If":
        return 1
    if node.op_type == "Loop":
        m = const_array(consts, node.input[0]) if node.input and node.input[0] else None
        count = int(m.reshape(-1)[0]) if m is not None and m.size == 1 else None
        return count if count is not None and count < _NO_LIMIT else None
    n_scan = _attr(node, "num_scan_inputs", 0)
    if not n_scan or len(node.input) < n_scan:
        return None
    vi = _outer(node.input[len(node.input) - n_scan], infos, consts)
    axis = (_attr(node, "scan_input_axes", None) or [0])[0]
    dims = vi.type.tensor_type.shape.dim if vi is not None else []
    if not -len(dims) <= axis < len(dims) or not dims[axis].HasField("dim_value"):
        return None
    return int(dims[axis].dim_value)


def _body_model(model: onnx.ModelProto, node: onnx.NodeProto, body: onnx.GraphProto,
                infos: dict[str, onnx.ValueInfoProto], consts: dict[str, ConstValue]
                ) -> onnx.ModelProto:
    g = onnx.GraphProto(name=body.name)
    g.node.extend(body.node)
    g.initializer.extend(body.initializer)
    g.sparse_initializer.extend(body.sparse_initializer)
    g.input.extend(_formal_inputs(node, body, infos, consts))
    g.output.extend(body.output)
    g.value_info.extend(body.value_info)
    for name in sorted(_free_names(body)):
        if name in consts:
            g.initializer.append(_initializer(name, consts[name]))
        else:
            g.input.append(infos.get(name) or onnx.ValueInfoProto(name=name))
    sub = onnx.ModelProto(ir_version=model.ir_version, graph=g)
    sub.opset_import.extend(model.opset_import)
    return sub


def control_flow_bodies(model: onnx.ModelProto, node: onnx.NodeProto, name: str,
                        infos: dict[str, onnx.ValueInfoProto], consts: dict[str, ConstValue],
                        build: Build, warnings: list[str]) -> dict[str, Any] | None:
    """``bodies`` and ``trip_count`` attrs of an If/Loop/Scan node (``build``: the frontend's
    graph builder); None for another op, or when a body does not build (said in
    ``warnings``)."""
    if node.op_type not in BODY_OPS or node.domain not in ("", "ai.onnx"):
        return None
    bodies: list[tuple[str, Graph]] = []
    found: list[str] = []
    where = name
    try:
        for attr, body in _subgraphs(node):
            where = f"{name}.{attr}"
            said: list[str] = []
            bodies.append((attr, build(_body_model(model, node, body, infos, consts), where,
                                       said)))
            found.extend(f"{where}: {w}" for w in said if not w.startswith(_QUIET))
        trips = _trip_count(node, infos, consts)
    except Exception as exc:  # noqa: BLE001 - a body that does not build stays uncosted
        why = (str(exc).splitlines() or [""])[0][:200]
        warnings.append(f"{where}: the body could not be analysed ({type(exc).__name__}: {why})")
        return None
    warnings.extend(found)
    if trips is None:
        warnings.append(f"{name} ({node.op_type}): the trip count is not a constant, so its body "
                        "is costed as one iteration; the real cost is that times the trips")
    return {"bodies": tuple(bodies), "trip_count": trips}
