"""Which artifact to deploy (issue 21, item 3): measured on this CPU, predicted elsewhere, written
to a folder that ``graphopt.load`` reads back ready to run.

The suite predicts by default (``tests/conftest.py`` sets ``GRAPHOPT_NO_DEPLOY_MEASURE``: each
measurement compiles and exports); the tests that measure turn it off. Every artifact written
is loaded and run on the same inputs as the original model and compared with it. Timings are
never asserted beyond being positive: which artifact wins depends on the machine.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

import graphopt
from graphopt.api.deploy import NO_DEPLOY_MEASURE_ENV
from graphopt.cli.main import main
from graphopt.decisions.deploy.artifact import (
    ARTIFACTS,
    MEASURED_MARGIN,
    ArtifactTiming,
    pick_measured,
)
from graphopt.frontends.onnx_export import export_torch

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning",
                                        "ignore::DeprecationWarning")

#: Inductor's CPU backend compiles C++: without a compiler torch.compile fails at its first call
HAS_CXX = bool(shutil.which("c++") or shutil.which("g++"))
#: OpenVINO is optional (the cpu and dev extras install it)
HAS_OPENVINO = importlib.util.find_spec("openvino") is not None

SPEC = """
import torch

def build():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 32))
    return m.eval(), (torch.randn(8, 64),)
"""


def mlp() -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 32))
    return m.eval(), (torch.randn(8, 64),)


def close_to(reference: torch.Tensor, out: object, rel: float = 1e-4) -> None:
    got = out[0] if isinstance(out, (list, tuple)) else out
    got = torch.as_tensor(np.asarray(got)) if not isinstance(got, torch.Tensor) else got
    err = float((reference - got.float()).abs().max() / reference.abs().max())
    assert err <= rel, err


def rows(**seconds: float | None) -> tuple[ArtifactTiming, ...]:
    return tuple(ArtifactTiming(a.replace("_", "."), s, True) for a, s in seconds.items())


# --- the pick (decisions/deploy/artifact.py case 2) -----------------------------------------------

def test_the_fastest_candidate_within_tolerance_is_chosen_with_its_margin() -> None:
    choice = pick_measured(rows(torch=2e-3, torch_compile=1.5e-3, onnxruntime=1e-3), "m", 3e-3)
    assert choice.artifact == "onnxruntime" and choice.measured
    assert choice.speedup == pytest.approx(2.0) and choice.speedup_vs_original == pytest.approx(3)
    assert "onnxruntime 1.50-1.50x torch.compile: faster" in choice.reason


def test_the_torch_module_stays_unless_another_is_clearly_faster() -> None:
    near = 1e-3 * (1 - MEASURED_MARGIN / 2)
    choice = pick_measured(rows(torch=1e-3, torch_compile=None, onnxruntime=near), "m")
    assert choice.artifact == "torch"
    assert "a tie or slower, the simpler stays" in choice.reason


def _paired(artifact: str, base: float, noise: list[float]) -> ArtifactTiming:
    return ArtifactTiming(artifact, base * min(noise), True,
                          rounds=tuple(base * n for n in noise))


def test_a_tie_between_two_others_keeps_the_simpler() -> None:
    """Issue 33: the margin held only against the torch module, so torch.compile and ORT at
    0.201 against 0.201 ms were decided by noise. Paired rounds (a busy machine's drift hits
    both in a round) give an interval; a tie keeps the simpler artifact, whichever is faster
    by a hair."""
    drift = [1.0, 1.3, 0.9, 1.6, 1.1, 1.0, 1.4]  # other jobs: each round's load, both alike
    hair = [d * w for d, w in zip(drift, [1.0, 0.98, 1.01, 0.99, 1.0, 1.02, 0.99], strict=True)]
    for ort_rounds in (hair, [h * 0.999 for h in hair]):
        timed = (_paired("torch", 2e-4, drift), _paired("torch.compile", 1e-4, drift),
                 _paired("onnxruntime", 1e-4, ort_rounds))
        choice = pick_measured(timed, "m")
        assert choice.artifact == "torch.compile", choice.reason
    clear = [d * 0.8 for d in drift]  # 1.25x in every round, whatever the load
    choice = pick_measured((_paired("torch", 2e-4, drift), _paired("torch.compile", 1e-4, drift),
                            _paired("onnxruntime", 1e-4, clear)), "m")
    assert choice.artifact == "onnxruntime" and "1.25-1.25x torch.compile: faster" in \
        choice.reason


def test_a_failed_or_out_of_tolerance_candidate_is_never_chosen() -> None:
    timed = (ArtifactTiming("torch", 1e-3, True),
             ArtifactTiming("torch.compile", None, None, error="compile failed: boom"),
             ArtifactTiming("onnxruntime", 1e-4, False, note="output 0: max abs 9"))
    choice = pick_measured(timed, "m")
    assert choice.artifact == "torch"
    assert "torch.compile (compile failed: boom)" in choice.reason
    assert "onnxruntime (output 0: max abs 9)" in choice.reason
    none = pick_measured(timed[1:], "m")  # never a crash: the torch module, and why
    assert none.artifact == "torch" and none.reason.startswith("no candidate ran within")


# --- predicted ------------------------------------------------------------------------------

def test_a_gpu_target_or_measure_false_is_predicted_and_says_why(monkeypatch) -> None:
    monkeypatch.setenv(NO_DEPLOY_MEASURE_ENV, "0")
    m, x = mlp()
    gpu = graphopt.optimize(m, x, target="h100").deploy
    assert not gpu.measured and gpu.artifact in ARTIFACTS
    assert "is not this machine's CPU" in gpu.method and "not measured" in gpu.method
    assert {r.artifact for r in gpu.candidates} == set(ARTIFACTS)
    assert all(r.within is None for r in gpu.candidates)  # nothing ran
    off = graphopt.optimize(m, x, target="cpu", measure=False).deploy
    assert not off.measured and off.method.endswith("measure=False")
    assert "estimated torch" in off.reason


def test_an_onnx_input_deploys_its_session(tmp_path: Path) -> None:
    m, x = mlp()
    path = tmp_path / "m.onnx"
    onnx.save(export_torch(m, x).model, str(path))
    opt = graphopt.optimize(str(path), target="cpu", measure=False)
    assert opt.deploy.artifact == "onnxruntime" and not opt.deploy.measured
    assert "one artifact" in opt.deploy.reason
    run = opt.deployed()
    close_to(m(*x).detach(), run(*x))


# --- measured on this CPU ------------------------------------------------------------------

def test_measured_here_every_candidate_runs_and_the_choice_matches_the_original(
        monkeypatch, tmp_path: Path) -> None:
    """The real path: compile, export, time interleaved; the chosen artifact, run from the
    result and from its folder, gives the original's numbers (fp32 pinned: tight)."""
    monkeypatch.setenv(NO_DEPLOY_MEASURE_ENV, "0")
    m, x = mlp()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    opt = graphopt.optimize(m, x, target="cpu", precision="fp32")
    d = opt.deploy
    assert d.measured and d.original_s and d.original_s > 0
    assert [r.artifact for r in d.candidates] == list(ARTIFACTS)
    cannot = {"torch.compile": not HAS_CXX, "openvino": not HAS_OPENVINO}
    for r in d.candidates:
        if cannot.get(r.artifact) or (r.error or "").startswith("not built:"):
            assert r.error and d.artifact != r.artifact, r  # reported, never chosen
            continue
        assert r.error is None and r.within is True and r.seconds and r.seconds > 0, r
    assert "interleaved rounds" in d.method and d.artifact in d.reason
    assert all(torch.equal(v, m.state_dict()[k]) for k, v in before.items())  # untouched
    with torch.no_grad():
        ref = m(*x)
    close_to(ref, opt.deployed()(*x))
    written = opt.save_deploy(tmp_path / "out")
    assert (tmp_path / "out" / "deploy.json") in written
    loaded = graphopt.load(tmp_path / "out")
    record = json.loads((tmp_path / "out" / "deploy.json").read_text())
    assert record["artifact"] == d.artifact and record["measured"] is True
    if d.artifact == "onnxruntime":
        close_to(ref, loaded.run(None, {loaded.get_inputs()[0].name: x[0].numpy()}))
    else:
        with torch.no_grad():
            close_to(ref, loaded(*x))
    opt.save_report(md=str(tmp_path / "r.md"))
    text = (tmp_path / "r.md").read_text()
    assert "## Deploy" in text and "(measured)" in text and "interleaved rounds" in text


# --- the folder, per artifact ----------------------------------------------------------------

@pytest.mark.parametrize("artifact", [
    a if a != "torch.compile" else pytest.param(a, marks=pytest.mark.skipif(
        not HAS_CXX, reason="Inductor needs a C++ compiler")) for a in ARTIFACTS
    if a != "openvino"] + [pytest.param("openvino", marks=pytest.mark.skipif(
        not HAS_OPENVINO, reason="openvino is not installed"))])
def test_each_artifact_writes_a_folder_that_loads_and_runs(artifact: str, tmp_path: Path
                                                           ) -> None:
    m, x = mlp()
    opt = graphopt.optimize(m, x, target="cpu", precision="fp32")
    opt.deploy = replace(opt.deploy, artifact=artifact)  # as if it had won
    written = opt.save_deploy(tmp_path / "d")
    names = sorted(p.name for p in written)
    expected = {"torch": ["deploy.json", "model.pt2"],
                "torch.compile": ["deploy.json", "model.pt2"],
                "onnxruntime": ["deploy.json", "model.graphopt.json", "model.onnx"],
                "openvino": ["deploy.json", "model.onnx", "model.openvino.json"]}[artifact]
    assert names == expected
    loaded = graphopt.load(tmp_path / "d")
    with torch.no_grad():
        ref = m(*x)
        if artifact == "onnxruntime":
            close_to(ref, loaded.run(None, {loaded.get_inputs()[0].name: x[0].numpy()}))
        else:
            close_to(ref, loaded(*x))
    if artifact == "torch.compile":
        assert type(loaded).__name__ == "OptimizedModule" and hasattr(loaded, "_orig_mod")


@pytest.mark.parametrize("record, problem", [
    ('{"artifact": "../../etc/passwd"}', "names no artifact graphopt writes"),
    ('{"artifact": "torch.compile", "compile_mode": "os.system"}', "is not a torch.compile mode"),
    ("[1, 2]", "names no artifact graphopt writes"),
    ("{not json", "cannot read"),
])
def test_a_hostile_deploy_record_is_refused(record: str, problem: str, tmp_path: Path) -> None:
    (tmp_path / "deploy.json").write_text(record)
    with pytest.raises(graphopt.GraphoptError, match=problem):
        graphopt.load(tmp_path)


def test_a_folder_without_a_record_is_not_a_deploy_folder(tmp_path: Path) -> None:
    with pytest.raises(graphopt.GraphoptError, match="without deploy.json"):
        graphopt.load(tmp_path)
    (tmp_path / "deploy.json").mkdir()
    with pytest.raises(graphopt.GraphoptError, match="deploy record"):
        graphopt.load(tmp_path)


# --- the CLI and the report --------------------------------------------------------------------

def test_cli_writes_the_recommended_artifact_into_a_folder(tmp_path: Path, capsys) -> None:
    spec = tmp_path / "m.py"
    spec.write_text(SPEC)
    out = tmp_path / "out"
    rc = main(["optimize", f"{spec}:build", "--target", "cpu", "--precision", "fp32",
               "-o", f"{out}/", "--md", str(tmp_path / "r.md")])
    said = capsys.readouterr().out
    assert rc == 0, said
    record = json.loads((out / "deploy.json").read_text())
    assert f"deploy {record['artifact']}" in said and "(predicted, not measured)" in said
    assert (out / ("model.onnx" if record["artifact"] == "onnxruntime" else "model.pt2")).is_file()
    assert "## Deploy" in (tmp_path / "r.md").read_text()
    m, x = mlp()
    loaded = graphopt.load(out)
    with torch.no_grad():
        if record["artifact"] == "onnxruntime":
            close_to(m(*x), loaded.run(None, {loaded.get_inputs()[0].name: x[0].numpy()}))
        else:
            close_to(m(*x), loaded(*x))


def test_cli_refuses_a_folder_path_that_is_a_file_before_the_work(tmp_path: Path,
                                                                 capsys) -> None:
    spec = tmp_path / "m.py"
    spec.write_text(SPEC)
    (tmp_path / "f").write_text("a file")
    rc = main(["optimize", f"{spec}:build", "--target", "cpu", "-o", f"{tmp_path / 'f'}/"])
    assert rc == 2 and "deploy record" in capsys.readouterr().err


def test_the_report_shows_the_deploy_section_in_every_format(tmp_path: Path) -> None:
    m, x = mlp()
    opt = graphopt.optimize(m, x, target="h100")
    opt.save_report(json=str(tmp_path / "r.json"), md=str(tmp_path / "r.md"),
                    html=str(tmp_path / "r.html"))
    data = json.loads((tmp_path / "r.json").read_text())
    deploy = data["deploy"] if "deploy" in data else data["plans"][0]["deploy"]
    assert deploy["artifact"] == opt.deploy.artifact and deploy["measured"] is False
    assert [c["artifact"] for c in deploy["candidates"]] == list(ARTIFACTS)
    assert "## Deploy" in (tmp_path / "r.md").read_text()
    assert "<h3>Deploy</h3>" in (tmp_path / "r.html").read_text()
