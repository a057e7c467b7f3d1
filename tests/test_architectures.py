"""Real architectures (transformers, tiny random-weight configs) through plan, optimize, ONNX.

Each model in ``tests/arch_zoo.py`` is planned for an H100, optimized for this CPU and for an
H100, and exported to ONNX and run in ONNX Runtime; every result is compared numerically with
the original model on the same inputs. Marked ``zoo``: ``make test`` (CI) runs it,
``make test-quick`` (``-m "not zoo"``) skips it.
"""

from __future__ import annotations

import functools
import inspect
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import graphopt
from graphopt.frontends.onnx_export import export_torch

pytest.importorskip("transformers")

from tests.arch_zoo import ARCHS, build  # noqa: E402 - needs transformers

pytestmark = [pytest.mark.zoo,
              pytest.mark.filterwarnings("ignore::DeprecationWarning",
                                         "ignore::FutureWarning", "ignore::UserWarning")]

NAMES = [a.name for a in ARCHS]
#: fp32 ONNX (exporter + ORT's fused kernels): within 1e-4 of the output's scale
ONNX_FP32_RTOL = 1e-4
#: the widest budget graphopt states for any precision (int8: verify.py / the ONNX guard)
WIDEST_RTOL = 5e-2


@functools.cache
def _model(name: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], torch.Tensor]:
    """The model, its inputs and its output, built once per session."""
    model, inputs = build(name)
    with torch.no_grad():
        out = model(*inputs)
    return model, inputs, out


def _within(ref: torch.Tensor | np.ndarray, got: torch.Tensor | np.ndarray, rtol: float,
            min_cosine: float = 0.0) -> tuple[bool, str]:
    """max |ref - got| <= rtol * max |ref|, and the cosine floor; computed here, in float64."""
    r = np.asarray(ref, dtype=np.float64).ravel()
    g = np.asarray(got, dtype=np.float64).ravel()
    if r.shape != g.shape:
        return False, f"shape {g.shape} != {r.shape}"
    scale = float(np.abs(r).max())
    err = float(np.abs(r - g).max())
    cosine = float(r @ g / (np.linalg.norm(r) * np.linalg.norm(g)))
    ok = err <= rtol * scale and cosine >= min_cosine and np.isfinite(g).all()
    return bool(ok), f"max abs {err:.3g} vs {rtol:g} x scale {scale:.3g}, cosine {cosine:.7f}"


def _feeds(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], session: Any
           ) -> dict[str, np.ndarray]:
    """Inputs by the graph's names (forward()'s parameter names, as graphopt exports them)."""
    params = list(inspect.signature(model.forward).parameters)
    named = {params[i]: t.numpy() for i, t in enumerate(inputs)}
    wanted = [i.name for i in session.get_inputs()]
    assert set(wanted) <= set(named), f"graph inputs {wanted}, forward() takes {params}"
    return {k: named[k] for k in wanted}


@pytest.mark.parametrize("name", NAMES)
def test_plan_classifies_the_architecture(name: str) -> None:
    arch = next(a for a in ARCHS if a.name == name)
    model, inputs, _ = _model(name)
    plan = graphopt.plan(model, inputs, target="h100")
    classes = [n.analysis.kernel_class.value for n in plan.nodes]
    for kernel in arch.kernels:
        assert kernel in classes, f"{name}: no {kernel} node in {sorted(set(classes))}"
    # every op is known: nothing left as 'other' with its source name
    assert classes.count("other") == 0, [n.op for n in plan.nodes
                                         if n.analysis.kernel_class.value == "other"]
    gemms = [n for n in plan.nodes if n.analysis.kernel_class.value in ("gemm", "conv")]
    assert all(n.analysis.flops > 0 and n.cost.est_time_s > 0 for n in gemms)
    assert all(n.analysis.bytes_total >= 0 for n in plan.nodes)
    # the GEMM-like work dominates the FLOPs of every one of these models
    total = sum(n.analysis.flops for n in plan.nodes)
    heavy = sum(n.analysis.flops for n in plan.nodes
                if n.analysis.kernel_class.value in ("gemm", "conv", "attention"))
    assert total > 0 and heavy >= 0.5 * total, (heavy, total)


@pytest.mark.parametrize("target", ["cpu", "h100"])
@pytest.mark.parametrize("name", NAMES)
def test_optimize_and_export_match_the_original(name: str, target: str, tmp_path: Path) -> None:
    model, inputs, ref = _model(name)
    opt = graphopt.optimize(model, inputs, target=target, measure=False)
    assert opt.numerics and all(n["within"] for n in opt.numerics), opt.numerics
    # the stated tolerance, checked here on the same inputs, and it is a real one
    tol = opt.numerics[0]["tolerance"]
    assert tol["rel_to_scale"] <= WIDEST_RTOL
    if opt.info.compute_dtype == "fp32" and "quantize" not in opt.info.passes_applied:
        assert tol["rel_to_scale"] <= 1e-5
    with torch.no_grad():
        out = opt.module(*inputs)
    ok, why = _within(ref, out.float(), tol["rel_to_scale"], tol["min_cosine"])
    assert ok, f"{name} optimized for {target}: {why}"

    path = opt.export_onnx(tmp_path / f"{name}.onnx")
    session = graphopt.ort_session(path)
    got = session.run(None, _feeds(model, inputs, session))
    assert len(got) == 1
    onnx_info = opt.onnx_info
    lossless = onnx_info.compute_dtype == "fp32" and not any(
        p in onnx_info.passes_applied for p in ("quantize", "precision"))
    rtol = ONNX_FP32_RTOL if lossless else onnx_info.tolerance.rel_to_scale
    assert rtol <= WIDEST_RTOL
    ok, why = _within(ref, got[0], rtol, 0.0 if lossless else onnx_info.tolerance.min_cosine)
    assert ok, f"{name} ONNX ({onnx_info['exporter']}) for {target}: {why}"


def test_measured_optimize_on_a_real_architecture() -> None:
    """The default path for target="cpu": every auto-decided pass timed on this machine."""
    model, inputs, ref = _model("resnet")
    opt = graphopt.optimize(model, inputs, target="cpu")
    assert all(n["within"] for n in opt.numerics)
    with torch.no_grad():
        out = opt.module(*inputs)
    tol = opt.numerics[0]["tolerance"]
    ok, why = _within(ref, out, tol["rel_to_scale"], tol["min_cosine"])
    assert ok, why
    # measuring reverts what is slower here, and says so: every revert has a reason
    for reverted in opt.info.passes_reverted:
        assert reverted


@pytest.mark.parametrize(("opset", "exporter"), [(None, "legacy"), (21, "dynamo")])
def test_mixtral_onnx_routes_tokens_at_run_time(opset: int | None, exporter: str,
                                                tmp_path: Path) -> None:
    """The exported Mixtral routes each token to its experts in the graph (histc, grouped
    GEMM), not by a routing frozen from the example batch: other tokens match torch too. Both
    exporters: opset 21 is past the TorchScript exporter's, so dynamo exports it."""
    model, inputs, _ = _model("mixtral")
    exp = export_torch(model, inputs, opset=opset)
    assert exp.exporter == exporter, exp.fallback_reason
    ops = {n.op_type for n in exp.model.graph.node}
    assert {"GatherElements", "MatMul"} <= ops
    path = tmp_path / "mixtral.onnx"
    path.write_bytes(exp.model.SerializeToString())
    session = graphopt.ort_session(path)
    for seed in (5, 6):
        ids = torch.randint(0, 256, inputs[0].shape, generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            ref = model(ids)
        got = session.run(None, {session.get_inputs()[0].name: ids.numpy()})[0]
        ok, why = _within(ref, got, 1e-5)
        assert ok, why


@pytest.mark.parametrize("name", ["llama", "mixtral", "bert", "vit"])
def test_raw_transformers_models_need_no_wrapper(name: str, tmp_path: Path) -> None:
    """The model as transformers builds it (ModelOutput results, decorated forward()): every
    output leaf matches after optimize and in ONNX Runtime."""
    from torch.utils import _pytree as pytree

    wrapper, inputs, _ = _model(name)
    raw = wrapper.model
    with torch.no_grad():
        refs = [t for t in pytree.tree_leaves(raw(*inputs)) if isinstance(t, torch.Tensor)]
    opt = graphopt.optimize(raw, inputs, target="cpu", measure=False)
    with torch.no_grad():
        outs = [t for t in pytree.tree_leaves(opt.module(*inputs)) if isinstance(t, torch.Tensor)]
    assert len(outs) == len(refs) and all(n["within"] for n in opt.numerics)
    for r, o, n in zip(refs, outs, opt.numerics, strict=True):
        ok, why = _within(r, o, n["tolerance"]["rel_to_scale"], n["tolerance"]["min_cosine"])
        assert ok, why
    session = graphopt.ort_session(opt.export_onnx(tmp_path / f"{name}.onnx"))
    assert opt.onnx_info.exporter == "legacy"  # the fast exporter takes them as they are
    got = session.run(None, _feeds(raw, inputs, session))
    assert len(got) == len(refs)
    rtol = max(ONNX_FP32_RTOL, opt.onnx_info.tolerance.rel_to_scale)
    for r, o in zip(refs, got, strict=True):
        ok, why = _within(r, o, rtol)
        assert ok, why
