"""OpenVINO as a deploy candidate on CPUs (issue 34, item 1): graphopt's optimized ONNX model
compiled by OpenVINO, checked against the original model like the other candidates, written to
a deploy folder that loads in a fresh process, and predicted from a calibration that timed it.

Without ``openvino`` the other candidates still run and the report says why OpenVINO was not
tried (tested by making it unimportable). Which precision OpenVINO runs at depends on the CPU
(bf16 only where native): the tests read it from the compiled model and check each precision
against its own budget, and the precision rule itself is tested on given capabilities.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import logging
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import graphopt
from graphopt.api.deploy import NO_DEPLOY_MEASURE_ENV
from graphopt.api.deploy_record import read_record
from graphopt.backends.openvino.runner import cpu_capabilities
from graphopt.cost.calibrated import CALL_KEY, call_cost, for_runtime, runtime_tables
from graphopt.decisions.deploy.artifact import ARTIFACTS, predict_deploy
from graphopt.decisions.deploy.openvino import inference_precision, reduced_budget
from graphopt.decisions.tolerance import Tolerance, tolerance_for
from graphopt.hardware.detect import host_cpu_profile
from graphopt.ir.options import Options
from graphopt.ir.plan_deploy import Artifact, ArtifactTiming, DeployChoice
from graphopt.measure import deploy_runs, host_cache
from graphopt.measure.calibrate_openvino import ov_fixed_costs, with_openvino_costs
from graphopt.report.deploy import deploy_rows

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning",
                                        "ignore::DeprecationWarning")

HAS_OPENVINO = importlib.util.find_spec("openvino") is not None
needs_openvino = pytest.mark.skipif(not HAS_OPENVINO, reason="openvino is not installed")
HAS_CXX = bool(shutil.which("c++") or shutil.which("g++"))
NOT_INSTALLED = "openvino is not installed: pip install openvino (or graphopt[cpu])"


class SmallCnn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.fc = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv1(x)))
        y = torch.relu(self.conv2(y)).mean((2, 3))
        return self.fc(y)


class MlpBlock(nn.Module):
    """A transformer's feed-forward half: LayerNorm, up, GELU, down, residual."""

    def __init__(self, d: int = 64) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def cnn() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    m = SmallCnn().eval()
    with torch.no_grad():  # a trained-looking BatchNorm: not the identity
        m.bn.running_mean.uniform_(-0.5, 0.5)
        m.bn.running_var.uniform_(0.5, 2.0)
    return m, (torch.randn(2, 3, 16, 16),)


def mlp_block() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return MlpBlock().eval(), (torch.randn(2, 12, 64),)


MODELS = {"cnn": cnn, "mlp_block": mlp_block}


def rel_error(reference: torch.Tensor, out: object) -> tuple[float, float]:
    """(max |ref - out| / max |ref|, cosine) of one output."""
    got = torch.as_tensor(np.asarray(out)).float().flatten()
    ref = reference.detach().float().flatten()
    err = float((ref - got).abs().max() / ref.abs().max())
    cos = float(torch.nn.functional.cosine_similarity(ref, got, dim=0))
    return err, cos


def budget(opt: object, precision: str) -> Tolerance:
    """The stated tolerance of the OpenVINO row: the ONNX artifact's budget (at least the
    1e-4 of scale every compiled artifact gets for reordered float sums), bf16's where it runs
    bf16."""
    onnx_tol = opt.onnx_info.tolerance  # type: ignore[attr-defined]
    base = Tolerance(max(float(onnx_tol.rel_to_scale), 1e-4), min(float(onnx_tol.min_cosine),
                                                                  0.9999))
    return reduced_budget(base, None) if precision == "bf16" else base


def forced_openvino(name: str) -> tuple[nn.Module, tuple[torch.Tensor, ...], object]:
    """(model, inputs, the optimize result with OpenVINO as its deploy choice, as if it won)."""
    m, x = MODELS[name]()
    opt = graphopt.optimize(m, x, target="cpu", measure=False)  # the passes as planned
    opt.deploy = replace(opt.deploy, artifact=Artifact.OPENVINO)
    return m, x, opt


# --- (a) the candidate's outputs against the original ------------------------------------------

@needs_openvino
@pytest.mark.parametrize("name", sorted(MODELS))
def test_openvino_runs_the_optimized_onnx_within_its_budget(name: str) -> None:
    m, x, opt = forced_openvino(name)
    run = opt.deployed()
    assert run.artifact == "openvino"
    precision = run.session.precision
    expected = "bf16" if "BF16" in cpu_capabilities() else "f32"
    assert precision == expected
    tol = budget(opt, precision)
    torch.manual_seed(1)
    for inputs in (x, tuple(torch.randn_like(t) for t in x)):  # the example and a fresh batch
        with torch.no_grad():
            ref = m(*inputs)
        err, cos = rel_error(ref, run(*inputs))
        assert err <= tol.rel_to_scale and cos >= tol.min_cosine, (err, cos, tol)
        numpy_out = run(*(t.numpy() for t in inputs))  # numpy in, numpy out
        assert isinstance(numpy_out, np.ndarray)
        assert rel_error(ref, numpy_out)[0] <= tol.rel_to_scale
    if precision == "f32":
        assert err <= 1e-4  # the same graph in fp32: reordered sums only


@needs_openvino
def test_openvino_takes_the_shape_range() -> None:
    """The export keeps the range's dims symbolic; OpenVINO compiles them dynamic and the
    runner resizes its inputs per call."""
    m, x = mlp_block()
    batch = torch.export.Dim("batch", min=1, max=16)
    opt = graphopt.optimize(m, x, target="cpu", measure=False, dynamic_shapes=({0: batch},))
    opt.deploy = replace(opt.deploy, artifact=Artifact.OPENVINO)
    run = opt.deployed()
    tol = budget(opt, run.session.precision)
    for n in (1, 5, 16, 2):
        y = torch.randn(n, 12, 64)
        with torch.no_grad():
            ref = m(y)
        out = run(y)
        assert out.shape == ref.shape and rel_error(ref, out)[0] <= tol.rel_to_scale
    with pytest.raises(graphopt.GraphoptError, match="float32, a float64 array was given"):
        run(np.zeros((2, 12, 64)))


@needs_openvino
@pytest.mark.slow
def test_measured_here_openvino_is_a_checked_and_timed_candidate(monkeypatch) -> None:
    """The real path: built, checked by the guard against the original, timed interleaved."""
    monkeypatch.setenv(NO_DEPLOY_MEASURE_ENV, "0")
    m, x = mlp_block()
    opt = graphopt.optimize(m, x, target="cpu")
    d = opt.deploy
    assert d.measured and [r.artifact for r in d.candidates] == list(ARTIFACTS)
    row = d.row(Artifact.OPENVINO)
    assert row is not None and row.error is None and row.within is True, row
    assert row.seconds and row.seconds > 0 and len(row.rounds) >= deploy_runs.MIN_ROUNDS
    precision = "bf16" if "BF16" in cpu_capabilities() else "f32"
    assert f"{precision} inference precision" in row.note and "max abs" in row.note
    assert ("checked at bf16's budget" in row.note) == (precision == "bf16")
    tol = budget(opt, precision)
    with torch.no_grad():
        err, cos = rel_error(m(*x), opt.deployed_runners["openvino"](*x))
    assert err <= tol.rel_to_scale and cos >= tol.min_cosine
    md = opt.plan.to_markdown()
    assert "| openvino" in md[md.index("## Deploy"):]


# --- (b) the deploy folder, loaded in a fresh process ----------------------------------------

_FRESH = """
import json, sys, numpy as np, graphopt
folder, x, ref = sys.argv[1:4]
loaded = graphopt.load(folder)
out = loaded(np.load(x))
ref = np.load(ref)
print(json.dumps({"type": type(loaded).__name__, "artifact": loaded.artifact,
                  "precision": loaded.session.precision, "numpy": isinstance(out, np.ndarray),
                  "err": float(np.abs(out - ref).max() / np.abs(ref).max()),
                  "torch": "torch" in sys.modules}))
"""


@pytest.fixture(scope="module")
def ov_folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path], object]:
    if not HAS_OPENVINO:
        pytest.skip("openvino is not installed")
    m, x, opt = forced_openvino("cnn")
    folder = tmp_path_factory.mktemp("ov") / "out"
    written = opt.save_deploy(folder)
    return folder, written, (m, x, opt)


def test_an_openvino_folder_loads_in_a_fresh_process_and_matches(ov_folder, tmp_path) -> None:
    folder, written, (m, x, opt) = ov_folder
    assert sorted(p.name for p in written) == ["deploy.json", "model.onnx", "model.openvino.json"]
    record = json.loads((folder / "deploy.json").read_text())
    assert record["artifact"] == "openvino" and record["compile_config"] == "model.openvino.json"
    config = json.loads((folder / "model.openvino.json").read_text())
    precision = opt.deployed().session.precision
    assert config["inference_precision"] == precision and config["num_threads"] is None
    with torch.no_grad():
        ref = m(*x)
    np.save(tmp_path / "x.npy", x[0].numpy())
    np.save(tmp_path / "ref.npy", ref.numpy())
    done = subprocess.run([sys.executable, "-c", _FRESH, str(folder), str(tmp_path / "x.npy"),
                           str(tmp_path / "ref.npy")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts["type"] == "Deployed" and facts["artifact"] == "openvino" and facts["numpy"]
    assert facts["precision"] == precision
    assert facts["err"] <= budget(opt, precision).rel_to_scale, facts
    assert not facts["torch"]  # numpy in, numpy out: the loaded folder never needs torch
    loaded = graphopt.load(folder)  # here too, with torch tensors and the ORT-shaped session
    err, _ = rel_error(ref, loaded(*x))
    assert err <= budget(opt, precision).rel_to_scale
    name = loaded.session.get_inputs()[0].name
    assert rel_error(ref, loaded.session.run(None, {name: x[0].numpy()})[0])[0] == err


def test_a_folder_checked_at_bf16_runs_where_the_cpu_allows(ov_folder, tmp_path, caplog
                                                           ) -> None:
    """A bf16 config loads on any CPU: bf16 where OpenVINO has it natively, else f32 with a
    warning (OpenVINO's own fallback, more accurate); both within bf16's budget."""
    folder, _, (m, x, opt) = ov_folder
    copy = tmp_path / "bf16"
    shutil.copytree(folder, copy)
    (copy / "model.openvino.json").write_text(json.dumps({"inference_precision": "bf16"}))
    with caplog.at_level(logging.WARNING):
        loaded = graphopt.load(copy)
    native = "BF16" in cpu_capabilities()
    assert loaded.session.precision == ("bf16" if native else "f32")
    assert ("checked at bf16 inference precision" in caplog.text) is not native
    with torch.no_grad():
        err, cos = rel_error(m(*x), loaded(*x))
    assert err <= budget(opt, "bf16").rel_to_scale and cos >= budget(opt, "bf16").min_cosine


@pytest.mark.parametrize("config, problem", [
    ({"inference_precision": "fp64"}, "inference_precision is 'fp64', not one of f32, bf16"),
    ({"num_threads": 100_000}, "num_threads is 100000"),
    ({"num_threads": True}, "num_threads is True"),
    ({"device": "GPU"}, "field 'device' is not one graphopt writes"),
    ([1, 2], "is list, not a JSON object"),
    (None, "is missing"),
])
def test_a_malformed_compile_config_is_refused_by_name(ov_folder, tmp_path, config, problem
                                                       ) -> None:
    copy = tmp_path / "d"
    shutil.copytree(ov_folder[0], copy)
    path = copy / "model.openvino.json"
    if config is None:
        path.unlink()
    else:
        path.write_text(json.dumps(config))
    with pytest.raises(graphopt.GraphoptError) as err:
        graphopt.load(copy)
    assert problem in err.value.problem and str(path) in err.value.problem


def test_openvino_loads_on_the_cpu_only(ov_folder) -> None:
    with pytest.raises(graphopt.GraphoptError, match="runs on this machine's CPU"):
        graphopt.load(ov_folder[0], device="cuda")


# --- (d) deploy.json ------------------------------------------------------------------------

@pytest.mark.parametrize("record, problem", [
    ({"artifact": "openvino", "file": "model.pt2"},
     "file is 'model.pt2'; the openvino artifact's is 'model.onnx'"),
    ({"artifact": "openvino", "compile_config": "../../etc/passwd"},
     "compile_config is '../../etc/passwd'; the openvino artifact's is 'model.openvino.json'"),
    ({"artifact": "openvino", "session_config": "model.graphopt.json"},
     "session_config is 'model.graphopt.json'; the openvino artifact has none"),
    ({"artifact": "onnxruntime", "compile_config": "model.openvino.json"},
     "compile_config is 'model.openvino.json'; the onnxruntime artifact has none"),
    ({"artifact": "openvino", "candidates": [{"artifact": "openvino", "seconds": -1}]},
     "candidates is"),
    ({"artifact": "openvino", "precision": "bf16"}, "field 'precision' is not one graphopt"),
])
def test_read_record_refuses_a_malformed_openvino_record(record: dict, problem: str,
                                                         tmp_path: Path) -> None:
    (tmp_path / "deploy.json").write_text(json.dumps(record))
    with pytest.raises(graphopt.GraphoptError) as err:
        read_record(tmp_path, 1 << 20, "write it again")
    assert problem in err.value.problem and "deploy.json" in err.value.problem


def test_read_record_accepts_the_record_graphopt_writes(tmp_path: Path) -> None:
    record = {"artifact": "openvino", "file": "model.onnx", "compile_config":
              "model.openvino.json", "load": "graphopt.load('out')",
              **DeployChoice.of("openvino", True, "r", (ArtifactTiming(Artifact.OPENVINO, 1e-4,
                                                                       True),), "m").to_json()}
    (tmp_path / "deploy.json").write_text(json.dumps(record))
    assert read_record(tmp_path, 1 << 20, "fix")["artifact"] == "openvino"


# --- (c) without openvino ----------------------------------------------------------------------

@pytest.mark.slow
def test_without_openvino_the_others_run_and_the_report_says_why(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "openvino", None)  # `import openvino` now fails
    monkeypatch.setenv(NO_DEPLOY_MEASURE_ENV, "0")
    m, x = mlp_block()
    opt = graphopt.optimize(m, x, target="cpu", precision="fp32")
    d = opt.deploy
    assert d.measured and [r.artifact for r in d.candidates] == list(ARTIFACTS)
    ov = d.row(Artifact.OPENVINO)
    assert ov is not None and ov.seconds is None and ov.error == NOT_INSTALLED
    for r in d.candidates:
        if r.artifact == Artifact.OPENVINO or (r.artifact == "torch.compile" and (
                not HAS_CXX or (r.error or "").startswith("not built:"))):
            continue
        assert r.error is None and r.within is True and r.seconds and r.seconds > 0, r
    assert d.artifact != "openvino" and f"openvino ({NOT_INSTALLED})" in d.reason
    md = opt.plan.to_markdown()
    section = md[md.index("## Deploy"):]
    section = section[:section.index("\n## ")]
    said = NOT_INSTALLED.replace("[", "\\[").replace("]", "\\]")  # Markdown-escaped
    assert f"| openvino |  |  |  |  | {said} |" in section
    with torch.no_grad():
        err, _ = rel_error(m(*x), opt.deployed()(*x))
    assert err <= 1e-4


def test_without_openvino_a_forced_choice_says_how_to_get_it(monkeypatch) -> None:
    m, x = mlp_block()
    opt = graphopt.optimize(m, x, target="cpu", measure=False)
    monkeypatch.setitem(sys.modules, "openvino", None)
    opt.deploy = replace(opt.deploy, artifact=Artifact.OPENVINO)
    with pytest.raises(graphopt.GraphoptError) as err:
        opt.deployed()
    assert err.value.problem == NOT_INSTALLED and "graphopt[cpu]" in err.value.fix
    assert ov_fixed_costs(rounds=2, warmup=1) == {}  # calibration leaves OpenVINO out


# --- the precision rule, on given capabilities ------------------------------------------------

@pytest.mark.parametrize("caps, requested, precision", [
    (["FP32", "INT8", "BIN", "EXPORT_IMPORT"], "auto", "f32"),  # AVX2 / AVX-512 without BF16
    (["FP32", "BF16", "FP16", "INT8", "BIN"], "auto", "bf16"),  # AMX, AVX512-BF16
    (["FP32", "BF16", "INT8"], None, "bf16"),  # an ONNX input: no precision option
    (["FP32", "BF16", "INT8"], "bf16", "bf16"),
    (["FP32", "BF16", "INT8"], "fp32", "f32"),  # a pinned precision holds here too
    (["FP32", "INT8"], "bf16", "f32"),  # asked, not native: emulated bf16 is slower
])
def test_bf16_only_where_openvino_has_it_natively(caps, requested, precision) -> None:
    got, why = inference_precision(caps, requested)
    assert got == precision and why


def test_bf16_is_checked_at_bf16s_budget_or_the_users() -> None:
    onnx_budget = Tolerance(1e-4, 0.9999)
    assert reduced_budget(onnx_budget, None) == tolerance_for("bf16")
    assert reduced_budget(onnx_budget, Options(tolerance=0.01)).rel_to_scale == 0.01
    int8 = Tolerance(5e-2, 0.999)  # an INT8 export's own budget is the wider: it stays
    assert reduced_budget(int8, None).rel_to_scale == 5e-2


# --- prediction from the calibration (item 5) ------------------------------------------------

def _calibrated(**costs: float) -> object:
    """The host profile as a calibration would leave it: eager costs 20 us an op."""
    host = host_cpu_profile()
    return replace(host, launch_overhead_s=2e-5, op_overhead_s=dict(costs))


def test_the_predicted_choice_can_name_openvino() -> None:
    m, x = mlp_block()
    ov_costs = {"ov:" + op: 1e-6 for op in ("MatMul", "Add", "Erf", "LayerNormalization")}
    fast_ov = _calibrated(**ov_costs, **{"ov:" + CALL_KEY: 5e-6})
    plan = graphopt.plan(m, x, target=fast_ov)
    choice = predict_deploy(plan, torch_model=True, not_measured="a test")
    ov = choice.row(Artifact.OPENVINO)
    assert ov is not None and ov.seconds and "OpenVINO's measured fixed cost" in ov.note
    assert choice.artifact == "openvino" and not choice.measured, choice.reason
    # ONNX Runtime measured as cheap per op, and OpenVINO's call cost on top: not 10% faster
    both = _calibrated(**ov_costs, **{"ov:" + CALL_KEY: 5e-6},
                       **{"ort:" + op: 1e-6 for op in ("MatMul", "Add", "Erf",
                                                       "LayerNormalization")})
    choice = predict_deploy(graphopt.plan(m, x, target=both), torch_model=True,
                            not_measured="a test")
    assert choice.artifact == "onnxruntime", choice.reason
    assert "openvino is not predicted 10% faster" in choice.reason


def test_without_openvino_costs_the_row_says_why_not_estimated() -> None:
    m, x = mlp_block()
    cpu = predict_deploy(graphopt.plan(m, x, target="cpu"), torch_model=True,
                         not_measured="a test").row(Artifact.OPENVINO)
    assert cpu is not None and cpu.seconds is None and "not estimated" in cpu.note
    gpu = predict_deploy(graphopt.plan(m, x, target="h100"), torch_model=True,
                         not_measured="a test").row(Artifact.OPENVINO)
    assert gpu is not None and gpu.seconds is None and "on CPUs" in gpu.note


def test_the_call_cost_is_kept_out_of_the_per_op_tables() -> None:
    profile = _calibrated(Add=1e-5, **{"ort:Add": 3e-6, "ov:Add": 1e-6, "ov:@call": 2e-5})
    tables = runtime_tables(profile.op_overhead_s)
    assert tables == {"torch": {"Add": 1e-5}, "onnxruntime": {"Add": 3e-6},
                      "openvino": {"Add": 1e-6}}
    assert call_cost(profile, "openvino") == 2e-5 and call_cost(profile, "onnxruntime") is None
    ov = for_runtime(profile, "openvino")
    assert ov.op_overhead_s == {"Add": 1e-6} and ov.launch_overhead_s == 1e-6


@needs_openvino
def test_calibration_times_openvino_per_op_and_per_call() -> None:
    costs = ov_fixed_costs(rounds=5, warmup=1, threads=1)
    assert costs["ov:@call"] > 0 and costs["ov:MatMul"] > 0 and costs["ov:Add"] >= 0
    assert all(k.startswith("ov:") and v >= 0 for k, v in costs.items())
    profile = with_openvino_costs(_calibrated(Add=1e-5), threads=1)
    assert profile.op_overhead_s["Add"] == 1e-5 and "ov:@call" in profile.op_overhead_s
    version = importlib.metadata.version("openvino")
    assert f"OpenVINO {version}'s per-node cost" in profile.source


@needs_openvino
def test_the_host_calibration_key_names_the_openvino_it_timed(monkeypatch) -> None:
    """Installing, upgrading or removing OpenVINO gives another cache file: the calibration
    is remade with (or without) its costs."""
    real = host_cache.importlib.metadata.version
    key = host_cache.cache_key(1)
    assert key["openvino"] == importlib.metadata.version("openvino")

    def version(name: str) -> str:
        if name == "openvino":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(host_cache.importlib.metadata, "version", version)
    without = host_cache.cache_key(1)
    assert without["openvino"] is None
    assert host_cache.cache_path(without) != host_cache.cache_path(key)


# --- the report --------------------------------------------------------------------------------

def test_the_report_row_of_openvino() -> None:
    rows = (ArtifactTiming(Artifact.TORCH, 2e-4, True), ArtifactTiming(Artifact.ONNXRUNTIME,
                                                                       1.5e-4, True),
            ArtifactTiming(Artifact.OPENVINO, 1e-4, True, note="f32 inference precision"))
    choice = DeployChoice.of("openvino", True, "r", rows, "m", original_s=3e-4)
    assert deploy_rows(choice)[-1] == ["openvino (chosen)", "100 µs", "2.00x", "3.00x",
                                       "within tolerance", "f32 inference precision"]
