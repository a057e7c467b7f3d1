"""Hypothesis-generated random architectures with odd widths: optimized == original.

Each example builds a random conv stack (odd channel counts, groups, BN, activations with
f(0) != 0 among them, residual adds, pooling) followed by a random MLP head (odd widths,
LayerNorm, dropout), then optimizes it with every fp32 rewrite forced on (pad="always",
layout="channels_last") and compares outputs at fp32 tolerance. CI runs hundreds of examples
(``CI`` set); a local run a few dozen.
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import graphopt

EXAMPLES = 200 if os.environ.get("CI") else 25
ACTS = {"relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU, "sigmoid": nn.Sigmoid,
        "tanh": nn.Tanh, "identity": nn.Identity}


class ConvBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, groups: int, bn: bool, act: str,
                 residual: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, 3, padding=1, groups=groups)
        self.bn = nn.BatchNorm2d(c_out) if bn else nn.Identity()
        self.act = ACTS[act]()
        self.residual = residual and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.act(self.bn(self.conv(x)))
        return x + y if self.residual else y


class RandomNet(nn.Module):
    def __init__(self, convs: list[dict], head: list[int], layer_norm: bool, pool: str) -> None:
        super().__init__()
        blocks, c = [], 3
        for spec in convs:
            blocks.append(ConvBlock(c, spec["c_out"], spec["groups"], spec["bn"], spec["act"],
                                    spec["residual"]))
            c = spec["c_out"]
        self.convs = nn.Sequential(*blocks)
        self.pool = pool
        layers: list[nn.Module] = []
        for width in head:
            layers += [nn.Linear(c, width), nn.GELU(), nn.Dropout(0.2)]
            c = width
        if layer_norm:
            layers.append(nn.LayerNorm(c))
        layers.append(nn.Linear(c, 5))
        self.head = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.convs(x)
        x = x.mean(dim=(2, 3)) if self.pool == "mean" else torch.amax(x, dim=(2, 3))
        return self.head(x)


@st.composite
def conv_spec(draw, c_in: int) -> dict:
    c_out = draw(st.integers(3, 40))
    divisors = [g for g in range(1, min(c_in, c_out) + 1) if c_in % g == 0 and c_out % g == 0]
    return {"c_out": c_out, "groups": draw(st.sampled_from(divisors)),
            "bn": draw(st.booleans()), "act": draw(st.sampled_from(sorted(ACTS))),
            "residual": draw(st.booleans())}


@st.composite
def architectures(draw):
    convs, c = [], 3
    for _ in range(draw(st.integers(1, 3))):
        spec = draw(conv_spec(c))
        if draw(st.booleans()):  # sometimes keep the width so residual adds happen
            spec = {**spec, "c_out": c, "groups": 1}
        convs.append(spec)
        c = spec["c_out"]
    head = draw(st.lists(st.integers(3, 70), min_size=0, max_size=2))
    return convs, head, draw(st.booleans()), draw(st.sampled_from(["mean", "max"]))


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(arch=architectures(), target=st.sampled_from(["h100", "a100", "cpu"]),
       seed=st.integers(0, 2**16))
def test_random_architecture_fp32_rewrites_are_exact(arch, target, seed):
    convs, head, layer_norm, pool = arch
    torch.manual_seed(seed)
    model = RandomNet(convs, head, layer_norm, pool).eval()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    x = torch.randn(2, 3, 9, 9)
    opt = graphopt.optimize(model, (x,), target=target, precision="fp32", pad="always",
                            layout="channels_last")
    with torch.no_grad():
        ref, out = model(x), opt.module(x)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    scale = float(ref.abs().max())
    assert float((ref - out).abs().max()) <= 1e-5 * scale + 1e-12


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_random_architecture_reduced_precision_within_tolerance(precision):
    torch.manual_seed(1)
    model = RandomNet([{"c_out": 13, "groups": 1, "bn": True, "act": "silu", "residual": False},
                       {"c_out": 13, "groups": 1, "bn": True, "act": "relu", "residual": True}],
                      [37], True, "mean").eval()
    x = torch.randn(4, 3, 16, 16)
    opt = graphopt.optimize(model, (x,), target="h100", precision=precision)
    assert opt.info.compute_dtype == precision
    assert all(n["within"] for n in opt.numerics)
