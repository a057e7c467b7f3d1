"""Run a model without changing it: the user's module and example tensors stay bit-identical.

``forward`` may write its own state (a call counter, a KV cache, BatchNorm running stats), state
held elsewhere (transformers' ``StaticCache`` keeps its K/V on a cache object and registers the
same tensors as buffers) or its inputs (``x.add_(1)``). optimize runs the user's model for the
reference outputs and for timing, and the rewritten module for every check, so each run gets:

1. fresh clones of the example inputs (holder objects among them copied too), so an in-place op
   on an input changes neither the user's tensor nor the next run's input;
2. for the user's model, a private copy of every tensor it reaches, registered or not
   (:func:`graphopt.frontends.user_state.private_copy`; a model that refuses ``deepcopy`` runs
   with cloned parameters and buffers through ``torch.func.functional_call``, and
   ``graphopt.optimize``'s guard checks the rest); for graphopt's own modules, every tensor
   they reach put back after the run, so the returned module starts in the user's model's state.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from graphopt.errors import GraphoptError
from graphopt.frontends.user_state import Snapshot, clone_inputs, private_copy

__all__ = ["clone_inputs", "preserved_buffers", "private_copy", "run_isolated"]


def run_isolated(model: torch.nn.Module, args: tuple[Any, ...]) -> Any:
    """``model(*args)`` under no_grad on a private copy of the model and of ``args``."""
    with torch.no_grad():
        try:
            own, inputs = private_copy((model, args))
        except GraphoptError:  # not copyable: its registered state swapped for clones
            state = {name: t.detach().clone() for name, t in
                     (*model.named_parameters(), *model.named_buffers())}
            return torch.func.functional_call(model, state, clone_inputs(args))
        return own(*inputs)


@contextlib.contextmanager
def preserved_buffers(*modules: torch.nn.Module) -> Iterator[None]:
    """Put every tensor ``modules`` reach back as it was (value and object) on exit: buffers
    and the tensors held on attributes (an exported cache's lifted constants)."""
    saved = [Snapshot(m) for m in modules]
    try:
        yield
    finally:
        for snap in saved:
            snap.restore()
