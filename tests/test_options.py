"""Issue 10, item 3: one options record whose every choice both backends honour."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

import graphopt
from graphopt.cli.main import build_parser, main
from graphopt.ir.options import CHOICES, Options


def _matmul_onnx(path) -> str:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((256, 256)).astype(np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 256])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save_model(model, str(path))
    return str(path)


def test_every_choice_is_validated_and_int8_means_dynamic():
    for name, allowed in CHOICES.items():
        with pytest.raises(graphopt.GraphoptError, match=f"{name}='bogus' is not an option"):
            Options(**{name: "bogus"})
        for value in allowed:
            Options(**{name: value})
    assert Options(quantize="int8").quantize == "int8_dynamic"
    for bad in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(graphopt.GraphoptError, match="positive number"):
            Options(tolerance=bad)


def test_the_cli_offers_the_same_table():
    opt = {a.dest: a for a in build_parser()._subparsers._group_actions[0]
           .choices["optimize"]._actions}
    for name, allowed in CHOICES.items():
        assert tuple(opt[name].choices) == allowed


def test_onnx_honours_measure(tmp_path):
    """Before: optimize("m.onnx", measure=...) was silently ignored: the host CPU target was
    always timed, a GPU target never."""
    path = _matmul_onnx(tmp_path / "m.onnx")
    assert "measured" not in graphopt.optimize(path, target="cpu", measure=False).info.notes
    timed = graphopt.optimize(path, target="h100", measure=True)
    assert "precision" in timed.info.notes["measured"]  # fp16 for the GPU, timed here


def test_cli_no_measure_reaches_the_onnx_backend(tmp_path, capsys):
    path = _matmul_onnx(tmp_path / "m.onnx")
    out = tmp_path / "o.onnx"
    assert main(["optimize", path, "-o", str(out), "--target", "cpu", "--no-measure",
                 "--json", str(tmp_path / "r.json")]) == 0
    import json

    report = json.loads((tmp_path / "r.json").read_text())
    assert "measured" not in report["optimization"]["notes"]


def test_torch_honours_tolerance():
    """Before: tolerance= on a torch module was refused as ONNX-only. A budget no 16-bit
    format can meet reverts the precision pass, with the budget in the reason."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 64)).eval()
    x = torch.randn(8, 64)
    loose = graphopt.optimize(model, (x,), target="h100")
    assert "precision" in loose.info.passes_applied
    tight = graphopt.optimize(model, (x,), target="h100", tolerance=1e-9)
    assert "precision" not in tight.info.passes_applied
    assert any(r.name == "precision" and "out of tolerance" in r.reason
               for r in tight.info.passes_reverted)
    ref = model(x)
    assert (tight.module(x) - ref).abs().max() <= 1e-5 * ref.abs().max()


def test_torch_refuses_static_int8_with_the_way_to_get_it():
    model = nn.Sequential(nn.Linear(16, 16)).eval()
    with pytest.raises(graphopt.GraphoptError, match="calibration data") as e:
        graphopt.optimize(model, (torch.randn(2, 16),), target="cpu", quantize="int8_static")
    assert "quantize='int8_static'" in (e.value.fix or "")


def test_onnx_refuses_weight_only_int8_with_the_way_to_get_it():
    with pytest.raises(graphopt.GraphoptError, match="weight-only") as e:
        graphopt.optimize("m.onnx", target="cpu", quantize="int8_weight_only")
    assert "graphopt.optimize(model, inputs" in (e.value.fix or "")
