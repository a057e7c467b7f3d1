"""``file.py:function`` model specs: the file is imported and the function called; it returns
``(module, example_inputs)`` or ``(module, example_inputs, dynamic_shapes)``. A ``.py`` given
without ``:function`` gets an error that lists the candidate functions, read from the source
without running it.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from typing import Any

from graphopt.errors import ModelLoadError, user_code

__all__ = ["builder_functions", "is_python_spec", "load_python_spec", "names_python_file",
           "needs_function_error"]


def is_python_spec(text: str) -> bool:
    """``file.py:function`` with a valid function name."""
    path, sep, func = text.rpartition(":")
    return bool(sep) and path.endswith(".py") and func.isidentifier()


def names_python_file(text: str) -> bool:
    """``model.py`` or ``model.py:<not a name>``: a Python file, but no function to call."""
    path, sep, _ = text.rpartition(":")
    return text.lower().endswith(".py") or (bool(sep) and path.lower().endswith(".py"))


def builder_functions(path: Path) -> list[str]:
    """Top-level functions of ``path`` callable with no arguments that return a value: the
    candidates for ``file.py:function``, read from the source without running it."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return []
    names = []
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        a = node.args
        required = len(a.posonlyargs) + len(a.args) - len(a.defaults) + sum(
            d is None for d in a.kw_defaults)
        returns = any(isinstance(n, ast.Return) and n.value is not None for n in ast.walk(node))
        if required == 0 and returns:
            names.append(node.name)
    return names


def needs_function_error(text: str) -> ModelLoadError:
    """The error for a ``.py`` named without ``:function`` (else it reads as a corrupt ONNX)."""
    path = Path(text.rpartition(":")[0] if not text.lower().endswith(".py") else text)
    if not path.is_file():
        return ModelLoadError(f"model file {path} does not exist",
                              "give 'path/to/file.py:function' with an existing file")
    names = builder_functions(path)
    found = (f"functions in {path} that could be it: {', '.join(names)}" if names else
             f"{path} defines no top-level function that takes no arguments and returns a value")
    example = f"{path}:{names[0] if names else 'build'}"
    return ModelLoadError(
        f"{path} is a Python file: graphopt calls a function in it that returns (module, "
        f"example_inputs); {found}",
        f"name the function after a colon, e.g. '{example}'")


def load_python_spec(spec: str) -> tuple[Any, Any, Any]:
    """Import ``file.py`` and call ``function()``, which must return ``(module, inputs)`` or
    ``(module, inputs, dynamic_shapes)``; returns the three (``dynamic_shapes`` None if not
    given)."""
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
    with user_code(f"importing {path}"):  # sys.exit() at import: an error, not an exit
        try:
            loader_spec.loader.exec_module(module)
        except Exception as e:  # user code: report it, not our traceback
            raise ModelLoadError(f"importing {path} failed: {type(e).__name__}: {e}",
                                 "fix the error in the model file") from None
    func = getattr(module, func_name, None)
    if not callable(func):
        names = builder_functions(path)
        raise ModelLoadError(f"{path} has no function {func_name!r}",
                             f"use one of: {', '.join(names) or '(none)'}")
    with user_code(f"{spec}()"):
        try:
            result = func()
        except Exception as e:
            raise ModelLoadError(f"{spec}() raised {type(e).__name__}: {e}",
                                 "fix the model-building function") from None
    if not (isinstance(result, tuple) and len(result) in (2, 3)):
        raise ModelLoadError(f"{spec}() must return (module, example_inputs), got "
                             f"{type(result).__name__}",
                             "return a (torch.nn.Module, tuple_of_inputs) pair, or "
                             "(module, inputs, dynamic_shapes) for shape ranges")
    import torch  # here: naming a .py must not import torch for an ONNX-only command

    if not isinstance(result[0], torch.nn.Module):  # e.g. a path: it is not an ONNX spec
        raise ModelLoadError(f"{spec}() returned a {type(result[0]).__name__} as the module, "
                             "not a torch.nn.Module",
                             "return the torch.nn.Module instance itself; give an .onnx file "
                             "to graphopt directly, not from a builder")
    return (*result, None) if len(result) == 2 else result
