"""The package's face (issue 20, item 5): what a user imports and calls from ``graphopt``.

No public function hides a module of the same name, ``dir()`` shows the lazily imported names,
the records a user handles are exported, ``optimize`` takes keyword inputs as
``torch.export.export`` does, and one default target serves every entry point.
"""

from __future__ import annotations

import importlib.util
import inspect

import pytest
import torch
from torch import nn

import graphopt
from graphopt.cli.main import build_parser
from graphopt.hardware.registry import DEFAULT_TARGET


def test_no_public_function_shadows_a_module() -> None:
    for name in graphopt.__all__:
        if callable(getattr(graphopt, name)) and not inspect.isclass(getattr(graphopt, name)):
            assert importlib.util.find_spec(f"graphopt.{name}") is None, name


def test_dir_lists_the_lazy_names_and_every_export_resolves() -> None:
    names = dir(graphopt)
    assert set(graphopt.__all__) <= set(names)
    for name in graphopt.__all__:
        assert getattr(graphopt, name) is not None


def test_the_records_a_user_handles_are_exported() -> None:
    from graphopt.hardware.profile import HardwareProfile
    from graphopt.ir.plan import PlanSet

    assert graphopt.PlanSet is PlanSet and graphopt.HardwareProfile is HardwareProfile
    both = graphopt.plan(nn.Linear(8, 8).eval(), torch.randn(2, 8), target="a100,h100")
    assert isinstance(both, graphopt.PlanSet)
    assert all(isinstance(p.target, graphopt.HardwareProfile) for p in both.plans)


def test_one_default_target_everywhere() -> None:
    for fn in (graphopt.plan, graphopt.optimize, graphopt.plan_llm):
        assert inspect.signature(fn).parameters["target"].default == DEFAULT_TARGET, fn
    parser = build_parser()
    for command in ("plan", "lint", "optimize", "llm", "cost"):
        argv = [command, "x.onnx", "-o", "y.onnx"] if command == "optimize" else (
            ["cost", "gemm", "8", "8", "8"] if command == "cost" else [command, "x.onnx"])
        assert parser.parse_args(argv).target == DEFAULT_TARGET, command
    # profile and calibrate measure this machine: theirs is its CPU
    assert inspect.signature(graphopt.profile).parameters["target"].default == "cpu"


class _Masked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        y = self.lin(x)
        if bias is not None:
            y = y + bias
        return y if mask is None else y * mask


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    mask = torch.ones(2, 8)
    mask[0] = 0
    return torch.randn(2, 8), mask


@pytest.mark.parametrize("how", ["kwargs", "dict"])
def test_optimize_takes_keyword_inputs_as_torch_export_does(how: str) -> None:
    model, (x, mask) = _Masked().eval(), _inputs()
    if how == "kwargs":  # torch.export.export(model, (x,), {"mask": mask})
        opt = graphopt.optimize(model, (x,), kwargs={"mask": mask}, target="cpu",
                                precision="fp32", measure=False)
    else:  # what graphopt.plan already took
        opt = graphopt.optimize(model, {"x": x, "mask": mask}, target="cpu",
                                precision="fp32", measure=False)
    want = model(x, mask=mask)
    torch.testing.assert_close(opt.module(x=x, mask=mask), want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(opt.module(x, None, mask), want, rtol=1e-6, atol=1e-6)
    assert not torch.equal(want, model(x))  # the mask really reached the graph


def test_keyword_inputs_that_do_not_fit_forward_are_a_clear_error() -> None:
    model, (x, mask) = _Masked().eval(), _inputs()
    with pytest.raises(graphopt.GraphoptError, match="do not match _Masked.forward"):
        graphopt.optimize(model, (x,), kwargs={"masks": mask}, target="cpu", measure=False)
    with pytest.raises(graphopt.GraphoptError, match="kwargs must be a dict"):
        graphopt.optimize(model, (x,), kwargs=[mask], target="cpu", measure=False)
