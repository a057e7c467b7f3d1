"""Example inputs given as torch.export takes them, ``(args, kwargs)``, as forward's positions.

``graphopt.plan`` traces keyword inputs as they are, but ``optimize`` runs the traced graph and
the module it returns many times, and they take their inputs by position (the returned module
also by the same names). Binding the keywords to ``forward``'s signature once, up front, lets a
user pass ``optimize(model, (), {"input_ids": ids, "attention_mask": mask})`` as they would call
``torch.export.export``. :func:`without_cache` is the model as traced when ``forward`` would
return a KV cache torch.export cannot.
"""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Mapping
from typing import Any

from graphopt.errors import GraphoptError

__all__ = ["positional_inputs", "without_cache"]

_FIX = ("pass the inputs as forward takes them: a tensor, a tuple of positional inputs, "
        "and kwargs={name: tensor} for keyword inputs (as torch.export.export takes them)")


def _split(example_inputs: Any, kwargs: Mapping[str, Any] | None) -> tuple[tuple, dict]:
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise GraphoptError(f"kwargs must be a dict of keyword inputs, got "
                            f"{type(kwargs).__name__}", _FIX)
    kw = dict(kwargs or {})
    if isinstance(example_inputs, Mapping):
        return (), {**dict(example_inputs), **kw}
    if example_inputs is None:
        return (), kw
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs), kw
    return (example_inputs,), kw


def positional_inputs(model: Any, example_inputs: Any, kwargs: Mapping[str, Any] | None = None
                      ) -> tuple[Any, ...]:
    """The inputs as a tuple in ``forward``'s order. A parameter skipped between two given
    ones takes its default; a keyword-only parameter cannot be given (no position)."""
    args, kw = _split(example_inputs, kwargs)
    if not kw:
        return args
    name = type(model).__name__
    try:
        sig = inspect.signature(model.forward)
        bound = sig.bind(*args, **kw)
    except TypeError as e:
        raise GraphoptError(f"the example inputs do not match {name}.forward: {e}", _FIX) from None
    except ValueError:  # no signature to read: keywords have no positions
        raise GraphoptError(f"{name}.forward has no signature to place keyword inputs by",
                            "pass every input by position") from None
    params = list(sig.parameters.values())
    keyword_only = [p.name for p in params if p.kind is p.KEYWORD_ONLY and p.name in kw]
    if keyword_only or any(p.kind is p.VAR_KEYWORD and p.name in bound.arguments
                           for p in params):
        extra = keyword_only or sorted(bound.arguments[next(
            p.name for p in params if p.kind is p.VAR_KEYWORD)])
        raise GraphoptError(f"{name}.forward takes {', '.join(extra)} by keyword only: the "
                            "optimized module calls its graph by position",
                            "wrap the model in a module whose forward takes every input by "
                            "position")
    given = [i for i, p in enumerate(params) if p.name in bound.arguments]
    out: list[Any] = []
    for p in params[:max(given) + 1]:
        if p.kind is p.VAR_POSITIONAL:
            out.extend(bound.arguments.get(p.name, ()))
        elif p.name in bound.arguments:
            out.append(bound.arguments[p.name])
        else:  # a gap between given inputs: forward's own default fills it
            out.append(p.default)
    return tuple(out)


def without_cache(model: Any, kwargs: Mapping[str, Any]) -> tuple[Any, str | None]:
    """``model`` as torch.export can trace it when ``forward`` would return a KV cache.

    A transformers causal LM returns a ``DynamicCache`` when ``use_cache`` is on (its config's
    default), and torch.export cannot return one. When ``forward`` takes ``use_cache``, the
    caller did not give it and it would be on, this returns a shallow copy of ``model`` whose
    ``forward`` passes ``use_cache=False`` by keyword, and the warning that says so. The copy
    shares the submodules, parameters and config (none is written); the user's model and its
    config are untouched. Otherwise ``(model, None)``.
    """
    try:
        param = inspect.signature(model.forward).parameters.get("use_cache")
    except (TypeError, ValueError):
        return model, None
    if param is None or "use_cache" in kwargs or param.kind is param.POSITIONAL_ONLY:
        return model, None
    on = (param.default if isinstance(param.default, bool)
          else bool(getattr(getattr(model, "config", None), "use_cache", False)))
    if not on:
        return model, None
    traced = copy.copy(model)  # shares _modules/_parameters/config: nothing is written to them
    traced.forward = functools.partial(type(model).forward, traced, use_cache=False)
    name = type(model).__name__
    return traced, (f"{name}.forward takes use_cache and it is on (its config's use_cache is "
                     "left as it is): traced with use_cache=False, because torch.export cannot "
                     "return a KV cache; the graph and the optimized module return the other "
                     "outputs without past_key_values")
