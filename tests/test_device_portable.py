"""Issue 11 item 2: the optimized torch module is not bound to the device it was made on.

The GPU path is tested on this CPU-only machine with fake CUDA tensors (``tests/fake_cuda``):
state and inputs on ``cuda:0``, and any tensor still on the CPU (a constant that is not a
buffer, a factory call with a baked-in ``device=cpu``) fails the run with a device mismatch.
Every zoo architecture runs so for each GPU target's decisions (h100 bf16, a100, v100 fp16),
and small plain models with fp16, padding and channels_last forced.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

import pytest
import torch
from torch import fx, nn

import graphopt
from graphopt.backends.torch.optimized_module import OptimizedModule
from graphopt.backends.torch.portable import make_portable
from tests.arch_zoo import ARCHS, build
from tests.fake_cuda import run_fake_cuda
from tests.padding_models import NvidiaCNN, TokenCNN
from tests.zoo import zoo

#: GPU targets and the compute dtype each one's decisions run in
_GPU_TARGETS = {"h100": "bf16", "a100": "bf16", "v100": "fp16"}


class Constants(nn.Module):
    """Every way a trace bakes the CPU in: a plain tensor attribute, a tensor made in forward
    (a lifted constant), factory ops (ones, full, arange, scalar_tensor, new_zeros) and a
    ``.to()`` with a device."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.scale = torch.tensor([2.0])  # not a buffer: export keeps it a plain attribute

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x) * self.scale + torch.tensor([1.0, 2.0, 3.0, 4.0, 4.0, 3.0, 2.0, 1.0])
        mask = torch.ones(x.shape[0], 8, dtype=torch.bool).tril()
        z = torch.full((x.shape[0], 1), 3.0) + torch.arange(8) + torch.scalar_tensor(0.5)
        return y.masked_fill(mask, 0.0) + z + x.new_zeros(8) + x.to("cpu", torch.float64).float()


def _outputs(out: Any) -> list[torch.Tensor]:
    return [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def _plain_tensor_attrs(gm: nn.Module) -> list[str]:
    """Tensors ``gm`` holds outside its parameters and buffers (``.to()`` does not move them)."""
    return [f"{p}.{k}" for p, m in gm.named_modules() for k, v in vars(m).items()
            if isinstance(v, torch.Tensor)]


def _assert_runs_on_fake_cuda(module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
    with torch.no_grad():
        ref = _outputs(module(*inputs))
    out = run_fake_cuda(module, inputs)
    assert [o.device.type for o in out] == ["cuda"] * len(ref)
    assert [(o.shape, o.dtype) for o in out] == [(r.shape, r.dtype) for r in ref]


def _assert_close(model: nn.Module, module: nn.Module, inputs: tuple[Any, ...],
                  rel: float) -> None:
    with torch.no_grad():
        for r, o in zip(_outputs(model(*inputs)), _outputs(module(*inputs)), strict=True):
            assert r.shape == o.shape and r.dtype == o.dtype
            assert float((r - o).abs().max()) <= rel * float(r.abs().max()) + 1e-6


def test_fake_cuda_sees_a_module_bound_to_the_cpu() -> None:
    """The helper is not vacuous: the exported module as torch gives it fails, portable runs."""
    model, x = Constants().eval(), torch.randn(2, 8)
    gm = torch.export.export(model, (x,)).module()
    with pytest.raises(Exception, match="(?i)device|fake"):
        run_fake_cuda(gm, (x,))
    done = make_portable(gm)
    gm.recompile()
    assert sorted(done["buffers"]) == ["lifted_tensor_0", "scale"]
    assert _plain_tensor_attrs(gm) == []
    _assert_runs_on_fake_cuda(gm, (x,))
    _assert_close(model, gm, (x,), 1e-6)


def test_cpu_module_reads_only_parameters_and_buffers() -> None:
    """On the CPU target too: every tensor the graph reads moves with ``.to()``, the module
    still matches the model, and moved to another device (meta) it runs there."""
    model, x = Constants().eval(), torch.randn(2, 8)
    # fp32: a host with native bf16 would pick bf16 for target "cpu"; compared at 1e-6
    opt = graphopt.optimize(model, (x,), target="cpu", precision="fp32", measure=False)
    assert isinstance(opt.module, OptimizedModule)
    gm = opt.module.graph_module
    assert _plain_tensor_attrs(gm) == []
    state = {n for n, _ in gm.named_parameters()} | {n for n, _ in gm.named_buffers()}
    assert {str(n.target) for n in gm.graph.nodes if n.op == "get_attr"} <= state
    assert not [n for n in gm.graph.nodes for a in (*n.args, *n.kwargs.values())
                if isinstance(a, torch.device)]  # no device left baked in
    _assert_close(model, opt.module, (x,), 1e-6)
    _assert_runs_on_fake_cuda(opt.module, (x,))
    # a real second device: .to() moves everything the graph reads
    on_meta = opt.module.to("meta")
    out = on_meta(x.to("meta"))
    assert out.device.type == "meta" and out.shape == model(x).shape


def _forced(model: nn.Module, inputs: tuple[torch.Tensor, ...], target: str
            ) -> graphopt.Optimized:
    return graphopt.optimize(model, inputs, target=target, precision="fp16", pad="always",
                             layout="channels_last")


@pytest.mark.parametrize("target", sorted(_GPU_TARGETS))
def test_padded_channels_last_fp16_runs_on_fake_cuda(target: str) -> None:
    """Padding (weights padded, per-call pads, index buffers), channels_last and fp16 casts:
    the edits the passes make follow the device as well."""
    torch.manual_seed(0)
    cases = {"nvidia_cnn": (NvidiaCNN().eval(), (torch.randn(2, 3, 8, 8),)),
             "token_cnn": (TokenCNN().eval(), (torch.randn(2, 3, 16, 16),)),
             **zoo()}
    applied = set()
    for name, (model, inputs) in cases.items():
        opt = _forced(model, inputs, target)
        applied |= set(opt.info.passes_applied)
        assert _plain_tensor_attrs(opt.module) == [], name
        _assert_close(model, opt.module, inputs, 5e-2)
        _assert_runs_on_fake_cuda(opt.module, inputs)
    assert {"padding", "layout", "precision"} <= applied


@functools.cache
def _zoo(name: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return build(name)


@pytest.mark.zoo
@pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                    reason="the zoo needs transformers")
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning",
                            "ignore::UserWarning")
@pytest.mark.parametrize("target", sorted(_GPU_TARGETS))
@pytest.mark.parametrize("name", [a.name for a in ARCHS])
def test_zoo_runs_on_fake_cuda(name: str, target: str) -> None:
    """Each zoo architecture, optimized with each GPU target's decisions, runs on CUDA."""
    model, inputs = _zoo(name)
    opt = graphopt.optimize(model, inputs, target=target)
    assert opt.info.compute_dtype == _GPU_TARGETS[target]
    assert isinstance(opt.module, OptimizedModule)
    assert isinstance(opt.module.graph_module, fx.GraphModule)
    assert _plain_tensor_attrs(opt.module) == []
    _assert_runs_on_fake_cuda(opt.module, inputs)


@pytest.mark.zoo
@pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                    reason="the zoo needs transformers")
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning",
                            "ignore::UserWarning")
def test_a_shape_range_module_runs_on_fake_cuda() -> None:
    """A shape range module's factory calls take symbolic sizes: they follow the device too,
    at every shape of the range."""
    model, inputs = _zoo("gpt2")
    batch, seq = torch.export.Dim("batch", min=1, max=4), torch.export.Dim("seq", min=4, max=32)
    opt = graphopt.optimize(model, inputs, target="h100", dynamic_shapes=({0: batch, 1: seq},))
    for shape in [(1, 4), (3, 20), (4, 32)]:
        _assert_runs_on_fake_cuda(opt.module, (torch.ones(shape, dtype=inputs[0].dtype),))
