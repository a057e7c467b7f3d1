"""Errors that keep the cause (issue 24, item 8): when torch.export rejects the user's
``dynamic_shapes`` and the make_fx fallback runs, torch's own reason (what is wrong with the
spec's structure) comes first in the plan's warnings, in the CLI's output and in optimize's
error, which has no plan to point to."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

import graphopt
from graphopt.cli.main import main
from graphopt.errors import GraphoptError

_TORCH_SAYS = "Detected mismatch between the structure of `inputs` and `dynamic_shapes`"


class StarArgs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.fc(args[0])


def _spec() -> tuple[dict[int, object], ...]:
    return ({0: torch.export.Dim("b"), 1: torch.export.Dim("s")},)  # one entry per input


def test_plan_warnings_lead_with_torchs_reason() -> None:
    plan = graphopt.plan(StarArgs().eval(), (torch.randn(2, 3, 8),), dynamic_shapes=_spec())
    first = plan.warnings[0]
    assert first.startswith("torch.export rejected dynamic_shapes: UserError: " + _TORCH_SAYS)
    assert "forward takes *args" in first and "(({0: batch, 1: seq},),)" in first
    assert first.index(_TORCH_SAYS) < first.index("make_fx")


def test_plan_warning_leads_in_training_mode_too() -> None:
    plan = graphopt.plan(StarArgs(), (torch.randn(2, 3, 8),), dynamic_shapes=_spec())
    assert _TORCH_SAYS in plan.warnings[0] and "training mode" in plan.warnings[1]


def test_suggested_spec_is_one_torch_export_takes() -> None:
    b, s = torch.export.Dim("b"), torch.export.Dim("s")
    plan = graphopt.plan(StarArgs().eval(), (torch.randn(2, 3, 8),),
                         dynamic_shapes=(({0: b, 1: s},),))
    assert not any("make_fx" in w for w in plan.warnings), plan.warnings


def test_optimize_error_names_torchs_reason() -> None:
    with pytest.raises(GraphoptError) as e:
        graphopt.optimize(StarArgs().eval(), (torch.randn(2, 3, 8),), target="cpu",
                          measure=False, dynamic_shapes=_spec())
    msg = str(e.value)
    assert _TORCH_SAYS in msg and msg.index(_TORCH_SAYS) < msg.index("only traced by make_fx")


def test_other_export_failures_keep_the_old_wording() -> None:
    class DataDependent(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + 1 if x.sum() > 0 else x - 1

    plan = graphopt.plan(DataDependent().eval(), (torch.ones(2),))
    assert plan.warnings[0].startswith("torch.export failed (")


def test_cli_prints_torchs_reason_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                        ) -> None:
    spec = tmp_path / "model.py"
    spec.write_text(textwrap.dedent("""
        import torch
        from torch import nn

        class StarArgs(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 8)

            def forward(self, *args):
                return self.fc(args[0])

        def build():
            b, s = torch.export.Dim("b"), torch.export.Dim("s")
            return StarArgs().eval(), (torch.randn(2, 3, 8),), ({0: b, 1: s},)
    """))
    assert main(["plan", f"{spec}:build", "--target", "a100"]) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert lines[0].startswith("warning: torch.export rejected dynamic_shapes: UserError: "
                               + _TORCH_SAYS), out
