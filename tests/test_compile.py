"""``torch.compile(opt.module)`` stays equal to the model (issue 11 item 4), and the compile
mode the plan favours shows in the runtime settings and every report.

The compile tests use inductor when a C++ compiler is on PATH (inductor's CPU backend builds C++
kernels with it; this machine and CI's Debian image have g++); without one, ``aot_eager``
(the same Dynamo capture and AOT autograd, no code generation) still checks that the module
compiles. A tiny model keeps each compile to seconds.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from torch import nn

import graphopt
from graphopt.decisions.memory_runtime.compile_mode import compile_mode
from graphopt.hardware import get_target

BACKEND = "inductor" if shutil.which("c++") or shutil.which("g++") else "aot_eager"


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


def _model() -> nn.Module:
    torch.manual_seed(0)
    m = Tiny().eval()
    with torch.no_grad():  # a BatchNorm with real statistics, so folding it changes weights
        m.bn.running_mean.uniform_(-0.5, 0.5)
        m.bn.running_var.uniform_(0.5, 2.0)
    return m


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_compiled_module_equals_model() -> None:
    m = _model()
    x = torch.randn(2, 3, 8, 8)
    # fp32: on a host with native bf16, target "cpu" picks bf16; compared here at 1e-5
    opt = graphopt.optimize(m, x, target="cpu", precision="fp32", measure=False)
    assert "cleanup" in opt.info.passes_applied  # a rewritten graph, not the model itself
    compiled = torch.compile(opt.module, backend=BACKEND)
    with torch.no_grad():
        _close(compiled(x), m(x))
        x2 = torch.randn(2, 3, 8, 8)
        _close(compiled(x2), m(x2))
    with pytest.raises(graphopt.GraphoptError, match="built for inputs of shapes"):
        compiled(torch.randn(3, 3, 8, 8))  # the shape check compiles with the graph


@pytest.mark.slow
@pytest.mark.parametrize("dynamic", [None, True])
def test_compiled_range_module_equals_model(dynamic: bool | None) -> None:
    m = _model()
    batch = torch.export.Dim("batch", min=1, max=16)
    opt = graphopt.optimize(m, torch.randn(4, 3, 8, 8), target="cpu", precision="fp32",
                            measure=False, dynamic_shapes=({0: batch},))
    compiled = torch.compile(opt.module, backend=BACKEND, dynamic=dynamic)
    with torch.no_grad():
        for b in (1, 4, 7, 16):
            x = torch.randn(b, 3, 8, 8)
            _close(compiled(x), m(x))
    with pytest.raises(graphopt.GraphoptError, match=r"batch in \[1, 16\]"):
        compiled(torch.randn(17, 3, 8, 8))


# --- the mode the plan favours ------------------------------------------------------------------
def test_compile_mode_rules() -> None:
    h100, cpu = get_target("h100"), get_target("cpu")
    launch = {"compute": 1e-6, "memory": 1e-6, "latency": 8e-6}
    gemm = {"compute": 9e-3, "memory": 1e-3, "latency": 1e-5}
    mixed = {"compute": 4e-3, "memory": 5e-3, "latency": 1e-3}
    assert compile_mode(cpu, launch).value == "default"  # rule 1: no CUDA graphs on a CPU
    assert "CUDA-only" in compile_mode(cpu, launch).reason
    got = compile_mode(h100, launch)
    assert got.value == "reduce-overhead" and "80%" in got.reason
    assert "per distinct shape" in compile_mode(h100, launch, dynamic=True).reason
    assert "per distinct shape" not in got.reason
    assert compile_mode(h100, gemm).value == "max-autotune"
    assert compile_mode(h100, mixed).value == "default"
    assert compile_mode(h100, {}).value == "default"


def test_compile_mode_in_plan_and_reports() -> None:
    # a handful of tiny GEMMs: on an H100 each is a ~us launch, so latency dominates
    p = graphopt.plan(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)).eval(),
                      torch.randn(2, 8), target="h100")
    times = p.summary.time_by_bottleneck_s
    assert times["latency"] > sum(times.values()) / 2
    rt = p.to_dict()["runtime_settings"]
    assert rt["compile_mode"]["value"] == "reduce-overhead"
    assert "launch-bound" in rt["compile_mode"]["reason"]
    assert "compile_mode" in p.to_markdown() and "reduce-overhead" in p.to_markdown()
    assert "reduce-overhead" in p.to_html()
    cpu = graphopt.plan(nn.Linear(8, 8).eval(), torch.randn(2, 8), target="cpu")
    assert cpu.to_dict()["runtime_settings"]["compile_mode"]["value"] == "default"


@pytest.mark.slow
def test_optimized_runtime_settings_carry_compile_mode() -> None:
    opt = graphopt.optimize(_model(), torch.randn(2, 3, 8, 8), target="h100", measure=False)
    mode = opt.runtime_settings.compile_mode
    assert mode.value in ("default", "reduce-overhead", "max-autotune") and mode.reason
    assert opt.plan.to_dict()["runtime_settings"]["compile_mode"]["value"] == mode.value
