"""``Optimized.save`` / ``graphopt.load`` (issue 11 item 3): one ``.pt2`` file, loaded in a
fresh process that never imports the model's class, equal to the original model over the
shape range; every pass's output saves; bad files and failed saves give a GraphoptError and
leave the target alone.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from torch import nn

import graphopt
from graphopt.cli.main import main as cli_main

# the fresh process: graphopt and torch only; inputs and outputs go through tensor-only files
_FRESH = """
import json, sys, torch, graphopt
m = graphopt.load(sys.argv[1])
outs = []
for args in torch.load(sys.argv[2], weights_only=True):
    try:
        outs.append(m(*args))
    except graphopt.GraphoptError as e:
        outs.append("GraphoptError: " + str(e))
torch.save(outs, sys.argv[3])
print(json.dumps({"target": m.plan["target"]["name"], "device": m.runtime_settings.device,
                  "range": m.shape_range.describe() if m.shape_range else None,
                  "model_modules": [k for k in sys.modules if "test_save_load" in k]}))
"""


def _fresh(path: Path, calls: list[tuple[torch.Tensor, ...]], tmp: Path) -> tuple[list, dict]:
    torch.save(calls, tmp / "calls.pt")
    done = subprocess.run([sys.executable, "-c", _FRESH, str(path), str(tmp / "calls.pt"),
                           str(tmp / "outs.pt")], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts["model_modules"] == []  # the model's class was never imported there
    return torch.load(tmp / "outs.pt", weights_only=True), facts


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 12, 3, padding=1)
        self.bn = nn.BatchNorm2d(12)
        self.fc = nn.Linear(12, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x))).mean((2, 3))
        return self.fc(y) + torch.arange(10, dtype=y.dtype, device=y.device)


class Tokens(nn.Module):
    """Two inputs sized by the same dims (batch, seq): the saved Dims must be shared."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 32)
        self.out = nn.Linear(32, 16)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.proj(x))) * mask.unsqueeze(-1)


def _convnet() -> nn.Module:
    torch.manual_seed(0)
    m = ConvNet().eval()
    with torch.no_grad():
        m.bn.running_mean.uniform_(-0.5, 0.5)
        m.bn.running_var.uniform_(0.5, 2.0)
    return m


def _close(got: object, want: torch.Tensor, rtol: float = 1e-5) -> None:
    assert isinstance(got, torch.Tensor), got
    torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=rtol)


@pytest.mark.slow
def test_static_model_round_trip_in_fresh_process(tmp_path: Path) -> None:
    m = _convnet()
    x = torch.randn(2, 3, 8, 8)
    # fp32 pinned: target "cpu" picks bf16 on a host with native bf16, and this test is
    # about the round trip at fp32 tolerance, not the host's precision choice
    opt = graphopt.optimize(m, x, target="cpu", precision="fp32", measure=False)
    assert "cleanup" in opt.info.passes_applied
    path = opt.save(tmp_path / "model.pt2")
    x2 = torch.randn(2, 3, 8, 8)
    outs, facts = _fresh(path, [(x,), (x2,), (torch.randn(3, 3, 8, 8),)], tmp_path)
    _close(outs[0], m(x))
    _close(outs[1], m(x2))
    assert "built for inputs of shapes" in outs[2]
    assert facts["target"] == "cpu" and facts["device"] == "cpu" and facts["range"] is None


@pytest.mark.slow
def test_dynamic_model_round_trip_in_fresh_process(tmp_path: Path) -> None:
    torch.manual_seed(0)
    m = Tokens().eval()
    batch = torch.export.Dim("batch", min=1, max=16)
    seq = torch.export.Dim("seq", min=2, max=64)
    x, mask = torch.randn(4, 8, 16), torch.ones(4, 8)
    opt = graphopt.optimize(m, (x, mask), target="cpu", precision="fp32", measure=False,
                            dynamic_shapes=({0: batch, 1: seq}, {0: batch, 1: seq}))
    path = opt.save(tmp_path / "tokens.pt2")
    calls = [(torch.randn(b, s, 16), (torch.rand(b, s) > 0.3).float())
             for b, s in ((1, 2), (4, 8), (7, 33), (16, 64))]
    outs, facts = _fresh(path, [*calls, (torch.randn(17, 8, 16), torch.ones(17, 8)),
                                (torch.randn(2, 8, 16), torch.ones(3, 8))], tmp_path)
    for (a, b), got in zip(calls, outs, strict=False):
        _close(got, m(a, b))
    assert "batch in [1, 16]" in outs[4] and "17" in outs[4]  # the range error, after load
    assert "dim batch is 2 in one input and 3" in outs[5]
    assert facts["range"] == "batch in [1, 16], seq in [2, 64]"


PASSES = {  # every pass's output, each config asserted to have applied its pass
    "cleanup": ({"target": "cpu", "precision": "fp32"}, "cleanup"),
    "padding": ({"target": "h100", "pad": "always"}, "padding"),
    "layout": ({"target": "h100", "layout": "channels_last"}, "layout"),
    "bf16": ({"target": "h100", "precision": "bf16"}, "precision"),
    "fp16": ({"target": "v100", "precision": "fp16"}, "precision"),
    # fp32 pinned: an explicit or host-chosen bf16 turns INT8 off, and hosts differ
    "int8": ({"target": "cpu", "precision": "fp32", "quantize": "int8"}, "quantize"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(PASSES))
@pytest.mark.parametrize("ranged", [False, True], ids=["static", "range"])
def test_every_pass_saves_and_loads(case: str, ranged: bool, tmp_path: Path) -> None:
    options, applied = PASSES[case]
    m = _convnet()
    dyn = ({0: torch.export.Dim("batch", min=1, max=8)},) if ranged else None
    opt = graphopt.optimize(m, torch.randn(4, 3, 8, 8), measure=False, dynamic_shapes=dyn,
                            **options)
    assert applied in opt.info.passes_applied, opt.info.passes_reverted
    loaded = graphopt.load(opt.save(tmp_path / f"{case}.pt2"))
    for b in ((1, 4, 8) if ranged else (4,)):
        x = torch.randn(b, 3, 8, 8)
        with torch.no_grad():
            torch.testing.assert_close(loaded(x), opt.module(x), rtol=0, atol=0)  # same graph
            tol = opt.info.tolerance.rel_to_scale
            ref = m(x)
            assert (loaded(x).float() - ref).abs().max() <= tol * ref.abs().max()
    targets = {str(n.target) for n in loaded.graph_module.graph.nodes}
    if case == "int8":  # re-packed at load: the same kernel, not a dequantized copy
        assert "quantized.linear_dynamic.default" in targets
    assert loaded.plan["target"]["name"] == opt.plan.target.name
    assert loaded.runtime_settings == opt.runtime_settings
    assert loaded._runtime == opt.module._runtime


def test_device_argument(tmp_path: Path) -> None:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 8), nn.ReLU()).eval()
    x = torch.randn(2, 8)
    path = graphopt.optimize(m, x, target="cpu", precision="fp32", measure=False).save(
        tmp_path / "m.pt2")
    _close(graphopt.load(path, device="cpu")(x), m(x))
    if not torch.cuda.is_available():
        with pytest.raises(graphopt.GraphoptError, match="cannot move the saved model"):
            graphopt.load(path, device="cuda")


def _bad_files(tmp: Path, good: Path) -> dict[str, tuple[Path, str]]:
    text = tmp / "notes.pt2"
    text.write_text("not a model\n")
    truncated = tmp / "truncated.pt2"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    pickled = tmp / "weights.pt2"
    torch.save({"w": torch.ones(2)}, pickled)
    plain = tmp / "plain.pt2"

    class Add(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + 1

    torch.export.save(torch.export.export(Add(), (torch.ones(2),)), plain)
    other_zip = tmp / "other.zip"
    with zipfile.ZipFile(other_zip, "w") as z:
        z.writestr("readme.txt", "hello")
    bad_marker = tmp / "bad_marker.pt2"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(bad_marker, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            dst.writestr(item, b"{not json" if item.filename.endswith(
                "graphopt_format.json") else data)
    return {"text": (text, "not a zip archive"), "truncated": (truncated, "truncated or corrupt"),
            "torch.save": (pickled, "a torch.save file without graphopt's marker"),
            "torch.export": (plain, "a torch.export archive without graphopt's marker"),
            "zip": (other_zip, "a zip archive without graphopt's marker"),
            "marker": (bad_marker, "damaged graphopt archive"),
            "missing": (tmp / "nothere.pt2", "no saved model at")}


def test_corrupt_and_foreign_files(tmp_path: Path) -> None:
    m = nn.Linear(4, 4).eval()
    good = graphopt.optimize(m, torch.randn(2, 4), target="cpu", measure=False).save(
        tmp_path / "good.pt2")
    for kind, (path, problem) in _bad_files(tmp_path, good).items():
        with pytest.raises(graphopt.GraphoptError) as info:
            graphopt.load(path)
        assert problem in info.value.problem, (kind, info.value.problem)
        assert info.value.fix, kind  # every error says what to do


def test_failed_save_leaves_target_untouched(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    opt = graphopt.optimize(nn.Linear(4, 4).eval(), torch.randn(2, 4), target="cpu",
                            measure=False)
    target = tmp_path / "model.pt2"
    target.write_bytes(b"the previous model")

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("serializer exploded")

    monkeypatch.setattr(torch.export, "save", broken)
    with pytest.raises(graphopt.GraphoptError, match="cannot serialize"):
        opt.save(target)
    assert target.read_bytes() == b"the previous model"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt2"]  # no temp file left


def test_save_refuses_the_model_source_file(tmp_path: Path) -> None:
    source = tmp_path / "mymodel.py"
    text = "import torch\nclass M(torch.nn.Module):\n    def forward(self, x):\n" \
           "        return x * 2\n"
    source.write_text(text)
    spec = importlib.util.spec_from_file_location("mymodel_for_save_test", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    opt = graphopt.optimize(module.M().eval(), torch.randn(2, 3), target="cpu", measure=False)
    with pytest.raises(graphopt.GraphoptError, match="input file"):
        opt.save(source)
    assert source.read_text() == text


@pytest.mark.slow
def test_cli_optimize_to_pt2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "m.py"
    spec.write_text(
        "import torch\n"
        "def build():\n"
        "    torch.manual_seed(0)\n"
        "    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),\n"
        "                            torch.nn.Linear(32, 8)).eval()\n"
        "    batch = torch.export.Dim('batch', min=1, max=32)\n"
        "    return m, (torch.randn(4, 16),), ({0: batch},)\n")
    out, report = tmp_path / "model.pt2", tmp_path / "report.json"
    code = cli_main(["optimize", f"{spec}:build", "--target", "h100", "-o", str(out),
                     "--json", str(report)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert f"wrote {out}" in printed and "batch in [1, 32]" in printed
    assert json.loads(report.read_text())["target"]["name"] == "h100-sxm"
    namespace: dict[str, object] = {}
    exec(compile(spec.read_text(), str(spec), "exec"), namespace)
    model, _, _ = namespace["build"]()
    calls = [(torch.randn(b, 16),) for b in (1, 4, 32)]
    outs, facts = _fresh(out, calls, tmp_path)
    tol = json.loads(report.read_text())["optimization"]["tolerance"]["rel_to_scale"]
    for (x,), got in zip(calls, outs, strict=True):
        ref = model(x)
        assert (got.float() - ref).abs().max() <= tol * ref.abs().max()
    assert facts["target"] == "h100-sxm" and facts["device"] == "cuda"


def test_cli_pt2_needs_a_torch_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                     ) -> None:
    code = cli_main(["optimize", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "m.pt2")])
    assert code == 2
    assert "saves a torch module" in capsys.readouterr().err


def test_saves_the_model_copy_when_nothing_paid(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """On the host CPU, optimize hands back a copy of the model when the rewritten graph
    measured slower; that copy saves and loads as well (nested weight names included)."""
    import graphopt.backends.torch.pipeline as pipeline

    monkeypatch.setattr(pipeline, "_slower_than_original",
                        lambda *a: "measured slower (forced by the test)")
    m = _convnet()
    x = torch.randn(2, 3, 8, 8)
    opt = graphopt.optimize(m, x, target="cpu", measure=True)
    assert isinstance(opt.module, ConvNet)  # the fallback: the model itself, copied
    loaded = graphopt.load(opt.save(tmp_path / "copy.pt2"))
    _close(loaded(x), m(x))
    with pytest.raises(graphopt.GraphoptError, match="built for inputs of shapes"):
        loaded(torch.randn(3, 3, 8, 8))


@pytest.mark.parametrize("ranged", [False, True], ids=["static", "range"])
def test_loaded_gpu_module_runs_on_fake_cuda(ranged: bool, tmp_path: Path) -> None:
    """A module saved on this CPU for an H100 runs on CUDA after load: its constants are
    buffers and its factory calls (the ``arange``) follow the input's device, as before save."""
    from tests.fake_cuda import run_fake_cuda

    dyn = ({0: torch.export.Dim("batch", min=1, max=8)},) if ranged else None
    opt = graphopt.optimize(_convnet(), torch.randn(4, 3, 8, 8), target="h100", pad="always",
                            layout="channels_last", precision="bf16", measure=False,
                            dynamic_shapes=dyn)
    assert {"padding", "layout", "precision"} <= set(opt.info.passes_applied)
    loaded = graphopt.load(opt.save(tmp_path / "h100.pt2"))
    for b in ((1, 8) if ranged else (4,)):
        (out,) = run_fake_cuda(loaded, (torch.randn(b, 3, 8, 8),))
        assert out.device.type == "cuda" and tuple(out.shape) == (b, 10)


def test_the_plain_copy_of_a_sequential_saves_and_loads(tmp_path: Path) -> None:
    """When nothing pays on the host, optimize hands back a plain copy of the model; a
    Sequential's weights (``0.weight``) flatten to no identifier (``0_weight``), so the reader
    names them ``_0_weight`` (the file failed to load before)."""
    import copy

    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8)).eval()
    x = (torch.randn(4, 16),)
    opt = graphopt.optimize(m, x, target="cpu", precision="fp32", measure=False)
    opt.module = copy.deepcopy(m)  # what the measured fallback returns
    opt.save(tmp_path / "m.pt2")
    loaded = graphopt.load(tmp_path / "m.pt2")
    with torch.no_grad():
        torch.testing.assert_close(loaded(*x), m(*x), rtol=1e-5, atol=1e-6)
