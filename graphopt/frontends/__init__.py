"""Frontends: a torch module or an ONNX model becomes one annotated
:class:`~graphopt.ir.graph.Graph`.

torch is imported only when a torch model is given, so planning ONNX files stays light.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from graphopt.errors import GraphoptError, TraceError
from graphopt.frontends.onnx_frontend import load_onnx
from graphopt.frontends.onnx_range import onnx_range
from graphopt.frontends.python_spec import (
    is_python_spec,
    load_python_spec,
    names_python_file,
    needs_function_error,
)
from graphopt.ir.graph import Graph

__all__ = ["is_onnx_proto", "load_graph", "load_python_spec"]


def is_onnx_proto(model: Any) -> bool:
    """An ``onnx.ModelProto``, checked without importing onnx: an object that is one was made
    with onnx already imported."""
    onnx = sys.modules.get("onnx")
    return onnx is not None and isinstance(model, onnx.ModelProto)


def load_graph(model: Any, example_inputs: Any = None, dynamic_shapes: Any = None) -> Graph:
    """Dispatch on the model's kind: ``.onnx`` path or ``ModelProto``, ``nn.Module``, or a
    ``file.py:function`` spec that returns ``(module, example_inputs)``.

    ``dynamic_shapes``: torch.export's argument for a module; for ONNX a dict of symbolic dim
    name -> opt size or (min, opt, max) (:func:`graphopt.frontends.onnx_range.onnx_range`).
    """
    if isinstance(model, (str, os.PathLike)):
        text = os.fspath(model)
        if is_python_spec(text):
            module, inputs, dynamic = load_python_spec(text)
            if example_inputs is None:
                example_inputs, dynamic_shapes = inputs, dynamic_shapes or dynamic
            return load_graph(module, example_inputs, dynamic_shapes)
        if names_python_file(text):
            raise needs_function_error(text)

        return onnx_range(load_onnx(text), dynamic_shapes)
    if is_onnx_proto(model):
        return onnx_range(load_onnx(model), dynamic_shapes)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(model, torch.nn.Module):
        if example_inputs is None:
            raise TraceError(f"a torch module ({type(model).__name__}) needs example inputs "
                             "to be traced",
                             "pass example_inputs=(tensor, ...) shaped like a real batch")
        from graphopt.frontends.torch_frontend import trace_torch

        return trace_torch(model, example_inputs, dynamic_shapes=dynamic_shapes)
    raise GraphoptError(f"cannot plan an object of type {type(model).__name__}",
                        "pass a torch.nn.Module with example inputs, an .onnx path, an "
                        "onnx.ModelProto, or 'file.py:function'")
