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
    assert plan.quantization.format == "fp8_e4m3"  # the memory fit's pick
    formats = {n.decisions["precision"].detail.format for n in plan.nodes
               if n.op_type in ("Linear", "Gemm", "MatMul")}
    assert formats == {"bf16"}  # first and last weight GEMMs stay bf16
    plan.save(html=str(tmp_path / "p.html"))
    html = (tmp_path / "p.html").read_text()
    card = html[html.index("Weights (per node)"):][:600]
    assert "bf16" in card and "the memory fit alone would allow FP8 (E4M3)" in card
    assert "Recommended weights" not in html


def test_lint_gives_the_fix_optimize_makes() -> None:
    """Issue 33, finding 5: lint told the user to pad a stem conv's 3 input channels and a
    Linear's K 251 -> 256 while optimize kept them; now its fix is the padding and layout
    deciders' own answer, applied or declined with their reason."""
    from graphopt.decisions.lint import lint

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.stem, self.fc = torch.nn.Conv2d(3, 30, 3, padding=1), torch.nn.Linear(251, 250)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return self.stem(x), self.fc(y)

    args = (torch.randn(8, 3, 32, 32), torch.randn(64, 251))
    plan = graphopt.plan(Net().eval(), args, target="a100")
    fixes = {(i.rule, i.node): i.fix for i in lint(plan)}
    for node in plan.nodes:
        for kind, rule in (("padding", "TC001"), ("layout", "TC005")):
            decision = node.decisions.get(kind)
            if decision is None or (rule, node.name) not in fixes:
                continue
            said = fixes[(rule, node.name)]
            assert ("applies it" in said) == decision.applied, (said, decision.reason)
            assert decision.reason.removeprefix("not applied: ")[:40] in said
    assert any(r == "TC001" for r, _ in fixes)


def test_a_formats_note_names_the_format_it_is_about() -> None:
    """Issue 33, finding 4: the formats table said "NVIDIA H100 SXM5 80GB has bf16" on the int4
    row; each note now names its own format."""
    from graphopt.decisions.quant_formats import get_format, runs_natively
    from graphopt.hardware import get_target

    h100 = get_target("h100")
    for name in ("int4", "fp8", "int8", "int8_weight_only", "q4_k_m"):
        fmt = get_format(name)
        ok, note = runs_natively(fmt, h100)
        assert ok and fmt.display in note, (name, note)
