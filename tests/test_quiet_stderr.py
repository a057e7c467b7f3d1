"""graphopt's own lines only on stderr (issue 35, item 3): the profiler's ``USDT`` trace lines,
the exporters' progress, torch's copyreg FutureWarning and onnxruntime.quantization's
"consider pre-processing" are dropped for the call that makes them (``files.quiet``), every
other line passes, the process's warnings and logging state are as before, and ``--verbose``
shows it all again."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from graphopt.backends.onnx.quantize_ort import ort_dynamic_int8
from graphopt.cli.main import main
from graphopt.files import progress as prog
from graphopt.files import quiet
from graphopt.frontends import onnx_export
from graphopt.frontends.onnx_opsets import exporter_opsets

ROOT = Path(__file__).resolve().parents[1]
USDT = (b"USDT:2026-11-28 22:36:04 23485:23485 SyncActivityProfilerHandler.cpp:52] "
        b"profiler_start\n")
LEAF = "`isinstance(treespec, LeafSpec)` is deprecated, use ..."
ADVICE = "Please consider to run pre-processing before quantization. Refer to example: ..."
#: graphopt's own stderr: its messages, and its loggers' lines in the CLI's format
OWN = re.compile(r"graphopt: |(DEBUG|INFO|WARNING|ERROR|CRITICAL) graphopt[.:]")
TINY = ("import torch\n\n\ndef build():\n    torch.manual_seed(0)\n"
        "    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval(), "
        "(torch.randn(2, 8),)\n")


@pytest.fixture(autouse=True)
def _not_verbose(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(quiet.VERBOSE_ENV, raising=False)
    quiet.set_verbose(False)


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("GRAPHOPT_NO_CALIBRATE", quiet.VERBOSE_ENV, "PYTHONWARNINGS")}
    return {**env, "XDG_CACHE_HOME": str(tmp_path / "cache"), **extra}


def _graphopt(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "graphopt", *args], cwd=ROOT,
                          env=_env(tmp_path, **env), capture_output=True, text=True,
                          timeout=900, check=False)


def _foreign(stderr: str) -> list[str]:
    """The stderr lines that are not graphopt's own."""
    return [line for line in stderr.splitlines() if line.strip() and not OWN.match(line)]


def _state(*loggers: logging.Logger) -> list[object]:
    return [list(warnings.filters), warnings.showwarning,
            *[(lg.level, list(lg.filters), list(lg.handlers)) for lg in loggers]]


# -- the silencer itself


def test_noise_on_fd2_is_dropped_and_every_other_line_passes(capfd: pytest.CaptureFixture[str]
                                                             ) -> None:
    root, torch_log = logging.getLogger(), logging.getLogger(quiet.NOISE_LOGS[1][0])
    with warnings.catch_warnings(record=True) as seen:  # pytest's own catcher shows none
        warnings.simplefilter("always")
        before, fd2 = _state(root, torch_log), os.fstat(2).st_ino
        with quiet.library_quiet():
            os.write(2, USDT)
            os.write(2, USDT.replace(b"52] profiler_start", b"59] profiler_stop"))
            os.write(2, b"a library's own error\n")
            os.write(2, USDT + b"its second line\n")
            sys.stderr.write("python stderr\n")  # pytest's own sys.stderr: not via fd 2
            warnings.warn(LEAF, FutureWarning, stacklevel=1)
            warnings.warn("a warning graphopt does not know", FutureWarning, stacklevel=1)
        assert _state(root, torch_log) == before and os.fstat(2).st_ino == fd2
    err = capfd.readouterr().err
    assert "USDT" not in err and "python stderr\n" in err
    assert "a library's own error\nits second line\n" in err
    assert [str(w.message) for w in seen] == ["a warning graphopt does not know"]


def test_known_log_records_dropped_and_an_implicit_basic_config_undone(
        monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])  # a user's process that configured no logging
    with quiet.library_quiet(stderr=False):
        logging.warning(ADVICE)  # onnxruntime.quantization's call: configures the root
        logging.warning("a warning that matters")
    assert root.handlers == [] and root.filters == []
    err = capfd.readouterr().err
    assert "a warning that matters" in err and "pre-processing" not in err


def test_what_a_failing_call_wrote_reaches_stderr(capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(RuntimeError, match="boom"), quiet.library_quiet():
        os.write(2, USDT + b"lib: the detail of the failure")  # no newline at the end
        raise RuntimeError("boom")
    assert capfd.readouterr().err == "lib: the detail of the failure"


def test_a_partial_line_passes_at_once_unless_it_may_be_noise() -> None:
    lines = quiet.NoiseFilter()
    assert lines.feed(b"\rgraphopt: calibrating this CPU 3s") == \
        b"\rgraphopt: calibrating this CPU 3s"
    assert lines.feed(b"US") == b""  # might be a trace line: held for its end
    assert lines.feed(USDT[2:] + b"next") == b"next"
    assert lines.feed(b"USDT: not the profiler\n") == b"USDT: not the profiler\n"
    assert lines.feed(b"U") == b"" and lines.close() == b"U"


class _FdTerminal:
    """A terminal on file descriptor 2, as the real stderr is."""

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> int:
        return os.write(2, text.encode())

    def flush(self) -> None:
        pass


def test_graphopts_progress_line_shows_while_the_library_is_silenced(
        monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(prog, "_stderr", _FdTerminal)
    monkeypatch.setattr(prog, "DELAY_S", 0.05)
    monkeypatch.setattr(prog, "_REFRESH_S", 0.02)
    monkeypatch.delenv(prog.QUIET_ENV, raising=False)
    prog.set_quiet(False)
    with prog.progress("calibrating this CPU"), quiet.library_quiet():
        os.write(2, USDT)
        time.sleep(0.4)
        shown = capfd.readouterr().err  # forwarded while the call still runs
    assert "graphopt: calibrating this CPU" in shown and "USDT" not in shown


def test_nested_calls_swap_fd2_once_and_put_it_back(capfd: pytest.CaptureFixture[str]) -> None:
    fd2 = os.fstat(2).st_ino
    with quiet.library_quiet():
        inner = os.fstat(2).st_ino
        with quiet.library_quiet():
            assert os.fstat(2).st_ino == inner
            os.write(2, USDT + b"inner\n")
        os.write(2, USDT + b"outer\n")
    assert inner != fd2 and os.fstat(2).st_ino == fd2
    assert capfd.readouterr().err == "inner\nouter\n"


@pytest.mark.parametrize("how", ["env", "set_verbose"])
def test_verbose_shows_the_library_lines(how: str, monkeypatch: pytest.MonkeyPatch,
                                         capfd: pytest.CaptureFixture[str]) -> None:
    if how == "env":
        monkeypatch.setenv(quiet.VERBOSE_ENV, "1")
    else:
        quiet.set_verbose(True)
    with warnings.catch_warnings(record=True) as seen, quiet.library_quiet():
        warnings.simplefilter("always")
        os.write(2, USDT)
        warnings.warn(LEAF, FutureWarning, stacklevel=1)
    assert "profiler_start" in capfd.readouterr().err and len(seen) == 1


def test_the_cli_verbose_flag_turns_the_silencer_off(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--verbose", "targets"]) == 0 and quiet.verbose()
    assert main(["targets"]) == 0 and not quiet.verbose()
    capsys.readouterr()


# -- the calls that made noise


def test_the_export_silencer_keeps_stdout_clean_and_passes_real_errors(
        capfd: pytest.CaptureFixture[str]) -> None:
    with onnx_export._quiet():
        print("[torch.onnx] Obtain model graph ...")
        os.write(1, b"graph(%x : Float(2, 8)) ...\n")  # the TorchScript exporter's dump
        os.write(2, USDT + b"an exporter error\n")
    out, err = capfd.readouterr()
    assert out == "" and err == "an exporter error\n"


@pytest.mark.slow
def test_both_exporters_leave_nothing_on_stdout_or_stderr(
        capfd: pytest.CaptureFixture[str]) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
    x = torch.randn(2, 8)
    assert onnx_export.export_torch(model, x).exporter == "legacy"
    newest = exporter_opsets()["dynamo"][1]
    assert onnx_export.export_torch(model, x, opset=newest).exporter == "dynamo"
    assert capfd.readouterr() == ("", "")


def test_an_ort_quantizer_call_logs_no_preprocessing_advice(
        caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> None:
    w = np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with caplog.at_level(logging.INFO):
        out = ort_dynamic_int8(model, ["mm"], reduce_range=False)
    assert any(n.op_type == "MatMulInteger" for n in out.graph.node)
    assert isinstance(out, onnx.ModelProto)
    assert not [r for r in caplog.records if "pre-processing" in r.getMessage()]
    assert "pre-processing" not in capfd.readouterr().err


# -- end to end, in fresh processes


@pytest.mark.slow
def test_plan_on_cpu_calibrates_and_prints_only_graphopts_lines(tmp_path: Path) -> None:
    done = _graphopt(tmp_path, "plan", "examples/resnet_like.py:build", "--target", "cpu")
    assert done.returncode == 0, done.stderr
    assert "graphopt: calibrating this CPU" in done.stderr  # the profiler ran
    assert "USDT" not in done.stderr and _foreign(done.stderr) == []


@pytest.mark.slow
def test_make_demo_prints_only_graphopts_lines(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = _graphopt(tmp_path, "plan", "examples/resnet_like.py:build", "--target", "h100",
                     "--json", str(out / "plan.json"), "--md", str(out / "plan.md"),
                     "--html", str(out / "plan.html"))
    assert done.returncode == 0, done.stderr
    assert _foreign(done.stderr) == []
    assert all((out / f"plan.{ext}").is_file() for ext in ("json", "md", "html"))


@pytest.mark.slow
@pytest.mark.parametrize("verbose", [False, True])
def test_profile_shows_the_profilers_lines_only_when_verbose(tmp_path: Path,
                                                             verbose: bool) -> None:
    (tmp_path / "tiny.py").write_text(TINY)
    done = _graphopt(tmp_path, *(["--verbose"] if verbose else []), "profile",
                     f"{tmp_path / 'tiny.py'}:build", "--target", "cpu", "--runs", "2",
                     GRAPHOPT_NO_CALIBRATE="1")
    assert done.returncode == 0, done.stderr
    assert ("profiler_start" in done.stderr) is verbose
    if not verbose:
        assert _foreign(done.stderr) == []


# the libraries plan() loads on the way are loaded first: sympy adds a warnings filter of its
# own on import, which is its import's doing, not a call's
API = """
import importlib.util, logging, warnings
import onnx, onnxruntime, sympy, torch
import graphopt
if importlib.util.find_spec("openvino"):
    import openvino
before = (list(warnings.filters), list(logging.getLogger().handlers))
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
graphopt.plan(model, (torch.randn(2, 8),), target="cpu")
assert (list(warnings.filters), list(logging.getLogger().handlers)) == before
print("ok")
"""


@pytest.mark.slow
def test_the_python_api_plans_on_cpu_without_library_lines(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", API], cwd=ROOT, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    assert "calibrating this CPU" in done.stderr
    assert "USDT" not in done.stderr and "Warning" not in done.stderr


def test_optimize_from_python_raises_no_copyreg_warning() -> None:
    """torch's ``copyreg`` FutureWarning (a pytree spec deep-copied with the traced module)
    never reaches the user's process from ``graphopt.optimize``."""
    import torch

    import graphopt

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU()).eval()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        graphopt.optimize(model, (torch.randn(4, 16),), target="cpu", measure=False)
    assert not [w for w in seen if "LeafSpec" in str(w.message)], [str(w.message) for w in seen]
