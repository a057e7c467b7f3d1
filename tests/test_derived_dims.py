"""Issue 31, item 7: derived dims (``4 * t``, ``t + 1``) as torch.export writes them are kept
in the shape range, checked on every call, exported to ONNX and saved.

A model takes two inputs whose sizes are tied: ``y`` has ``4 * t`` (or ``t + 1``) rows where
``x`` has ``t``. The optimized module, its ONNX export and its saved file run at other sizes of
``t`` and match the original; a ``y`` that breaks the tie is a GraphoptError, not torch's own
error from deep inside the graph.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from torch import nn
from torch.export import Dim

import graphopt


class _Times4(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.fc(y).reshape(x.shape[0], 4, 16).sum(1) + self.fc(x)


class _PlusOne(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.fc(y)[1:] + self.fc(x)


CASES = {"4*t": (_Times4, lambda t: 4 * t, lambda n: 4 * n),
         "t + 1": (_PlusOne, lambda t: t + 1, lambda n: n + 1)}


@pytest.mark.parametrize("expr", list(CASES))
def test_a_derived_dim_is_kept_checked_exported_and_saved(expr: str, tmp_path: Path) -> None:
    cls, derive, size = CASES[expr]
    model, t = cls().eval(), Dim("t", min=2, max=64)
    x, y = torch.randn(8, 16), torch.randn(size(8), 16)
    opt = graphopt.optimize(model, (x, y), target="h100",
                            dynamic_shapes={"x": {0: t}, "y": {0: derive(t)}})
    assert opt.plan.shape_range.inputs["y"] == (expr, 16)
    a, b = torch.randn(3, 16), torch.randn(size(3), 16)
    with torch.no_grad():
        want = model(a, b)
    torch.testing.assert_close(opt.module(a, b).float(), want, rtol=2e-2, atol=2e-2)
    with pytest.raises(graphopt.GraphoptError, match=f"it is {re.escape(expr)}"):
        opt.module(a, torch.randn(size(3) + 1, 16))
    onnx_path = opt.export_onnx(tmp_path / "m.onnx")
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    assert [i.shape for i in sess.get_inputs()] == [["t", 16], [expr, 16]]
    got = sess.run(None, {"x": a.numpy(), "y": b.numpy()})[0]
    np.testing.assert_allclose(got, want.numpy(), rtol=2e-2, atol=2e-2)
    opt.save(tmp_path / "m.pt2")
    loaded = graphopt.load(tmp_path / "m.pt2")
    torch.testing.assert_close(loaded(a, b), opt.module(a, b))
