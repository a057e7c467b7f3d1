"""Helpers shared by the robustness tests (test_robustness.py, test_robustness_errors.py): a small
ONNX MLP on disk, a folder's listing (to prove no file is harmed or left behind) and a check that
a CLI's output holds no traceback."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _mlp_onnx(path: Path, batch: int | str, d_in: int = 20, d_hidden: int = 30, d_out: int = 10
              ) -> Path:
    """MatMul -> Add -> Relu -> MatMul with odd dims (so padding is considered on GPUs)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in (("w0", (d_in, d_hidden)), ("b0", (d_hidden,)), ("w1", (d_hidden, d_out)))]
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["h0"], name="mm0"),
             helper.make_node("Add", ["h0", "b0"], ["h1"], name="bias0"),
             helper.make_node("Relu", ["h1"], ["h2"], name="relu0"),
             helper.make_node("MatMul", ["h2", "w1"], ["y"], name="mm1")]
    g = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, d_in])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, d_out])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def _listing(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def _no_traceback(text: str) -> None:
    assert "Traceback" not in text and "File \"" not in text, text
