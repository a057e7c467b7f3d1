"""Issue 19: the user's code cannot make graphopt lose a file, exit silently or lose compute.

Each test is written the way a user hits it: a ``file.py:build`` builder or a ``forward`` that
changes folder, exits, is interrupted or returns a dataclass, and a model whose node names
hold terminal escape sequences. Each checks the exit status and message, and that no user
file changed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import textwrap
from pathlib import Path

import onnx
import pytest
import torch
from onnx import TensorProto, helper
from torch import nn

import graphopt
from graphopt.cli.main import main

_MODEL = """
import os, sys, torch
from torch import nn

def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
"""


def _builder(folder: Path, body: str, name: str = "model.py") -> Path:
    """``folder/name`` with ``_model()`` and a ``build()`` whose body is ``body``."""
    path = folder / name
    path.write_text(_MODEL + "\ndef build():\n" + textwrap.indent(textwrap.dedent(body), "    "))
    return path


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str], needle: str,
           status: int = 2) -> str:
    assert main(argv) == status
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert needle in err, err
    return err


# -- finding 3: output paths are fixed before user code runs --------------------------------------

def test_a_builder_that_changes_folder_cannot_send_the_report_onto_its_source(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
        ) -> None:
    # the user runs from out/, writes the report as out/model.py; build() moves to the model's
    # folder, where a relative "model.py" is the model's own source
    model = _builder(tmp_path, "os.chdir(os.path.dirname(__file__))\n"
                               "return _model(), (torch.randn(2, 8),)")
    (tmp_path / "out").mkdir()
    monkeypatch.chdir(tmp_path / "out")
    before = model.read_bytes()
    assert main(["plan", f"{model}:build", "--json", "model.py", "--target", "h100"]) == 0
    printed = capsys.readouterr().out
    assert model.read_bytes() == before  # the source is intact
    report = tmp_path / "out" / "model.py"
    assert report.is_file() and report.read_text().lstrip().startswith("{")
    assert f"wrote {report}" in printed


def test_a_link_to_the_input_made_by_user_code_is_caught_before_writing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the claim saw no file; build() then makes the output path a link to the model
    out = tmp_path / "plan.json"
    model = _builder(tmp_path, f"os.symlink(__file__, {str(out)!r})\n"
                               "return _model(), (torch.randn(2, 8),)")
    before = model.read_bytes()
    _fails(["plan", f"{model}:build", "--json", str(out), "--target", "h100"], capsys,
           "is the input file")
    assert model.read_bytes() == before
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


# -- finding 6: user code that exits --------------------------------------------------------------

@pytest.mark.parametrize("code", ["0", "3", "'bye'"])
def test_sys_exit_in_the_builder_is_an_error_that_names_it(
        code: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = _builder(tmp_path, f"sys.exit({code})")
    out = tmp_path / "plan.json"
    err = _fails(["plan", f"{model}:build", "--json", str(out)], capsys,
                 f"{model}:build() called sys.exit(")
    assert "fix:" in err
    assert not out.exists()


def test_sys_exit_at_import_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                        ) -> None:
    model = tmp_path / "model.py"
    model.write_text("import sys\nsys.exit(0)\ndef build():\n    return None\n")
    _fails(["plan", f"{model}:build"], capsys, f"importing {model} called sys.exit(0)")


def test_generator_exit_in_the_builder_is_an_error(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    model = _builder(tmp_path, "raise GeneratorExit")
    _fails(["plan", f"{model}:build"], capsys, "build() raised GeneratorExit")


class _Exits(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import sys
        sys.exit(0)


def test_sys_exit_in_forward_is_an_error_that_names_forward(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "model.py"
    model.write_text(textwrap.dedent("""
        import sys, torch
        from torch import nn
        class Exits(nn.Module):
            def forward(self, x):
                sys.exit(0)
        def build():
            return Exits().eval(), (torch.randn(2, 2),)
        """))
    out = tmp_path / "fast.pt2"
    _fails(["optimize", f"{model}:build", "-o", str(out), "--target", "cpu"], capsys,
           "Exits.forward called sys.exit(0)")
    assert not out.exists()
    with pytest.raises(graphopt.GraphoptError, match=r"_Exits.forward called sys.exit"):
        graphopt.plan(_Exits(), (torch.randn(2, 2),))


def test_ctrl_c_in_the_builder_exits_130(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                         ) -> None:
    model = _builder(tmp_path, "raise KeyboardInterrupt")
    out = tmp_path / "plan.json"
    _fails(["plan", f"{model}:build", "--json", str(out)], capsys, "interrupted", status=130)
    assert not out.exists()


def test_a_builder_returning_a_path_is_told_it_must_return_a_module(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = _builder(tmp_path, "return 'model.onnx', (torch.randn(2, 8),)")
    err = _fails(["plan", f"{model}:build"], capsys, "returned a str as the module")
    assert "not found" not in err


# -- finding 6: a dataclass output keeps its compute ----------------------------------------------

@dataclasses.dataclass
class _Out:
    y: torch.Tensor
    hidden: torch.Tensor


class _ReturnsDataclass(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 32)

    def forward(self, x: torch.Tensor) -> _Out:
        h = self.lin(x)
        return _Out(torch.relu(h), h)


def test_a_model_returning_a_dataclass_keeps_its_compute_in_the_plan() -> None:
    torch.manual_seed(0)
    model = _ReturnsDataclass().eval()
    plan = graphopt.plan(model, (torch.randn(4, 16),), target="h100")
    kinds = {str(n.analysis.kernel_class) for n in plan.nodes}
    assert "gemm" in kinds and plan.summary.total_flops >= 2 * 4 * 16 * 32
    assert any("_Out" in w and "register_dataclass" in w for w in plan.warnings)


def test_the_optimized_dataclass_model_returns_the_same_dataclass_and_numbers() -> None:
    torch.manual_seed(0)
    model, x = _ReturnsDataclass().eval(), torch.randn(4, 16)
    opt = graphopt.optimize(model, (x,), target="cpu", precision="fp32", measure=False)
    got, want = opt.module(x), model(x)
    assert isinstance(got, _Out)
    torch.testing.assert_close(got.y, want.y, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.hidden, want.hidden, rtol=1e-5, atol=1e-6)


# -- finding 7: names are escaped on the terminal -------------------------------------------------

def test_control_sequences_in_node_names_are_escaped(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    evil = "\x1b]0;owned\x07\x1b[2J\x9bmm"
    w = helper.make_tensor("W", TensorProto.FLOAT, [64, 64], [0.01] * 64 * 64)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name=evil)], "g\x1b[31m",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [256, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [256, 64])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "evil.onnx"
    onnx.save_model(model, str(path))
    assert main(["plan", str(path), "--target", "h100"]) == 0
    captured = capsys.readouterr()
    for stream in (captured.out, captured.err):
        assert not any(c in stream for c in "\x1b\x07\x9b")
    assert "\\x1b]0;owned\\x07" in captured.out
