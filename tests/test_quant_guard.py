"""The torch quantize pass's guard (``backends/torch/quant_guard.py``): it keeps the layer whose
low-bit error dominates in float and lowers the rest, declines when no set fits the budget,
and the optimized plan's memory section counts what was applied.
"""

from __future__ import annotations

import math

import torch
from torch import nn

import graphopt
from graphopt.backends.torch.quant_ops import QUANT_OPS
from graphopt.report import render_markdown

QUANTIZED = set(QUANT_OPS.values())


def _mlp(outlier: bool = False) -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(128, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(),
                      nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 64)).eval()
    if outlier:  # one input channel 300x the others: its 4-bit groups lose everything else
        with torch.no_grad():
            m[2].weight[:, 0] *= 300
    return m


def _lowered(opt: graphopt.Optimized) -> set[str]:
    return {n.name for n in opt.module.graph_module.graph.nodes if n.target in QUANTIZED}


X = torch.randn(8, 128, generator=torch.Generator().manual_seed(1))


def test_the_dominant_layer_stays_float_and_the_rest_are_lowered() -> None:
    model = _mlp(outlier=True)
    opt = graphopt.optimize(model, X, target="h100", quantize="int4", measure=False)
    sens = opt.info.guard[0].sensitivity
    top = sens.top[0]
    assert top.node == "linear_1" and top.kept and top.rank == 1
    assert top.share > 0.5 and 1 <= sens.kept < 4
    # the layer before it is amplified by its outlier channel: measured, it may be kept too
    assert _lowered(opt) == {r.node for r in sens.top if not r.kept}
    assert math.isclose(sum(r.share for r in sens.top), 1.0, rel_tol=1e-6)
    d = opt.plan.node("linear_1").decisions["quantize"]
    assert not d.applied and "among the most sensitive (rank 1 of 4)" in d.reason
    budget = opt.info.tolerance.rel_to_scale
    with torch.no_grad():
        ref, got = model(X), opt.module(X).float()
    assert (got - ref).abs().max() <= budget * ref.abs().max()
    assert "| 1 | `linear_1` | int4 |" in render_markdown(opt.plan)


def test_no_set_within_the_budget_declines_the_pass() -> None:
    model = _mlp()
    opt = graphopt.optimize(model, X, target="h100", quantize="fp8", tolerance=2e-3,
                            measure=False)
    assert not _lowered(opt) and "quantize" not in opt.info.passes_applied
    reverted = [r.reason for r in opt.info.passes_reverted if r.name == "quantize"]
    assert reverted and reverted[0].startswith("declined: the outputs leave the 0.002 budget")
    for name in ("linear", "linear_1", "linear_2", "linear_3"):
        d = opt.plan.node(name).decisions["quantize"]
        assert not d.applied and "declined" in d.reason
    assert "nothing lowered: declined" in render_markdown(opt.plan)


def test_the_memory_section_counts_the_formats_applied() -> None:
    model = _mlp(outlier=True)
    opt = graphopt.optimize(model, X, target="h100", quantize="int4", measure=False)
    lowered = _lowered(opt)
    want = 0
    for node, layer in zip(("linear", "linear_1", "linear_2", "linear_3"),
                           (model[0], model[2], model[4], model[6]), strict=True):
        weight_bits = 4 + 32 / 128 if node in lowered else 16  # int4 g128, else bf16
        # one format per node: a lowered node's bias counts as traced (fp32), 2 B too many
        bias_bytes = 4 if node in lowered else 2
        want += layer.weight.numel() * weight_bits / 8 + layer.bias.numel() * bias_bytes
    assert opt.plan.memory.param_bytes == want
    plain = graphopt.optimize(model, X, target="h100", quantize="none", measure=False)
    assert plain.plan.memory.param_bytes > want
