"""``repr(plan)`` is a summary a user reads at the prompt (issue 35, item 4): model, target,
estimate, bound and the top decisions, under 2,000 characters, whatever the model's size."""

from __future__ import annotations

import torch
from torch import nn

import graphopt


class _Deep(nn.Module):
    """Many nodes with long names: the old repr printed every one of them."""

    def __init__(self, depth: int = 120) -> None:
        super().__init__()
        self.layers_with_a_rather_long_name_to_make_the_repr_grow = nn.ModuleList(
            nn.Linear(64, 64) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers_with_a_rather_long_name_to_make_the_repr_grow:
            x = torch.relu(layer(x))
        return x


def test_repr_is_a_short_summary() -> None:
    plan = graphopt.plan(_Deep().eval(), (torch.randn(8, 64),), target="h100")
    text = repr(plan)
    assert len(text) < 2000, len(text)
    assert len(plan.nodes) > 200  # the dataclass repr of this plan runs to hundreds of kB
    for part in ("_Deep", "h100-sxm", "NVIDIA H100", "est. ", "-bound", "decisions: precision",
                 "costliest: "):
        assert part in text, part
    assert str(plan) == text


def test_a_plan_set_repr_has_one_line_per_target() -> None:
    plans = graphopt.plan(_Deep(4).eval(), (torch.randn(8, 64),), target="a100,h100,b200")
    text = repr(plans)
    assert len(text) < 2000 and text.count("\n") == 3
    for name in ("a100-80gb", "h100-sxm", "b200"):
        assert f"  {name}: est. " in text
