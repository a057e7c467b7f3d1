"""ONNX node attributes as Python values, with the defaults the analysis reads made explicit.

Analysis passes read one form: ``attrs["group"]`` is always there for a Conv, ``attrs["axes"]`` of
a Reduce op is a list (or None = all axes) whether the model is opset 13 (attribute) or 18 (input).
Defaults are the ONNX operator spec's (https://onnx.ai/onnx/operators/), opset >= 13 semantics.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from graphopt.ir.graph import Node, TensorInfo
from graphopt.ir.ops import ATTENTION_OPS

__all__ = ["SUBGRAPH", "ConstValue", "attr_value", "const_array", "fill_defaults", "tensor_array"]

_T = onnx.TensorProto
_A = onnx.AttributeProto

#: Marker kept in ``attrs`` for a graph attribute; an If/Loop/Scan's bodies are built as graphs
#: beside it, in ``attrs["bodies"]`` (:mod:`graphopt.frontends.onnx_bodies`).
SUBGRAPH = "<subgraph>"

#: A constant's value: an initializer (decoded on demand) or an already-decoded array.
ConstValue = onnx.TensorProto | np.ndarray

Shape = tuple[int | str, ...]

_DEFAULTS: dict[str, dict[str, Any]] = {
    "Gemm": {"transA": 0, "transB": 0, "alpha": 1.0, "beta": 1.0},
    "QGemm": {"transA": 0, "transB": 0, "alpha": 1.0},
    "Softmax": {"axis": -1}, "LogSoftmax": {"axis": -1}, "Hardmax": {"axis": -1},
    "LayerNormalization": {"axis": -1, "epsilon": 1e-5},
    "RMSNormalization": {"axis": -1, "epsilon": 1e-5},
    "BatchNormalization": {"epsilon": 1e-5, "momentum": 0.9, "training_mode": 0},
    "InstanceNormalization": {"epsilon": 1e-5}, "GroupNormalization": {"epsilon": 1e-5},
    "ArgMax": {"axis": 0, "keepdims": 1}, "ArgMin": {"axis": 0, "keepdims": 1},
    "TopK": {"axis": -1, "largest": 1}, "Gather": {"axis": 0}, "GatherElements": {"axis": 0},
    "Split": {"axis": 0}, "Flatten": {"axis": 1}, "Gelu": {"approximate": "none"},
}
_CONV_WEIGHT_INPUT = {"Conv": 1, "ConvTranspose": 1, "ConvInteger": 1, "QLinearConv": 3}
_WINDOW_OPS = frozenset(_CONV_WEIGHT_INPUT) | {"MaxPool", "AveragePool", "LpPool"}


def tensor_array(t: onnx.TensorProto) -> np.ndarray | None:
    """The tensor's value, or None; never reads external data (to_array would, from the cwd)."""
    if t.data_location == _T.EXTERNAL:
        return None
    try:
        return numpy_helper.to_array(t)
    except Exception:  # malformed data must not stop the load
        return None


def const_array(consts: dict[str, ConstValue], name: str) -> np.ndarray | None:
    """The value of constant ``name`` (decoded once, then cached), or None if not constant."""
    value = consts.get(name)
    if value is None or isinstance(value, np.ndarray):
        return value
    arr = tensor_array(value)
    if arr is not None:
        consts[name] = arr
    return arr


def attr_value(a: onnx.AttributeProto) -> Any:
    """A Python value: str not bytes, lists not repeated fields, arrays not TensorProtos."""
    t = a.type
    if t == _A.INT:
        return a.i
    if t == _A.FLOAT:
        return a.f
    if t == _A.STRING:
        return a.s.decode("utf-8", "replace")
    if t == _A.INTS:
        return list(a.ints)
    if t == _A.FLOATS:
        return list(a.floats)
    if t == _A.STRINGS:
        return [s.decode("utf-8", "replace") for s in a.strings]
    if t == _A.TENSOR:
        return tensor_array(a.t)
    if t == _A.TENSORS:
        return [tensor_array(x) for x in a.tensors]
    if t == _A.GRAPH:
        return SUBGRAPH
    if t == _A.GRAPHS:
        return [SUBGRAPH] * len(a.graphs)
    if a.ref_attr_name:
        return f"<ref:{a.ref_attr_name}>"
    return f"<{_A.AttributeType.Name(t).lower()}>"


def fill_defaults(node: Node, tensors: dict[str, TensorInfo], consts: dict[str, ConstValue],
                  notes: dict[str, list[str]]) -> None:
    """Make absent attributes explicit with their ONNX defaults so analysis reads one form."""
    a, op = node.attrs, node.op_type
    for key, value in _DEFAULTS.get(op, {}).items():
        a.setdefault(key, value)
    if op in _WINDOW_OPS:
        _window_defaults(node, tensors)
    elif op.startswith("Reduce"):
        a.setdefault("keepdims", 1)
        a.setdefault("noop_with_empty_axes", 0)
        if "axes" in a:
            axes: list[int] | None = list(a["axes"])
        elif len(node.inputs) > 1 and node.inputs[1]:  # opset 18 (ReduceSum: 13) axes input
            arr = const_array(consts, node.inputs[1])
            axes = None if arr is None else [int(v) for v in arr.reshape(-1)]
            if axes is None:
                notes.setdefault("reduce axes are not constant, taken as all axes",
                                 []).append(node.name)
        else:
            axes = []
        a["axes"] = None if not axes and not a["noop_with_empty_axes"] else axes
    elif op == "Transpose" and "perm" not in a:
        x = tensors.get(node.inputs[0]) if node.inputs else None
        if x is not None and x.shape is not None:
            a["perm"] = list(range(len(x.shape)))[::-1]
    elif op in ATTENTION_OPS:
        if not a.get("scale"):  # contrib ops write 0.0 for "1/sqrt(head_size)"
            a["scale"] = None
        a.setdefault("is_causal", int(a.get("unidirectional", 0)))
    elif op == "MatMul" and node.source_op != "MatMul":  # FusedMatMul
        for key, value in (("transA", 0), ("transB", 0), ("alpha", 1.0)):
            a.setdefault(key, value)


def _window_defaults(node: Node, tensors: dict[str, TensorInfo]) -> None:
    """Conv/ConvTranspose/pool: group, kernel_shape (from W), strides, dilations, pads."""
    a, op = node.attrs, node.op_type
    w_idx = _CONV_WEIGHT_INPUT.get(op)
    if w_idx is not None:
        a.setdefault("group", 1)
        w = tensors.get(node.inputs[w_idx]) if len(node.inputs) > w_idx else None
        if "kernel_shape" not in a and w is not None and w.shape is not None \
                and len(w.shape) > 2 and all(isinstance(d, int) for d in w.shape[2:]):
            a["kernel_shape"] = list(w.shape[2:])
    x = tensors.get(node.inputs[0]) if node.inputs else None
    kernel = a.get("kernel_shape")
    if kernel is not None:
        rank = len(kernel)
    elif x is not None and x.shape is not None and len(x.shape) > 2:
        rank = len(x.shape) - 2
    else:
        return
    a.setdefault("strides", [1] * rank)
    a.setdefault("dilations", [1] * rank)
    if op == "ConvTranspose":
        a.setdefault("output_padding", [0] * rank)
    if "pads" not in a:
        a["pads"] = _auto_pads(a, x.shape if x is not None else None, rank, kernel)


def _auto_pads(a: dict[str, Any], x_shape: Shape | None, rank: int,
               kernel: list[int] | None) -> list[int]:
    """Explicit pads for ``auto_pad`` SAME_UPPER/SAME_LOWER when the input size is known."""
    mode = a.get("auto_pad", "NOTSET")
    spatial = x_shape[2:] if x_shape is not None and len(x_shape) == rank + 2 else None
    if mode not in ("SAME_UPPER", "SAME_LOWER") or kernel is None or spatial is None \
            or not all(isinstance(d, int) for d in spatial):
        return [0] * (2 * rank)
    begin, end = [], []
    for i, n in enumerate(spatial):
        s, span = a["strides"][i], (kernel[i] - 1) * a["dilations"][i] + 1
        if "output_padding" in a:  # ConvTranspose: output = input * stride
            total = s * (n - 1) + a["output_padding"][i] + span - n * s
        else:  # output = ceil(input / stride)
            total = (-(-n // s) - 1) * s + span - n
        total = max(int(total), 0)
        small, big = total // 2, total - total // 2
        begin.append(small if mode == "SAME_UPPER" else big)
        end.append(big if mode == "SAME_UPPER" else small)
    return begin + end
