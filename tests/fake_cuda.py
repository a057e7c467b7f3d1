"""Run a module "on CUDA" on a CPU-only machine: every tensor a fake CUDA tensor.

Parameters, buffers and inputs become ``FakeTensor``s on ``cuda:0`` (made inside a
``FakeTensorMode``, which needs no CUDA build or GPU), and the module runs through
``torch.func.functional_call``. A factory call with a baked-in ``device=cpu`` makes a CPU
tensor, and the first op that mixes it with a CUDA tensor raises
``FakeTensorDeviceMismatchError``, as the real GPU run would fail. A tensor the module keeps
outside its state (a plain tensor attribute, which ``.to()`` would not move) stays a real CPU
tensor, which the mode refuses outright (stricter than CUDA, which takes a 0-dim CPU tensor).
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_leaves

__all__ = ["run_fake_cuda"]


def _fake_cuda(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cuda",
                               requires_grad=t.requires_grad)


def run_fake_cuda(module: torch.nn.Module, args: tuple[Any, ...]) -> list[torch.Tensor]:
    """The output tensors of ``module(*args)`` with its state and inputs as fake CUDA tensors.

    The module is not touched: its state is passed to ``functional_call``, not moved.
    """
    real = {**dict(module.named_parameters(remove_duplicate=False)),
            **dict(module.named_buffers(remove_duplicate=False))}
    with FakeTensorMode(allow_non_fake_inputs=False), torch.no_grad():
        state = {k: _fake_cuda(v) for k, v in real.items()}
        fake_args = tuple(_fake_cuda(a) if isinstance(a, torch.Tensor) else a for a in args)
        out = torch.func.functional_call(module, state, fake_args)
    return [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
