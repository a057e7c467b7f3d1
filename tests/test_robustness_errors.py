"""Trust first (issue 9), continued from test_robustness.py: a user's mistakes end in a
GraphoptError that says the problem and the fix; the CLI prints ``graphopt: error: ...`` and
exits 2, with no traceback, and no file is harmed or left behind.

2. Bad calibration files, ``.py`` specs without ``:function``, torch's fake-tensor log on a
   shape mismatch, bad ``--devices`` memory, bad ``target`` values.
3. The host CPU a test sees: ``GRAPHOPT_HOST_ISA`` stands a table CPU's ISA in for the host's
   (tests/hostisa.py), so host-dependent tests check every outcome on any machine.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import graphopt
from graphopt.cli.main import main
from graphopt.errors import GraphoptError
from graphopt.hardware.registry import get_target
from tests.robustness_helpers import _listing, _mlp_onnx, _no_traceback

# --- 2. errors that used to be tracebacks ------------------------------------------------------

def _cli_error(capsys, argv: list[str]) -> str:
    """Run the CLI, expect exit 2 and graphopt's own two-line error; return stderr."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    _no_traceback(err)
    assert err.startswith("graphopt: error: ") and "\n  fix: " in err, err
    return err


def _npz_bytes(tmp_path: Path) -> bytes:
    np.savez(tmp_path / "tmp.npz", x=np.zeros((2, 4, 20), np.float32))
    data = (tmp_path / "tmp.npz").read_bytes()
    (tmp_path / "tmp.npz").unlink()
    return data


def _bad_calibration(tmp_path: Path, kind: str) -> Path:
    if kind == "npy":
        path = tmp_path / "calib.npy"
        np.save(path, np.zeros((2, 4, 20), np.float32))
        return path
    path = tmp_path / "calib.npz"
    if kind == "zip_garbage":
        path.write_bytes(b"PK\x03\x04" + b"not a zip archive" * 20)
    elif kind == "truncated":
        path.write_bytes(_npz_bytes(tmp_path)[:200])
    elif kind == "text":
        path.write_text("x = 1, 2, 3\n")
    elif kind == "not_npy_member":
        import zipfile

        with zipfile.ZipFile(path, "w") as z:
            z.writestr("x.npy", b"these bytes are no .npy array")
    return path


_CALIBRATION_CASES = {
    "zip_garbage": "damaged or incomplete .npz", "truncated": "damaged or incomplete .npz",
    "npy": "single .npy array, not an .npz", "text": "not an .npz archive",
    "not_npy_member": "not .npy arrays: x"}


@pytest.mark.parametrize("kind", sorted(_CALIBRATION_CASES))
def test_cli_optimize_with_a_bad_calibration_file_names_it_and_the_format(tmp_path, capsys, kind):
    src = _mlp_onnx(tmp_path / "m.onnx", "batch")
    calib = _bad_calibration(tmp_path, kind)
    before = _listing(tmp_path)
    err = _cli_error(capsys, ["optimize", str(src), "-o", str(tmp_path / "o.onnx"), "--target",
                              "cpu", "--quantize", "int8_static", "--calibration", str(calib)])
    assert str(calib) in err and _CALIBRATION_CASES[kind] in err
    assert ".npz with one array per model input" in err  # the fix names the expected format
    assert _listing(tmp_path) == before  # nothing written, nothing harmed


def test_python_api_bad_calibration_is_a_graphopt_error(tmp_path):
    src = _mlp_onnx(tmp_path / "m.onnx", "batch")
    calib = _bad_calibration(tmp_path, "npy")
    with pytest.raises(GraphoptError) as err:
        graphopt.optimize(str(src), target="cpu", quantize="int8_static", calibration=str(calib))
    assert str(calib) in err.value.problem and ".npz" in (err.value.fix or "")


_MISMATCH = '''
import torch


def build():
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU()).eval()
    return model, (torch.randn(4, 8),)


def helper(x):
    return x + 1


def make_other(scale=2):
    return scale


def no_return():
    pass
'''


def test_shape_mismatch_in_a_py_model_prints_only_graphopt_lines(tmp_path):
    import subprocess
    import sys

    spec = tmp_path / "m.py"
    spec.write_text(_MISMATCH)
    r = subprocess.run([sys.executable, "-m", "graphopt.cli", "plan", f"{spec}:build"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.splitlines()
    assert lines[0].startswith("graphopt: error: could not trace Sequential")
    assert "[4, 8]" in lines[0] or "4x8" in lines[0]
    assert all(ln.startswith(("graphopt: error: ", "  fix: ")) for ln in lines), r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.py"]


def test_tracing_silences_torch_loggers_and_restores_them():
    import logging

    class Records(logging.Handler):
        def __init__(self) -> None:
            super().__init__(logging.DEBUG)
            self.seen: list[logging.LogRecord] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.seen.append(record)

    names = ("torch", "torch._subclasses.fake_tensor", "torch.export")
    before = {n: logging.getLogger(n).level for n in names}
    fake = logging.getLogger("torch._subclasses.fake_tensor")
    records = Records()
    fake.addHandler(records)
    try:
        with pytest.raises(GraphoptError, match="could not trace"):
            graphopt.plan(nn.Sequential(nn.Linear(16, 32)).eval(), torch.randn(4, 8))
    finally:
        fake.removeHandler(records)
    assert [r.getMessage() for r in records.seen] == []  # the meta-kernel traceback log
    assert {n: logging.getLogger(n).level for n in names} == before


@pytest.mark.parametrize("command", ["plan", "optimize", "lint"])
@pytest.mark.parametrize("suffix", ["", ":", ":1bad"])
def test_py_model_without_function_lists_the_candidates(tmp_path, capsys, command, suffix):
    spec = tmp_path / "m.py"
    spec.write_text(_MISMATCH + "\nraise SystemExit('the file must not be imported')\n")
    argv = [command, f"{spec}{suffix}"] + (["-o", str(tmp_path / "o.onnx")]
                                           if command == "optimize" else [])
    before = _listing(tmp_path)
    err = _cli_error(capsys, argv)
    assert "is a Python file" in err and "ONNX" not in err
    assert "could be it: build, make_other" in err  # callable with no arguments, returning
    assert f"'{spec}:build'" in err
    assert _listing(tmp_path) == before


def test_python_api_py_model_without_function(tmp_path):
    spec = tmp_path / "empty.py"
    spec.write_text("X = 1\n")
    with pytest.raises(GraphoptError, match="defines no top-level function"):
        graphopt.plan(str(spec))


@pytest.mark.parametrize(("devices", "message"), [
    ("cpu:1e400GB", "not a finite size"), ("cpu:nanGB", "not a finite size"),
    ("cpu:infGB", "not a finite size"), ("cpu:0GB", "not positive"),
    ("cpu:-8GB", "not positive"), ("cuda:0=h100:-1GB", "not positive"),
    ("cuda:0=h100:NaN GiB", "not a finite size"),
    ("cpu:abc", "neither a device index nor a memory cap"),
    ("cpu:1e400", "neither a device index nor a memory cap")])
def test_bad_device_memory_is_refused(tmp_path, capsys, devices, message):
    src = _mlp_onnx(tmp_path / "m.onnx", 4)
    err = _cli_error(capsys, ["plan", str(src), "--target", "h100", "--devices",
                              f"cuda:1=a100,{devices}"])
    assert message in err and repr(devices) in err


def test_device_index_and_caps_still_parse():
    from graphopt.partition.parse import parse_devices

    ds = parse_devices("cpu:1,cuda:0=h100:40GB,cuda:1=a100:1.5e1GiB")
    assert [(d.name, d.memory_bytes) for d in ds.devices][1:] == [
        ("cuda:0", 40 * 10**9), ("cuda:1", int(15 * 2**30))]
    assert ds.devices[0].name == "cpu:1"


@pytest.mark.parametrize("target", [None, 123, 1.5, ["h100", 7], {"h100"}, b"h100"])
def test_python_api_bad_target_says_what_target_accepts(target):
    model = nn.Linear(4, 4).eval()
    for call in (lambda: graphopt.plan(model, torch.randn(2, 4), target=target),
                 lambda: graphopt.optimize(model, torch.randn(2, 4), target=target)):
        with pytest.raises(GraphoptError) as err:
            call()
        assert "is not a target" in err.value.problem
        assert "graphopt targets" in (err.value.fix or "")


# --- 3. the host CPU a test sees -------------------------------------------------------------

def test_host_isa_stand_in_swaps_the_isa_and_keeps_this_machine():
    from graphopt.hardware.detect import build_host_profile, detect_cpu
    from graphopt.hardware.registry import is_this_machine
    from tests.hostisa import host_isa

    real = build_host_profile(detect_cpu())
    for name, tier, flags in (("xeon-8480", "amx", {"amx_int8", "avx512_bf16"}),
                              ("xeon-8380", "avx512_vnni", {"avx512_vnni"}),
                              ("epyc-7763", "avx2_fma", {"avx2"})):
        with host_isa(name) as host:
            assert host.name == "cpu" and is_this_machine(host) and host.generation == tier
            assert flags <= host.capabilities == get_target(name).capabilities
            assert (host.cores, host.memory_bytes) == (real.cores, real.memory_bytes)
    assert get_target("cpu").capabilities == build_host_profile(
        graphopt.hardware.detect.host_cpu_info()).capabilities  # restored


def test_unknown_host_isa_is_a_clean_cli_error(tmp_path):
    import subprocess
    import sys

    env = {**os.environ, "GRAPHOPT_HOST_ISA": "pentium-4"}
    r = subprocess.run([sys.executable, "-m", "graphopt.cli", "detect"], capture_output=True,
                       text=True, env=env, cwd=tmp_path, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "GRAPHOPT_HOST_ISA='pentium-4' is not a CPU of graphopt's table" in r.stderr
    assert "xeon-8380" in r.stderr  # the fix lists the names that work
