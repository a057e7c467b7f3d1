"""Every zoo architecture optimized over a batch (and sequence) range: the module matches the
original at shapes other than the example's, and a few export to ONNX with symbolic dims."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from torch.export import Dim  # noqa: E402

import graphopt  # noqa: E402
from graphopt.backends.torch.verify import compare_outputs  # noqa: E402
from graphopt.decisions.tolerance import Tolerance  # noqa: E402
from tests.arch_zoo import ARCHS, build  # noqa: E402

pytestmark = [pytest.mark.zoo, pytest.mark.filterwarnings("ignore::FutureWarning")]


def _ranged(name: str):
    model, args = build(name)
    batch, seq = Dim("batch", min=1, max=8), Dim("seq", min=2, max=32)
    spec = tuple({0: batch, 1: seq} if not a.is_floating_point() else {0: batch} for a in args)
    return model, args, spec


def _at(args, batch: int, seq: int):
    """The example resized: ids/masks tiled along batch and sequence, features along batch."""
    out = []
    for a in args:
        reps = [batch] + [1] * (a.ndim - 1)
        x = a[:1].repeat(*reps)
        if not a.is_floating_point():
            x = x.repeat(1, -(-seq // a.shape[1]))[:, :seq]
        out.append(x)
    return tuple(out)


@pytest.mark.parametrize("name", [a.name for a in ARCHS])
def test_zoo_module_matches_across_the_range(name):
    model, args, spec = _ranged(name)
    opt = graphopt.optimize(model, args, target="h100", measure=False, dynamic_shapes=spec)
    assert opt.plan.shape_range.dims[0].name == "batch"
    tol = Tolerance.of(opt.info.tolerance)
    for batch, seq in ((1, 5), (3, 32)):
        x = _at(args, batch, seq)
        with torch.no_grad():
            result = compare_outputs(model(*x), opt.module(*x), tol)
        assert all(c.within for c in result), (batch, seq, [c.describe() for c in result])


@pytest.mark.parametrize("name", ["bert", "gpt2", "resnet"])
def test_zoo_onnx_export_runs_across_the_range(name, tmp_path):
    model, args, spec = _ranged(name)
    opt = graphopt.optimize(model, args, target="cpu", measure=False, dynamic_shapes=spec)
    session = graphopt.ort_session(opt.export_onnx(tmp_path / "m.onnx"))
    for batch, seq in ((1, 5), (3, 32)):
        x = _at(args, batch, seq)
        feeds = {i.name: t.numpy() for i, t in zip(session.get_inputs(), x, strict=True)}
        got = session.run(None, feeds)[0]
        want = model(*x).detach().numpy()
        assert got.shape == want.shape
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
