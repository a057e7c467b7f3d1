"""Issue 33, finding 4: the report agrees with itself. Its headline weights card shows the
formats the nodes get; where the model-level memory fit would allow a narrower format that the
nodes do not take, the card says so in one line (the demo's card said "FP8 (E4M3)" while every
node stayed bf16)."""

from __future__ import annotations

import torch

import graphopt


def test_the_weights_card_shows_what_the_nodes_get(tmp_path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 64)).eval()
    plan = graphopt.plan(model, (torch.randn(8, 64),), target="h100")
    assert plan.extra["quantization"]["format"] == "fp8_e4m3"  # the memory fit's pick
    formats = {n.decisions["precision"].fields["format"] for n in plan.nodes
               if n.op_type in ("Linear", "Gemm", "MatMul")}
    assert formats == {"bf16"}  # first and last weight GEMMs stay bf16
    plan.save(html=str(tmp_path / "p.html"))
    html = (tmp_path / "p.html").read_text()
    card = html[html.index("Weights (per node)"):][:600]
    assert "bf16" in card and "the memory fit alone would allow FP8 (E4M3)" in card
    assert "Recommended weights" not in html
