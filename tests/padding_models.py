"""Helpers and models shared by the padding tests (test_padding.py, test_padding_carry.py).

``run_pass`` runs the padding pass alone and checks the padded module against the original in
fp32; ``pad``/``slices``/``ops`` read its decisions, notes and graph.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import fx, nn

from graphopt.backends.torch.context import RewriteContext
from graphopt.backends.torch.fx_utils import aten_name
from graphopt.backends.torch.padding import pad_channels
from graphopt.backends.torch.pipeline import prepare
from graphopt.backends.torch.verify import compare_outputs
from graphopt.decisions.tolerance import tolerance_for
from graphopt.ir.options import Options
from graphopt.ir.plan import Decision


def run_pass(model: nn.Module, inputs: tuple[torch.Tensor, ...], *, target: str = "a100",
             dtype: str = "fp16", pad: str = "always"
             ) -> tuple[fx.GraphModule, RewriteContext, bool]:
    torch.manual_seed(0)
    gm, ctx = prepare(model.eval(), inputs, target, Options(pad=pad))  # type: ignore
    ctx.compute_dtype = dtype
    changed = pad_channels(gm, ctx)
    assert_same(model, gm, inputs)
    return gm, ctx, changed


def assert_same(model: nn.Module, gm: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
    with torch.no_grad():
        result = compare_outputs(model(*inputs), gm(*inputs), tolerance_for("fp32"))
    assert all(c.within for c in result), [c.describe() for c in result]


def pad(ctx: RewriteContext, name: str, kind: str = "padding") -> Decision:
    """The GEMM's own decision (``padding``), a carry (``padding_carry``) or a slice."""
    return ctx.decisions[name][kind]


def ops(gm: fx.GraphModule) -> list[str]:
    return [aten_name(n) or n.op for n in gm.graph.nodes]


def slices(ctx: RewriteContext) -> list[tuple[str, int, int]]:
    return [(s["node"], s["real"], s["padded"]) for s in ctx.notes["padding"]["slices"]]


def seeded(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(1))


def randomize_bn(bn: nn.BatchNorm2d) -> nn.BatchNorm2d:
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-1, 1)
    return bn


class NvidiaCNN(nn.Module):
    """NVIDIA's tensor-core guide example: Conv 3->67, Conv 67->129, Linear 129->251."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 67, 3, padding=1), nn.Conv2d(67, 129, 3, padding=1)
        self.fc = nn.Linear(129, 251)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.c2(F.relu(self.c1(x))))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


class TokenCNN(nn.Module):
    """The same channels, at sizes where every GEMM is compute-bound: 7x7 stem, per-pixel FC."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 67, 7, padding=3), nn.Conv2d(67, 129, 3, padding=1)
        self.fc = nn.Linear(129, 251)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.c2(F.max_pool2d(F.relu(self.c1(x)), 4)))
        return self.fc(x.flatten(2).transpose(1, 2))


NVIDIA_DIMS = {"conv2d": {"C_in": 8, "C_out": 72}, "conv2d_1": {"C_in": 72, "C_out": 136},
               "linear": {"K": 136, "N": 256}}


class LinearLayerNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.ln = nn.Linear(64, 67), nn.LayerNorm(67)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(F.gelu(self.fc(x)))
