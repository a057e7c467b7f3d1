"""Issue 33, finding 4: the summary ranks what runs. ``costliest_nodes`` ranks each node by its
own unfused estimate; where the plan fuses nodes into one kernel, ``costliest_kernels`` ranks
the kernels at their fused times, a fusion group named by its nodes."""

from __future__ import annotations

from typing import Any

import torch

import graphopt


class _Block(torch.nn.Module):
    """Linear, then a pointwise chain the fusion rules merge into the GEMM's epilogue."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(256, 1024)
        self.out = torch.nn.Linear(1024, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.gelu(self.fc(x)) * 2.0 + 1.0
        return self.out(h)


def _plan() -> dict[str, Any]:
    with torch.no_grad():
        plan = graphopt.plan(_Block().eval(), (torch.randn(64, 256),), target="h100")
    return plan.to_dict()


def test_the_fused_ranking_names_each_group_at_its_fused_time() -> None:
    d = _plan()
    groups = {g["id"]: g for g in d["fusion"]["groups"]}
    assert groups, "the model must fuse nodes for this test to mean anything"
    kernels = d["summary"]["costliest_kernels"]
    fused = [k for k in kernels if k["fused"]]
    assert fused
    for k in fused:
        g = groups[k["kernel"]]
        assert k["nodes"] == g["nodes"] and k["est_time_s"] == g["est_time_s"]
        assert k["unfused_s"] == g["unfused_s"]
        named = k["name"].split("+")  # its nodes that compute (views left out)
        assert len(named) >= 2 and set(named) <= set(g["nodes"])
    times = [k["est_time_s"] for k in kernels]
    assert times == sorted(times, reverse=True)
    total = d["fusion"]["est_latency_fused_s"]
    assert abs(sum(k["share"] for k in kernels) - sum(times) / total) < 1e-9


def test_a_fused_node_is_ranked_inside_its_group_not_alone() -> None:
    d = _plan()
    group_of = d["fusion"]["group_of"]
    kernels = d["summary"]["costliest_kernels"]
    listed = {n for k in kernels for n in k["nodes"]}
    assert len(listed) == sum(len(k["nodes"]) for k in kernels)  # no node in two kernels
    for node in d["summary"]["costliest_nodes"]:
        if node["name"] in listed:
            kernel = next(k for k in kernels if node["name"] in k["nodes"])
            assert kernel["kernel"] == group_of[node["name"]]


def test_the_reports_show_the_fused_ranking_labelled_beside_the_unfused_one() -> None:
    with torch.no_grad():
        plan = graphopt.plan(_Block().eval(), (torch.randn(64, 256),), target="h100")
    top = plan.summary.costliest_kernels[0]
    md, page = plan.to_markdown(), plan.to_html()
    for text in (md, page):
        assert "Costliest kernels" in text and "Costliest nodes" in text
        assert top.name in text
    assert "Times are fused" in md and "Times are unfused" in md
    assert md.index("Costliest kernels") < md.index("Costliest nodes")
