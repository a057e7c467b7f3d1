"""Fusion groups (issue 12 item 3): the kernels a runtime launches, costed by the bytes that
cross each group's boundary."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import graphopt
from graphopt.ir.plan_sections import FusionKind
from tests.zoo import RMSNormMLP, TransformerBlock

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


class LinearGelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(288, 700)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.fc(x))


def test_a_gemm_takes_its_epilogue_and_costs_its_boundary_bytes():
    p = graphopt.plan(LinearGelu().eval(), (torch.randn(64, 288),), target="h100")
    f = p.fusion
    (g,) = f.groups
    assert g.kind is FusionKind.EPILOGUE and g.nodes == ("linear", "gelu")
    # x, W and b in, the GELU's output out: the GEMM's own output never reaches DRAM
    assert g.external_bytes == 4 * (64 * 288 + 700 * 288 + 700 + 64 * 700)
    lin, gelu = p.node("linear"), p.node("gelu")
    assert g.unfused_s == pytest.approx(lin.cost.est_time_s + gelu.cost.est_time_s)
    memory = g.external_bytes / lin.cost.bandwidth_used
    want = max(lin.cost.compute_time_s + gelu.cost.compute_time_s, memory) + \
        lin.cost.overhead_s
    assert g.est_time_s == pytest.approx(want)
    assert p.summary.est_latency_fused_s == pytest.approx(want)
    assert p.summary.est_latency_s == pytest.approx(g.unfused_s)


def test_patterns_are_one_kernel_and_shared_results_are_not_fused():
    p = graphopt.plan(RMSNormMLP().eval(), (torch.randn(2, 16, 64),), target="h100")
    f = p.fusion
    kinds = {g.kind for g in f.groups}
    assert kinds == {FusionKind.PATTERN}  # the RMSNorm and the SwiGLU
    rms = next(g for g in f.groups if "rsqrt" in g.nodes)
    assert rms.est_time_s < rms.unfused_s
    # every node is in exactly one group, and a group of one costs what its node costs
    assert set(f.group_of) == {n.name for n in p.nodes}
    assert f.est_latency_fused_s < f.est_latency_unfused_s == pytest.approx(p.est_latency_s)
    block = graphopt.plan(TransformerBlock().eval(), (torch.randn(2, 16, 288),), "h100")
    group_of = block.fusion.group_of
    # the residual `add` is read by the next LayerNorm and by the second residual add: it is
    # written once to memory, so it does not fuse into its reader
    assert group_of["add"] != group_of["layer_norm_1"]
    assert group_of["linear_3"] == group_of["add_1"]  # residual add as the GEMM's epilogue


def test_reports_show_the_fused_estimate():
    p = graphopt.plan(RMSNormMLP().eval(), (torch.randn(2, 16, 64),), target="a100")
    md = p.to_markdown()
    assert "## Fusion groups" in md and "| k0 | pattern |" in md
    assert "Fusion groups" in p.to_html()
    assert p.to_dict()["summary"]["est_latency_fused_s"] > 0


def test_each_node_carries_its_group_in_json_markdown_and_html():
    from graphopt.report._html_data import TFIELDS
    from tests.report_plans import embedded_data

    p = graphopt.plan(LinearGelu().eval(), (torch.randn(64, 288),), target="h100")
    d = p.to_dict()
    group_of = d["fusion"]["group_of"]
    assert {n["name"]: n["fusion_group"] for n in d["nodes"]} == group_of
    assert group_of["linear"] == group_of["gelu"] == "k0"
    md = p.to_markdown()
    head = next(line for line in md.splitlines() if line.startswith("| node |"))
    assert "| fusion group | decisions |" in head
    row = next(line for line in md.splitlines() if line.startswith("| `linear` |"))
    assert "| k0 epilogue ×2 |" in row
    data = embedded_data(p.to_html())
    g = TFIELDS.index("fusion_group")
    assert {r[0]: r[-1][0][g] for r in data["rows"]} == {"linear": "k0 epilogue ×2",
                                                         "gelu": "k0 epilogue ×2"}


def test_a_node_alone_has_no_label_and_an_unfused_plan_no_field():
    from graphopt.decisions.planner import build_plan
    from graphopt.frontends.torch_frontend import trace_torch

    block = graphopt.plan(TransformerBlock().eval(), (torch.randn(2, 16, 288),), "h100")
    f = block.fusion
    alone = set(f.group_of) - {n for g in f.groups for n in g.nodes}
    assert alone
    rows = {line.split(" | ")[0][3:-1]: line for line in block.to_markdown().splitlines()
            if line.startswith("| `")}
    shown = alone & set(rows)
    assert shown and all("| — |" in rows[n] for n in shown)
    # a plan built without decisions has no fusion section, so its nodes carry no group
    bare = build_plan(trace_torch(LinearGelu().eval(), (torch.randn(4, 288),)), block.target,
                      decisions=False)
    assert all("fusion_group" not in n for n in bare.to_dict()["nodes"])
