"""Forms other exporters write, made the one form graphopt reads, on the frontend's own copy.

1. **A ``-1`` dim is a free dim.** Paddle's exporter and older converters write
   ``dim_value: -1`` where ONNX means a symbolic dim; ONNX Runtime runs such a model at any
   size. A graph input's ``-1`` becomes the symbolic dim ``<input>_<axis>`` (the name
   :func:`graphopt.frontends.onnx_range.onnx_range` gives an unnamed one, so
   ``dynamic_shapes={"x_0": 8}`` sizes it); an output's or a value_info's becomes unknown, for
   shape inference to fill.
2. **A ``Constant`` node's weight is a weight.** Paddle exports keep weights as ``Constant``
   nodes; a rewrite that reads initializers (padding, precision, quantization) would skip
   them. A top-level ``Constant`` whose ``value`` is a weight (more than one element of a
   floating or low-bit dtype: the frontend's ``param`` rule) becomes an initializer of the
   same name: the same tensor, produced before any node, so the model computes the same.
"""

from __future__ import annotations

import onnx

__all__ = ["free_negative_dims", "weights_as_initializers"]


def _free(vi: onnx.ValueInfoProto, name_it: bool) -> int:
    if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
        return 0
    freed = 0
    for axis, d in enumerate(vi.type.tensor_type.shape.dim):
        if d.HasField("dim_value") and d.dim_value < 0:
            d.ClearField("dim_value")
            if name_it:
                d.dim_param = f"{vi.name}_{axis}"
            freed += 1
    return freed


def free_negative_dims(model: onnx.ModelProto) -> int:
    """Case 1 on ``model`` in place; the number of dims freed."""
    g = model.graph
    return (sum(_free(vi, True) for vi in g.input) +
            sum(_free(vi, False) for group in (g.output, g.value_info) for vi in group))


def weights_as_initializers(model: onnx.ModelProto, is_weight: object) -> list[str]:
    """Case 2 on ``model`` in place; the names moved. ``is_weight(tensor)`` is the frontend's
    param rule. Needs IR >= 4 (an initializer need not be a graph input)."""
    if model.ir_version < 4:
        return []
    g = model.graph
    keep, moved = [], []
    for node in g.node:
        value = next((a.t for a in node.attribute if a.name == "value"), None) \
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and \
            len(node.output) == 1 and len(node.attribute) == 1 else None
        if value is None or not is_weight(value):
            keep.append(node)
            continue
        tensor = onnx.TensorProto()
        tensor.CopyFrom(value)
        tensor.name = node.output[0]
        g.initializer.append(tensor)
        moved.append(tensor.name)
    if moved:
        del g.node[:]
        g.node.extend(keep)
    return moved
