"""Run a model without changing it: the user's module and example tensors stay bit-identical.

``forward`` may write its own state (a call counter, a KV cache, BatchNorm running stats) or
its inputs (``x.add_(1)``). optimize runs the user's model for the reference outputs and for
timing, and the rewritten module for every check, so each run gets:

1. fresh clones of the example inputs, so an in-place op on an input changes neither the
   user's tensor nor the next run's input;
2. for the user's model, cloned parameters and buffers through ``torch.func.functional_call``
   (which also puts back attributes that ``forward`` reassigns); for graphopt's own modules,
   buffers restored after the run, so the returned module starts in the user's model's state.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["clone_inputs", "preserved_buffers", "run_isolated"]


def clone_inputs(args: Any) -> Any:
    """Clones of every tensor in ``args`` (tuples, lists and dicts are rebuilt)."""
    if isinstance(args, torch.Tensor):
        return args.detach().clone()
    if isinstance(args, (list, tuple)):
        return type(args)(clone_inputs(a) for a in args)
    if isinstance(args, dict):
        return {k: clone_inputs(v) for k, v in args.items()}
    return args


def run_isolated(model: torch.nn.Module, args: tuple[Any, ...]) -> Any:
    """``model(*args)`` under no_grad on copies of its state and of ``args``."""
    state = {name: t.detach().clone() for name, t in
             (*model.named_parameters(), *model.named_buffers())}
    with torch.no_grad():
        return torch.func.functional_call(model, state, clone_inputs(args))


@contextlib.contextmanager
def preserved_buffers(*modules: torch.nn.Module) -> Iterator[None]:
    """Put every buffer of ``modules`` back as it was (value and object) on exit."""
    saved = [(m, [(name, b, b.detach().clone()) for name, b in m.named_buffers()])
             for m in modules]
    try:
        yield
    finally:
        for module, buffers in saved:
            for name, original, value in buffers:
                owner_name, _, attr = name.rpartition(".")
                owner = module.get_submodule(owner_name) if owner_name else module
                with torch.no_grad():
                    if original.shape == value.shape and original.dtype == value.dtype:
                        original.copy_(value)
                    else:  # resized or retyped in place: take the saved storage back
                        original.set_(value)
                owner._buffers[attr] = original
