"""Diffusion models (diffusers, tiny random-weight configs) through every graphopt capability.

Each model of ``tests/diffusers_zoo.py`` (UNet, VAE, DiT, SD3, Flux, ControlNet) is planned for
an H100 with no op left ``other``, optimized for this CPU and for an H100 (the H100 module run
on fake CUDA tensors, ``tests/fake_cuda``), optimized over a batch range and compared at other
batch sizes, exported to ONNX and run in ONNX Runtime, and saved and loaded in a process that
never imports diffusers; every result is compared numerically with the original model on the
same inputs. Marked ``zoo``, as ``tests/test_architectures.py`` is: ``make test-quick`` skips it.
"""

from __future__ import annotations

import functools
import inspect
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.export import Dim

import graphopt
from graphopt.backends.torch.optimized_module import OptimizedModule
from tests.fake_cuda import run_fake_cuda
from tests.test_architectures import ONNX_FP32_RTOL, WIDEST_RTOL, _within

pytest.importorskip("diffusers")

from tests.diffusers_zoo import BATCH, DIFFUSERS, build  # noqa: E402 - needs diffusers

pytestmark = [pytest.mark.zoo,
              pytest.mark.filterwarnings("ignore::DeprecationWarning",
                                         "ignore::FutureWarning", "ignore::UserWarning")]

NAMES = [a.name for a in DIFFUSERS]


@functools.cache
def _model(name: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], torch.Tensor]:
    """The model, its inputs and its output, built once per session."""
    model, inputs = build(name)
    with torch.no_grad():
        out = model(*inputs)
    return model, inputs, out


@functools.cache
def _optimized(name: str, target: str) -> graphopt.Optimized:
    model, inputs, _ = _model(name)
    return graphopt.optimize(model, inputs, target=target, measure=False)


def _assert_matches(name: str, opt: graphopt.Optimized, inputs: tuple[torch.Tensor, ...],
                    ref: torch.Tensor) -> None:
    """The optimized module within the tolerance it states, and that one is a real one."""
    assert opt.numerics and all(n["within"] for n in opt.numerics), opt.numerics
    tol = opt.numerics[0]["tolerance"]
    assert tol["rel_to_scale"] <= WIDEST_RTOL
    with torch.no_grad():
        out = opt.module(*inputs)
    ok, why = _within(ref, out.float(), tol["rel_to_scale"], tol["min_cosine"])
    assert ok, f"{name}: {why}"


@pytest.mark.parametrize("name", NAMES)
def test_plan_classifies_every_op(name: str) -> None:
    arch = next(a for a in DIFFUSERS if a.name == name)
    model, inputs, _ = _model(name)
    plan = graphopt.plan(model, inputs, target="h100")
    classes = [n.analysis.kernel_class.value for n in plan.nodes]
    for kernel in arch.kernels:
        assert kernel in classes, f"{name}: no {kernel} node in {sorted(set(classes))}"
    assert classes.count("other") == 0, [n.op for n in plan.nodes
                                         if n.analysis.kernel_class.value == "other"]
    assert not plan.summary.unsupported_ops
    heavy = [n for n in plan.nodes if n.analysis.kernel_class.value in ("gemm", "conv",
                                                                       "attention")]
    assert all(n.analysis.flops > 0 and n.cost.est_time_s > 0 for n in heavy)
    total = sum(n.analysis.flops for n in plan.nodes)
    assert total > 0 and sum(n.analysis.flops for n in heavy) >= 0.5 * total


@pytest.mark.parametrize("name", NAMES)
def test_optimize_for_cpu_matches_and_exports_to_onnx(name: str, tmp_path: Path) -> None:
    model, inputs, ref = _model(name)
    opt = _optimized(name, "cpu")
    _assert_matches(name, opt, inputs, ref)
    session = graphopt.ort_session(opt.export_onnx(tmp_path / f"{name}.onnx"))
    params = list(inspect.signature(model.forward).parameters)
    named = {params[i]: t.numpy() for i, t in enumerate(inputs)}
    got = session.run(None, {i.name: named[i.name] for i in session.get_inputs()})
    assert len(got) == 1
    onnx_info = opt.onnx_info
    lossless = onnx_info.compute_dtype == "fp32" and not any(
        p in onnx_info.passes_applied for p in ("quantize", "precision"))
    rtol = ONNX_FP32_RTOL if lossless else onnx_info.tolerance.rel_to_scale
    ok, why = _within(ref, got[0], rtol, 0.0 if lossless else onnx_info.tolerance.min_cosine)
    assert ok, f"{name} ONNX ({onnx_info['exporter']}): {why}"


@pytest.mark.parametrize("name", NAMES)
def test_optimize_for_h100_matches_and_runs_on_fake_cuda(name: str) -> None:
    _, inputs, ref = _model(name)
    opt = _optimized(name, "h100")
    assert opt.info.compute_dtype == "bf16"
    _assert_matches(name, opt, inputs, ref)
    assert isinstance(opt.module, OptimizedModule)
    out = run_fake_cuda(opt.module, inputs)
    assert [(o.device.type, o.shape) for o in out] == [("cuda", ref.shape)]


def _batched(inputs: tuple[torch.Tensor, ...], batch: int) -> tuple[torch.Tensor, ...]:
    """Inputs with a batch dim (first dim ``BATCH``) at ``batch`` rows, cycling the example's;
    Flux's position ids have no batch dim and stay."""
    rows = torch.arange(batch) % BATCH
    return tuple(t[rows] if t.ndim and t.shape[0] == BATCH else t for t in inputs)


@pytest.mark.parametrize("name", NAMES)
def test_batch_range_matches_at_other_batch_sizes(name: str) -> None:
    model, inputs, _ = _model(name)
    batch = Dim("batch", min=1, max=4)
    spec = tuple({0: batch} if t.ndim and t.shape[0] == BATCH else None for t in inputs)
    opt = graphopt.optimize(model, inputs, target="cpu", measure=False, dynamic_shapes=spec)
    assert opt.plan.shape_range.dims[0].name == "batch"
    tol = opt.numerics[0]["tolerance"]
    for size in (1, 3):
        x = _batched(inputs, size)
        with torch.no_grad():
            ref, out = model(*x), opt.module(*x)
        assert out.shape == ref.shape and ref.shape[0] == size
        ok, why = _within(ref, out, tol["rel_to_scale"], tol["min_cosine"])
        assert ok, f"{name} at batch {size}: {why}"


# loads each saved file, calls it on its inputs and saves the outputs; prints whether any
# diffusers module got imported (it must not be)
_FRESH = """
import json, sys, torch, graphopt
inputs, outs = torch.load(sys.argv[1], weights_only=True), {}
for path in sys.argv[2:]:
    with torch.no_grad():
        outs[path] = graphopt.load(path)(*inputs[path])
torch.save(outs, sys.argv[1] + ".out")
print(json.dumps(sorted(k for k in sys.modules if k.startswith("diffusers"))))
"""


def test_every_model_saves_and_loads_without_diffusers(tmp_path: Path) -> None:
    calls, wants = {}, {}
    for name in NAMES:
        _, inputs, _ = _model(name)
        opt = _optimized(name, "cpu")
        path = str(tmp_path / f"{name}.pt2")
        opt.save(path)
        calls[path] = inputs
        with torch.no_grad():
            wants[path] = opt.module(*inputs)
    torch.save(calls, tmp_path / "inputs.pt")
    done = subprocess.run([sys.executable, "-c", _FRESH, str(tmp_path / "inputs.pt"), *calls],
                          capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []  # no model code there
    outs = torch.load(str(tmp_path / "inputs.pt") + ".out", weights_only=True)
    for path, want in wants.items():
        np.testing.assert_allclose(outs[path].numpy(), want.numpy(), rtol=1e-5, atol=1e-5,
                                   err_msg=path)
