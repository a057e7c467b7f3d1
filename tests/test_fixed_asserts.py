"""Export's dtype checks (``aten._assert_tensor_metadata``) on tensors whose dtype cannot change
are dropped from the optimized module; checks on tensors that follow an input's dtype stay."""

from __future__ import annotations

import torch
from torch import fx, nn

import graphopt
from graphopt.backends.torch.asserts import drop_fixed_asserts

_ASSERT = torch.ops.aten._assert_tensor_metadata.default
#: a pinned CPU and fp32: on a host with native bf16, "cpu" would pick bf16 and change numbers
PINNED = {"target": "epyc-7763", "precision": "fp32", "measure": False}


class FollowsInput(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * 2).to(torch.float32) + 1  # already fp32: export checks x * 2's dtype


class Fixed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(16, 8)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids)  # the weight's dtype, whatever the indices
        mask = (ids > 3).to(torch.bool)  # a comparison: bool
        return (h * 2).to(torch.float32) * mask.unsqueeze(-1)


def _asserts(gm: fx.GraphModule) -> int:
    return sum(n.target is _ASSERT for n in gm.graph.nodes)


def _exported(model: nn.Module, *args: torch.Tensor) -> fx.GraphModule:
    return torch.export.export(model, args).module()


def test_checks_on_fixed_dtypes_are_dropped_and_the_numbers_kept():
    ids = torch.randint(0, 16, (2, 5), generator=torch.Generator().manual_seed(0))
    gm = _exported(Fixed().eval(), ids)
    before = _asserts(gm)
    assert before >= 2
    assert drop_fixed_asserts(gm) == before and _asserts(gm) == 0
    model = Fixed().eval()
    opt = graphopt.optimize(model, (ids,), **PINNED)
    assert _asserts(opt.module.graph_module) == 0
    with torch.no_grad():
        torch.testing.assert_close(opt.module(ids), model(ids), rtol=0, atol=0)


def test_a_check_on_a_tensor_that_follows_an_input_stays():
    x = torch.randn(3, 4)
    gm = _exported(FollowsInput(), x)
    assert _asserts(gm) == 1
    assert drop_fixed_asserts(gm) == 0 and _asserts(gm) == 1
    opt = graphopt.optimize(FollowsInput().eval(), (x,), **PINNED)
    assert _asserts(opt.module.graph_module) == 1
    torch.testing.assert_close(opt.module(x), FollowsInput()(x), rtol=0, atol=0)
