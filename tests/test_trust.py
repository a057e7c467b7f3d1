"""Issue 9: graphopt never harms the user's files or model, and says clearly when it won't act.

Each test is written as a user hits it (the CLI or the Python API) and checks the message and
that no input changed and no output was left behind.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

import graphopt
from graphopt.cli.main import main


def _mlp_onnx(path: Path, *, external: bool = False) -> Path:
    """x[2,64] @ W[64,64] + b -> Relu: small, valid, optimizable."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(64).astype(np.float32), "B")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
         helper.make_node("Add", ["h", "B"], ["a"], name="add"),
         helper.make_node("Relu", ["a"], ["y"], name="relu")],
        "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])], [w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    if external:
        onnx.save_model(model, str(path), save_as_external_data=True,
                        all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    else:
        onnx.save_model(model, str(path))
    return path


def _digest(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (hidden temp files included) -> sha256 of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _fails(argv: list[str], capsys, needle: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert needle in err, err
    return err


# -- finding 1: an output over an input ------------------------------------------------------

def test_plan_json_over_the_input_model_is_refused(tmp_path, capsys):
    model = _mlp_onnx(tmp_path / "victim.onnx")
    before = _digest(tmp_path)
    err = _fails(["plan", str(model), "--json", str(model)], capsys, "is the input file")
    assert str(model) in err
    assert _digest(tmp_path) == before


def test_optimize_over_the_input_in_place_is_refused(tmp_path, capsys):
    model = _mlp_onnx(tmp_path / "ok.onnx")
    before = _digest(tmp_path)
    _fails(["optimize", str(model), "-o", str(model), "--target", "cpu"], capsys,
           "is the input file")
    assert _digest(tmp_path) == before


def test_output_over_external_data_symlink_or_hard_link_is_refused(tmp_path, capsys):
    model = _mlp_onnx(tmp_path / "ext.onnx", external=True)
    data = tmp_path / "weights.bin"
    (tmp_path / "link.onnx").symlink_to(model)
    os.link(model, tmp_path / "hard.onnx")
    before = _digest(tmp_path)
    for out in (data, tmp_path / "link.onnx", tmp_path / "hard.onnx"):
        _fails(["optimize", str(model), "-o", str(out), "--target", "cpu"], capsys,
               "is the input file")
        _fails(["plan", str(model), "--html", str(out)], capsys, "is the input file")
    assert _digest(tmp_path) == before
    # the model still loads with the weights it had
    feeds = {"x": np.ones((2, 64), np.float32)}
    import onnxruntime as ort

    ref = ort.InferenceSession(str(model)).run(None, feeds)[0]
    assert np.isfinite(ref).all()


def test_calibration_file_is_an_input_too(tmp_path, capsys):
    model = _mlp_onnx(tmp_path / "m.onnx")
    calib = tmp_path / "c.npz"
    np.savez(calib, x=np.ones((3, 2, 64), np.float32))
    before = _digest(tmp_path)
    _fails(["optimize", str(model), "-o", str(tmp_path / "o.onnx"), "--target", "cpu",
            "--calibration", str(calib), "--json", str(calib)], capsys, "is the input file")
    assert _digest(tmp_path) == before


def test_api_export_and_report_over_the_input_are_refused(tmp_path):
    model = _mlp_onnx(tmp_path / "m.onnx")
    before = _digest(tmp_path)
    opt = graphopt.optimize(str(model), target="cpu", measure=False)
    with pytest.raises(graphopt.GraphoptError, match="is the input file"):
        opt.export_onnx(model)
    with pytest.raises(graphopt.GraphoptError, match="is the input file"):
        opt.save_report(json=str(model))
    with pytest.raises(graphopt.GraphoptError, match="is the input file"):
        graphopt.plan(str(model), target="h100,a100").save(html=str(model))
    assert _digest(tmp_path) == before


# -- finding 3: several outputs are one transaction --------------------------------------------

def test_a_failing_later_output_leaves_no_earlier_one(tmp_path, capsys):
    model = _mlp_onnx(tmp_path / "m.onnx")
    folder = tmp_path / "adir"
    folder.mkdir()
    before = _digest(tmp_path)
    err = _fails(["optimize", str(model), "-o", str(tmp_path / "o.onnx"), "--target", "cpu",
                  "--json", str(tmp_path / "r.json"), "--html", str(folder)], capsys,
                 "is a folder")
    assert "IsADirectoryError" not in err
    assert _digest(tmp_path) == before
    _fails(["plan", str(model), "--json", str(tmp_path / "new") + "/"], capsys, "is a folder")
    assert _digest(tmp_path) == before and not (tmp_path / "new").exists()
    _fails(["plan", str(model), "--json", str(tmp_path / "r.json"),
            "--md", "/proc/graphopt-test/r.md"], capsys, "cannot write")
    assert _digest(tmp_path) == before


def test_a_failure_while_writing_rolls_the_set_back(tmp_path, monkeypatch):
    from graphopt.files.outputs import OutputSet

    old = tmp_path / "old.json"
    old.write_text("the user's old report")
    outputs = OutputSet()
    outputs.write(old, "new report")
    outputs.write(tmp_path / "new.md", "new")
    real_replace = os.replace

    def failing_replace(src, dst):
        if str(dst).endswith("new.md"):
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(graphopt.GraphoptError, match="no output was written"):
        outputs.commit()
    monkeypatch.undo()
    assert old.read_text() == "the user's old report"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.json"]


def test_outputs_follow_the_umask_and_keep_a_replaced_files_mode(tmp_path):
    model = _mlp_onnx(tmp_path / "m.onnx")
    old = os.umask(0o027)
    try:
        assert main(["plan", str(model), "--json", str(tmp_path / "a.json")]) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o640
    (tmp_path / "a.json").chmod(0o604)
    assert main(["plan", str(model), "--json", str(tmp_path / "a.json")]) == 0
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o604


def test_a_read_only_target_is_not_replaced(tmp_path, capsys):
    model = _mlp_onnx(tmp_path / "m.onnx")
    ro = tmp_path / "ro.json"
    ro.write_text("keep me")
    ro.chmod(0o444)
    before = _digest(tmp_path)
    _fails(["plan", str(model), "--json", str(ro)], capsys, "is read-only")
    assert _digest(tmp_path) == before


def test_two_outputs_on_one_path_are_refused(tmp_path, capsys):
    model = _mlp_onnx(tmp_path / "m.onnx")
    before = _digest(tmp_path)
    _fails(["optimize", str(model), "-o", str(tmp_path / "o.onnx"), "--target", "cpu",
            "--json", str(tmp_path / "o.graphopt.json")], capsys, "same file")
    _fails(["plan", str(model), "--json", str(tmp_path / "r"), "--md", str(tmp_path / "r")],
           capsys, "same file")
    assert _digest(tmp_path) == before


def test_a_good_optimize_writes_the_whole_set(tmp_path, capsys):
    model = _mlp_onnx(tmp_path / "m.onnx")
    out = tmp_path / "sub" / "o.onnx"
    assert main(["optimize", str(model), "-o", str(out), "--target", "cpu",
                 "--json", str(tmp_path / "r.json")]) == 0
    names = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert names == ["m.onnx", "r.json", "sub/o.graphopt.json", "sub/o.onnx"]
    feeds = {"x": np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)}
    import onnxruntime as ort

    ref = ort.InferenceSession(str(model)).run(None, feeds)[0]
    got = graphopt.ort_session(out).run(None, feeds)[0]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


# -- finding 2: the user's model and tensors never change ---------------------------------------

class _Counting(nn.Module):
    """Writes a buffer and its input in forward, as real models (caches, stats) do."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(32, 32)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        x.add_(1)
        return self.lin(x) + self.calls.to(x.dtype)


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("target", ["h100", "cpu"])
def test_optimize_leaves_the_users_model_and_inputs_bit_identical(target):
    torch.manual_seed(0)
    model = _Counting().eval()
    x = torch.randn(4, 32)
    x_before, state_before = x.clone(), _state(model)
    opt = graphopt.optimize(model, (x,), target=target)
    assert torch.equal(x, x_before)
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in state_before.items())
    # the optimized module starts where the model starts: same first output on the same input
    expected = model(x.clone())
    got = opt.module(x.clone())
    budget = opt.info.tolerance.rel_to_scale * expected.abs().max()
    assert (got.float() - expected).abs().max() <= budget


def test_export_onnx_leaves_the_users_model_and_inputs_bit_identical(tmp_path):
    torch.manual_seed(0)
    model = _Counting().eval()
    x = torch.randn(4, 32)
    opt = graphopt.optimize(model, (x,), target="h100")
    x_before, state_before = x.clone(), _state(model)
    try:  # a forward that writes its state has no faithful ONNX form: refusing is fine too
        opt.export_onnx(tmp_path / "m.onnx")
    except graphopt.GraphoptError:
        assert not list(tmp_path.iterdir())
    assert torch.equal(x, x_before)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state_before.items())


# -- finding 5 (CLI and optimize parts) ---------------------------------------------------------

def test_optimize_refuses_a_meta_model_and_plan_takes_it():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(16, 16), nn.ReLU()).eval()
    x = torch.randn(2, 16)
    with pytest.raises(graphopt.GraphoptError, match="meta device") as e:
        graphopt.optimize(model, (x,), target="h100")
    assert "graphopt.plan" in (e.value.fix or "")
    assert graphopt.plan(model, (torch.randn(2, 16, device="meta"),), target="h100").nodes


def test_optimize_on_a_non_module_names_what_it_takes():
    with pytest.raises(graphopt.GraphoptError, match="torch.nn.Module") as e:
        graphopt.optimize(42, (), target="h100")
    assert "comes later" not in str(e.value)
    assert ".onnx" in (e.value.fix or "")


def test_lint_lints_every_target(tmp_path, capsys):
    spec = Path(__file__).parent.parent / "examples" / "resnet_like.py"
    main(["lint", f"{spec}:build", "--target", "v100,h100"])
    out = capsys.readouterr().out
    assert "for NVIDIA Tesla V100" in out and "for NVIDIA H100" in out
    main(["lint", f"{spec}:build", "--target", "v100,h100", "--json"])
    import json

    rows = json.loads(capsys.readouterr().out)
    assert {r["target"] for r in rows} == {"v100", "h100-sxm"}


def test_cli_piped_into_head_exits_quietly(tmp_path):
    spec = Path(__file__).parent.parent / "examples" / "resnet_like.py"
    proc = subprocess.run(f"'{sys.executable}' -m graphopt.cli targets | head -n 1",
                          shell=True, capture_output=True, text=True, timeout=120)
    assert proc.stdout.count("\n") == 1
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
    proc = subprocess.run(f"'{sys.executable}' -m graphopt.cli lint '{spec}:build' "
                          "--target v100 | head -n 1", shell=True, capture_output=True,
                          text=True, timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr


def test_explicit_quantize_the_plan_declines_says_so(tmp_path, capsys):
    """int8_static on a model with no constant-weight GEMM quantizes nothing: say so."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "dyn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8]),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, [8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "dyn.onnx"
    onnx.save_model(model, str(path))
    calib = tmp_path / "c.npz"
    rng = np.random.default_rng(0)
    np.savez(calib, x=rng.standard_normal((2, 2, 8)).astype(np.float32),
             w=rng.standard_normal((2, 8, 8)).astype(np.float32))
    assert main(["optimize", str(path), "-o", str(tmp_path / "o.onnx"), "--target", "cpu",
                 "--quantize", "int8_static", "--calibration", str(calib)]) == 0
    err = capsys.readouterr().err
    assert "quantize='int8_static' was requested but no node was quantized" in err
    assert "not a constant initializer" in err


def test_export_onnx_writes_the_opset_asked_for_each_call(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.GELU()).eval()
    x = torch.randn(2, 16)
    opt = graphopt.optimize(model, (x,), target="cpu", measure=False)
    for opset in (18, 17):
        path = opt.export_onnx(tmp_path / f"m{opset}.onnx", opset=opset)
        proto = onnx.load(str(path))
        assert {o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")} == {opset}
        got = graphopt.ort_session(path).run(None, {proto.graph.input[0].name: x.numpy()})[0]
        np.testing.assert_allclose(got, model(x).detach().numpy(), rtol=1e-5, atol=1e-5)
    with pytest.raises(graphopt.GraphoptError, match="99"):
        opt.export_onnx(tmp_path / "bad.onnx", opset=99)
    assert not (tmp_path / "bad.onnx").exists()
    onnx_opt = graphopt.optimize(str(_mlp_onnx(tmp_path / "in.onnx")), target="cpu",
                                 measure=False)
    with pytest.raises(graphopt.GraphoptError, match="keeps its input's opset 17"):
        onnx_opt.export_onnx(tmp_path / "o.onnx", opset=18)


class _TraceWrites(nn.Module):
    """Writes to itself when traced, as transformers' Swin does (``window_size`` becomes a
    tensor under ``torch.jit.is_tracing()``)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.window = 4

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_tracing():
            self.window = torch.tensor(2)
        return self.lin(x) * self.window


def test_export_torch_never_writes_to_the_users_model():
    from graphopt.frontends.onnx_export import export_torch

    model = _TraceWrites().eval()
    export_torch(model, (torch.randn(2, 8),), verify=False)
    assert model.window == 4 and isinstance(model.window, int)
