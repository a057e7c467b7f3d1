"""Frontends: a torch module or an ONNX model becomes one annotated :class:`~graphopt.ir.Graph`.

torch is imported only when a torch model is given, so planning ONNX files stays light.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from graphopt.errors import GraphoptError, ModelLoadError, TraceError
from graphopt.ir import Graph

__all__ = ["load_graph", "load_python_spec"]


def load_graph(model: Any, example_inputs: Any = None) -> Graph:
    """Dispatch on the model's kind: ``.onnx`` path or ``ModelProto``, ``nn.Module``, or a
    ``file.py:function`` spec that returns ``(module, example_inputs)``."""
    if isinstance(model, (str, os.PathLike)):
        text = os.fspath(model)
        if _is_python_spec(text):
            module, inputs = load_python_spec(text)
            return load_graph(module, inputs if example_inputs is None else example_inputs)
        from graphopt.frontends.onnx_frontend import load_onnx

        return load_onnx(text)
    if type(model).__name__ == "ModelProto":
        from graphopt.frontends.onnx_frontend import load_onnx

        return load_onnx(model)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(model, torch.nn.Module):
        if example_inputs is None:
            raise TraceError(f"a torch module ({type(model).__name__}) needs example inputs "
                             "to be traced",
                             "pass example_inputs=(tensor, ...) shaped like a real batch")
        from graphopt.frontends.torch_frontend import trace_torch

        return trace_torch(model, example_inputs)
    raise GraphoptError(f"cannot plan an object of type {type(model).__name__}",
                        "pass a torch.nn.Module with example inputs, an .onnx path, an "
                        "onnx.ModelProto, or 'file.py:function'")


def _is_python_spec(text: str) -> bool:
    path, sep, func = text.rpartition(":")
    return bool(sep) and path.endswith(".py") and func.isidentifier()


def load_python_spec(spec: str) -> tuple[Any, Any]:
    """Import ``file.py`` and call ``function()``, which must return ``(module, inputs)``."""
    path_text, _, func_name = spec.rpartition(":")
    path = Path(path_text)
    if not path.is_file():
        raise ModelLoadError(f"model file {path} does not exist",
                             "give 'path/to/file.py:function' with an existing file")
    mod_name = f"_graphopt_model_{abs(hash(str(path.resolve())))}"
    loader_spec = importlib.util.spec_from_file_location(mod_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise ModelLoadError(f"cannot import {path}", "give a Python source file (.py)")
    module = importlib.util.module_from_spec(loader_spec)
    try:
        loader_spec.loader.exec_module(module)
    except Exception as e:  # user code: report it, not our traceback
        raise ModelLoadError(f"importing {path} failed: {type(e).__name__}: {e}",
                             "fix the error in the model file") from None
    func = getattr(module, func_name, None)
    if not callable(func):
        names = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise ModelLoadError(f"{path} has no function {func_name!r}",
                             f"use one of: {', '.join(names) or '(none)'}")
    try:
        result = func()
    except Exception as e:
        raise ModelLoadError(f"{spec}() raised {type(e).__name__}: {e}",
                             "fix the model-building function") from None
    if not (isinstance(result, tuple) and len(result) == 2):
        raise ModelLoadError(f"{spec}() must return (module, example_inputs), got "
                             f"{type(result).__name__}",
                             "return a (torch.nn.Module, tuple_of_inputs) pair")
    return result
