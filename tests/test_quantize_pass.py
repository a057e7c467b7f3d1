"""Dynamic INT8 Linear on the host CPU: where it applies, where it must not, and its error."""

from __future__ import annotations

import contextlib
import types

import pytest
import torch

import graphopt
from graphopt.decisions.precision.format import choose_precision
from graphopt.decisions.quantization.cpu_int8 import int8_pays_on_cpu
from graphopt.hardware import get_target
from tests.hostisa import host_isa


def _mlp() -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(),
                            torch.nn.Linear(512, 512), torch.nn.GELU(),
                            torch.nn.Linear(512, 128)).eval()
    return m, (torch.randn(32, 256),)


def _quantized(opt) -> list[str]:
    return [n.name for n in opt.plan.nodes
            if "quantize" in n.decisions and n.decisions["quantize"].applied]


def test_forced_int8_on_host_cpu_is_within_int8_tolerance():
    model, x = _mlp()
    opt = graphopt.optimize(model, x, target="cpu", precision="fp32", quantize="int8")
    assert len(_quantized(opt)) == 3
    assert "quantize" in opt.info.passes_applied
    assert opt.info.tolerance.rel_to_scale == 5e-2
    with torch.no_grad():
        ref, out = model(*x), opt.module(*x)
    rel = float((ref - out).abs().max() / ref.abs().max())
    assert 0 < rel <= 5e-2  # lossy, but within the stated budget
    cos = torch.nn.functional.cosine_similarity(ref.flatten(), out.flatten(), dim=0)
    assert float(cos) >= 0.999


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_int8_linear_layers_match_fp32_and_leave_the_model_alone(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 32)).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(16, 64)
    opt = graphopt.optimize(model, (x,), target="cpu", precision="fp32", quantize="int8",
                            measure=False)
    quantized = [n for n in opt.plan.nodes
                 if "quantize" in n.decisions and n.decisions["quantize"].applied]
    assert len(quantized) == 2
    assert all(n.decisions["quantize"].detail.format == "int8" for n in quantized)
    assert type(model[0]) is torch.nn.Linear and type(model[2]) is torch.nn.Linear
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with torch.no_grad():
        ref, got = model(x), opt.module(x)
    # Tolerance: int8 weights (per channel, step 2max|w_c|/255) and 7-bit activations
    # (reduce_range) each add a uniform rounding error of step/sqrt(12); with data ranges ~6
    # sigma that is at most ~0.7 % and ~1.4 % RMS per layer, ~2 % over two layers.
    rel = float((got - ref).norm() / ref.norm())
    assert 0 < rel < 0.03


def test_int8_without_the_quantized_kernel_is_not_applied_and_says_why(monkeypatch):
    """A torch build without ``quantized::linear_dynamic``: nothing changes, the plan says why."""
    model, x = _mlp()
    monkeypatch.setattr(torch.ops, "quantized", types.SimpleNamespace())
    opt = graphopt.optimize(model, x, target="cpu", precision="fp32", quantize="int8",
                            measure=False)
    assert _quantized(opt) == []
    reasons = [n.decisions["quantize"].reason for n in opt.plan.nodes
               if "quantize" in n.decisions]
    assert len(reasons) == 3 and all("no quantized::linear_dynamic kernel" in r for r in reasons)


@pytest.mark.parametrize("isa", [None, "epyc-7763", "xeon-8380", "xeon-8480"],
                         ids=["this-host", "as-zen3-avx2", "as-icelake-vnni", "as-spr-amx"])
def test_auto_applies_exactly_the_plans_int8_linears(isa):
    """Every outcome on every machine: the host as detected, and the host with a stand-in ISA
    on each int8 path (AVX2 u8s8, VNNI, AMX with native bf16). Which nodes pay depends on the
    host's cores and clock (tests/test_int8_by_cost.py pins sizes whose answer does not); here
    the pass must apply exactly the plan's INT8 Linears, whatever the carrier, and the result
    stays within the int8 tolerance. The cost model alone: nothing is timed."""
    model, x = _mlp()
    with host_isa(isa) if isa else contextlib.nullcontext():
        opt = graphopt.optimize(model, x, target="cpu", measure=False)
        plan = graphopt.plan(model, x, target="cpu")  # the planner's decisions, before passes
        host = get_target("cpu")
        fmt, _ = choose_precision(host, "auto")
    if isa is not None:
        assert int8_pays_on_cpu(host)[0]  # every stand-in has an int8 path
        assert fmt == ("bf16" if isa == "xeon-8480" else "fp32")
    planned = [n.name for n in plan.nodes
               if n.decisions.get("precision") is not None
               and n.decisions["precision"].detail.format == "int8"]
    assert _quantized(opt) == planned
    edges = {n.name: n.decisions["precision"].detail.edge for n in plan.nodes
             if n.name in planned}
    assert {edges.get("linear"), edges.get("linear_2")} <= {"first", "last", None}
    assert edges.get("linear") in (None, "first") and edges.get("linear_2") in (None, "last")
    for n in opt.plan.nodes:
        if n.name in planned:
            reason = n.decisions["quantize"].reason
            assert "INT8 (" in reason and f" vs {fmt} " in reason
    with torch.no_grad():
        ref, out = model(*x), opt.module(*x)
    rel = float((ref - out).abs().max() / ref.abs().max())
    assert rel <= opt.info.tolerance.rel_to_scale


def test_not_applied_off_the_host():
    """Another machine's CPU: quantized::linear_dynamic's numbers are this CPU's, not its
    (a GPU target gets W8A8 on its int8 tensor cores: tests/test_torch_quantize_models.py)."""
    model, x = _mlp()
    opt = graphopt.optimize(model, x, target="xeon-8480", precision="fp32", quantize="int8")
    assert _quantized(opt) == []
    reasons = [n.decisions["quantize"].reason for n in opt.plan.nodes
               if "quantize" in n.decisions]
    assert reasons and all("host CPU" in r for r in reasons)


def test_none_disables_it():
    model, x = _mlp()
    opt = graphopt.optimize(model, x, target="cpu", quantize="none")
    assert _quantized(opt) == [] and "quantize" not in opt.info.passes_applied


def test_measured_guard_reverts_a_slower_pass(monkeypatch):
    """On the host target, an auto pass that measures slower is reverted with the timing."""
    from graphopt.backends.torch import pipeline

    torch.manual_seed(0)  # 2048-wide at 512 rows: INT8 pays by cost on any core count
    model = torch.nn.Sequential(torch.nn.Linear(256, 2048), torch.nn.GELU(),
                                torch.nn.Linear(2048, 2048), torch.nn.GELU(),
                                torch.nn.Linear(2048, 128)).eval()
    x = (torch.randn(512, 256),)
    monkeypatch.setattr(pipeline, "faster_or_equal", lambda before, after, args: (False, 1e-3,
                                                                                   2e-3))
    with host_isa("xeon-8380"):  # VNNI and fp32: the cost model proposes INT8 for all three
        assert [n.name for n in graphopt.plan(model, x, target="cpu").nodes
                if n.decisions["precision"].detail.format == "int8"] == [
                    "linear", "linear_1", "linear_2"]
        opt = graphopt.optimize(model, x, target="cpu", quantize="auto", measure=True)
    assert _quantized(opt) == []
    assert any("measured slower" in r.reason for r in opt.info.passes_reverted)


def test_the_ends_are_retried_out_when_the_whole_int8_set_leaves_tolerance():
    """The plan puts the first and last GEMMs at INT8 too (marked ``edge``). With a budget
    just under the whole set's measured error, the whole set is reverted and the torch
    backend's second try, without the ends, is kept (the middle GEMM alone errs less); the
    ends' decisions say why they stayed float."""
    model, x = _mlp()
    with host_isa("xeon-8380"):
        plan = graphopt.plan(model, x, target="cpu")
        whole = graphopt.optimize(model, x, target="cpu", measure=False, tolerance=0.5)
        (n,) = whole.info.numerics
        retried = graphopt.optimize(model, x, target="cpu", measure=False,
                                    tolerance=0.99 * n.max_abs / n.scale)
    edges = {n.name: n.decisions["precision"].detail.edge for n in plan.nodes
             if n.name in ("linear", "linear_1", "linear_2")}
    assert edges == {"linear": "first", "linear_1": None, "linear_2": "last"}
    assert _quantized(whole) == ["linear", "linear_1", "linear_2"]
    assert _quantized(retried) == ["linear_1"]
    assert "quantize_without_ends" in retried.info.passes_applied
    assert "quantize" in [r.name for r in retried.info.passes_reverted]
    assert all(c.within for c in retried.info.numerics)
    for name in ("linear", "linear_2"):
        d = next(n for n in retried.plan.nodes if n.name == name).decisions["quantize"]
        assert not d.applied and "out of tolerance" in d.reason
