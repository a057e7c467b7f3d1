"""target="cpu" plans with this host's cached calibration (issue 21, item 4).

The calibration itself is replaced by a fake that returns made-up numbers and counts its calls
(the real one takes seconds and measures whatever else the machine is doing); the cache folder
is ``tmp_path``. What is checked: the cache is made once and then read; a damaged, foreign,
other-version or other-key file is remade, never used; the key follows the thread count and
the versions; ``--no-calibrate``, ``GRAPHOPT_NO_CALIBRATE`` and ``host_calibration(False)``
skip it; a profile given explicitly is used as is; the progress line is printed; two
threads racing calibrate once; and the profiler's fast node times equal torch's own.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

import graphopt
from graphopt.cli.main import main
from graphopt.hardware.detect import HOST_ISA_ENV, host_cpu_profile
from graphopt.hardware.profile import HardwareProfile
from graphopt.hardware.profile_file import FORMAT, load_profile, save_profile
from graphopt.measure import host_cache
from graphopt.measure.torch_runs import NODE_RANGE, node_times, per_node


def _fake(threads: int) -> HardwareProfile:
    """A calibration of this host with numbers told apart from any real one."""
    host = host_cpu_profile()
    model = host.display_name.split(" (host")[0]
    return replace(host, display_name=f"{model} (host, calibrated)",
                   source=f"fake calibration, {threads} thread(s)",
                   op_overhead_s={"Add": 3e-6, "Linear": 20e-6, "Reshape": 1.5e-6},
                   measured_rates={"matrix:fp32": 50e9, "conv:fp32": 25e9, "memory": 10e9})


@pytest.fixture
def calls(tmp_path, monkeypatch) -> list[int]:
    """The thread count of each calibration run; the cache on, in ``tmp_path/cache``."""
    made: list[int] = []

    def measure(threads: int) -> HardwareProfile:
        made.append(threads)
        return _fake(threads)

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(host_cache.NO_CALIBRATE_ENV, raising=False)
    monkeypatch.delenv(HOST_ISA_ENV, raising=False)
    monkeypatch.setattr(host_cache, "_measure", measure)
    monkeypatch.setattr(host_cache, "_unsaved", {})
    return made


class _Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


def _plan(target="cpu"):
    return graphopt.plan(_Small().eval(), (torch.randn(2, 16),), target=target)


def _path() -> Path:
    return host_cache.cache_path(host_cache.cache_key(host_cache.default_threads()))


def test_a_fresh_cache_is_made_once_with_a_line_on_stderr_and_then_read(calls, capsys):
    first = _plan()
    err = capsys.readouterr().err
    assert err.count("graphopt: calibrating this CPU") == 1 and "GRAPHOPT_NO_CALIBRATE" in err
    assert first.target.calibrated and first.target.op_overhead_s["Linear"] == 20e-6
    assert calls == [torch.get_num_threads()]
    path = _path()
    assert path.parent == Path(os.environ["XDG_CACHE_HOME"]) / "graphopt"
    assert path.name.startswith("host-") and path.suffix == ".json"
    stored = json.loads(path.read_text())
    assert stored["format"] == FORMAT
    assert stored["host_cache"] == host_cache.cache_key(torch.get_num_threads())
    again = _plan()
    assert calls == [torch.get_num_threads()]  # read, not measured again
    assert capsys.readouterr().err == ""
    assert again.target == first.target
    assert [p.name for p in path.parent.iterdir() if p.suffix == ".tmp"] == []


def test_the_cache_folder_defaults_to_dot_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert host_cache.cache_folder() == tmp_path / ".cache" / "graphopt"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/path")  # the XDG spec: ignored
    assert host_cache.cache_folder() == tmp_path / ".cache" / "graphopt"


def _calibrated_text(key: dict) -> str:
    from graphopt.hardware.profile_file import profile_text

    return profile_text(_fake(1), {"host_cache": key})


@pytest.mark.parametrize("case", ["garbage", "truncated", "empty", "other key",
                                  "other version", "no key", "uncalibrated", "other cpu",
                                  "nan", "fifo"])
def test_a_damaged_or_foreign_cache_file_is_remade(calls, case):
    key = host_cache.cache_key(host_cache.default_threads())
    path = _path()
    path.parent.mkdir(parents=True)
    good = _calibrated_text(key)
    if case == "fifo":  # read with the bounded reader: refused at once, not waited on
        os.mkfifo(path)
    else:
        path.write_text({
            "garbage": "not json {",
            "truncated": good[: len(good) // 2],
            "empty": "",
            "other key": _calibrated_text({**key, "threads": key["threads"] + 7}),
            "other version": _calibrated_text({**key, "calibration": -1}),
            "no key": good.replace('"host_cache"', '"not_the_key"'),
            "uncalibrated": json.dumps({"format": FORMAT, **host_cpu_profile().to_dict(),
                                        "host_cache": key}),
            "other cpu": _calibrated_text(key).replace("(host, calibrated)",
                                                       "elsewhere (host, calibrated)"),
            "nan": good.replace("50000000000.0", "NaN"),
        }[case])
    assert _plan().target.calibrated
    assert len(calls) == 1
    assert json.loads(path.read_text())["host_cache"] == key  # replaced by a good one
    assert load_profile(path).op_overhead_s["Linear"] == 20e-6


def test_the_key_follows_threads_and_versions(calls, monkeypatch):
    one, two = host_cache.cache_key(1), host_cache.cache_key(2)
    assert one != two and host_cache.cache_path(one) != host_cache.cache_path(two)
    assert set(one) == {"calibration", "cpu", "isa", "threads", "python", "torch",
                        "onnxruntime", "openvino"}
    assert one["isa"] == sorted(host_cpu_profile().capabilities)
    real = host_cache.importlib.metadata.version
    monkeypatch.setattr(host_cache.importlib.metadata, "version",
                        lambda name: "0.0.1" if name == "torch" else real(name))
    newer = host_cache.cache_key(1)
    assert newer["torch"] == "0.0.1" and host_cache.cache_path(newer) != \
        host_cache.cache_path(one)
    from graphopt.measure import calibrate

    monkeypatch.setattr(calibrate, "CALIBRATION_VERSION", calibrate.CALIBRATION_VERSION + 1)
    assert host_cache.cache_key(1)["calibration"] != one["calibration"]


def test_each_thread_count_has_its_own_calibration(calls, tmp_path):
    assert host_cache.cached_host_profile(1).source == "fake calibration, 1 thread(s)"
    assert host_cache.cached_host_profile(3).source == "fake calibration, 3 thread(s)"
    assert host_cache.cached_host_profile(1).source == "fake calibration, 1 thread(s)"
    assert calls == [1, 3]
    assert len(list((tmp_path / "cache" / "graphopt").glob("host-*.json"))) == 2


def test_profile_calibrates_with_the_threads_it_measures_with(calls):
    plan = graphopt.profile(_Small().eval(), (torch.randn(2, 16),), threads=1, runs=2,
                            warmup=1)
    assert calls == [1] and plan.target.calibrated


def test_the_env_var_and_the_python_option_skip_it(calls, monkeypatch):
    with host_cache.host_calibration(False):
        assert not _plan().target.calibrated
    monkeypatch.setenv(host_cache.NO_CALIBRATE_ENV, "1")
    assert not _plan().target.calibrated
    assert not graphopt.optimize(_Small().eval(), (torch.randn(2, 16),), target="cpu",
                                 measure=False).plan.target.calibrated
    assert calls == []
    with host_cache.host_calibration(True):  # the block overrides the env var
        assert _plan().target.calibrated
    assert len(calls) == 1


def test_a_stand_in_isa_is_not_calibrated(calls, monkeypatch):
    monkeypatch.setenv(HOST_ISA_ENV, "xeon-8380")
    assert host_cache.host_target("cpu") == "cpu"
    assert calls == []


def test_a_profile_given_explicitly_is_used_as_is(calls, tmp_path):
    path = tmp_path / "mine.json"
    mine = replace(_fake(1), source="my own calibration")
    save_profile(mine, path)
    assert _plan(str(path)).target == mine
    host = host_cpu_profile()
    assert _plan(host).target is host  # a HardwareProfile: as is, even the host's own
    assert _plan("h100").target.name == "h100-sxm"
    assert calls == []


def test_only_the_host_names_in_a_list_are_replaced(calls):
    plans = _plan("h100, host").plans
    assert plans[0].target.name == "h100-sxm" and not plans[0].target.calibrated
    assert plans[1].target.calibrated and len(calls) == 1
    assert host_cache.host_target(["a100", "cpu"])[0] == "a100"
    assert host_cache.host_target(None) is None  # resolve_targets says what is wrong


def _spec(tmp_path: Path) -> str:
    spec = tmp_path / "m.py"
    spec.write_text("import torch\n\ndef build():\n    torch.manual_seed(0)\n"
                    "    return torch.nn.Linear(16, 16).eval(), (torch.randn(2, 16),)\n")
    return f"{spec}:build"


def test_cli_no_calibrate_skips_it(calls, tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["plan", _spec(tmp_path), "--target", "cpu", "--no-calibrate", "--json",
                 str(out)]) == 0
    assert calls == [] and "calibrated" not in capsys.readouterr().out
    assert "calibrated" not in json.loads(out.read_text())["target"]["display_name"]
    assert main(["plan", _spec(tmp_path), "--target", "cpu", "--json", str(out)]) == 0
    captured = capsys.readouterr()
    assert len(calls) == 1 and "calibrating this CPU" in captured.err
    assert "(host, calibrated)" in captured.out
    for argv in (["lint", _spec(tmp_path)], ["cost", "gemm", "64", "64", "64"],
                 ["profile", _spec(tmp_path), "--runs", "1", "--warmup", "0"]):
        assert main([*argv, "--target", "cpu", "--no-calibrate"]) == 0, argv
    assert len(calls) == 1


def test_a_failed_calibration_plans_uncalibrated_and_is_not_retried(calls, monkeypatch,
                                                                    caplog):
    def broken(threads: int) -> HardwareProfile:
        calls.append(threads)
        raise RuntimeError("no timer here")

    monkeypatch.setattr(host_cache, "_measure", broken)
    assert not _plan().target.calibrated
    assert not _plan().target.calibrated
    assert len(calls) == 1 and "no timer here" in caplog.text
    assert not _path().exists()


def test_an_unwritable_cache_folder_calibrates_once_per_process(calls, tmp_path, monkeypatch,
                                                                caplog):
    (tmp_path / "cache").write_text("a file where the folder should be")
    assert _plan().target.calibrated and _plan().target.calibrated
    assert len(calls) == 1 and "cannot cache the host calibration" in caplog.text


def test_two_racing_threads_calibrate_once(calls, monkeypatch):
    def slow(threads: int) -> HardwareProfile:
        calls.append(threads)
        time.sleep(0.3)  # the second caller arrives while the first is measuring
        return _fake(threads)

    monkeypatch.setattr(host_cache, "_measure", slow)
    got: list[HardwareProfile] = []
    workers = [threading.Thread(target=lambda: got.append(host_cache.cached_host_profile(1)))
               for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert len(calls) == 1 and len(got) == 2 and got[0] == got[1]


def test_a_reader_never_sees_a_partial_file(calls):
    """Writers replace the file whole: readers racing them find the old or the new file."""
    key = host_cache.cache_key(1)
    path = host_cache.cache_path(key)
    text = _calibrated_text(key)
    host_cache._write_atomic(path, text)
    bad: list[str] = []
    stop = threading.Event()

    def write() -> None:
        while not stop.is_set():
            host_cache._write_atomic(path, text)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        for _ in range(200):
            if host_cache._read(path, key) is None:
                bad.append("unreadable")
    finally:
        stop.set()
        writer.join()
    assert bad == []
    assert [p.name for p in path.parent.iterdir() if p.suffix == ".tmp"] == []


def test_fast_node_times_equal_torchs_event_tree():
    from torch.profiler import ProfilerActivity, profile, record_function

    x, w = torch.randn(8, 32), torch.randn(32, 32)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            with record_function(NODE_RANGE + "linear"):
                torch.nn.functional.linear(x, w).relu()
            with record_function(NODE_RANGE + "view"):
                x.view(4, 64)
    fast, slow = node_times(prof), per_node(prof.events())
    assert fast.keys() == slow.keys() == {"linear", "view"}
    for name in fast:
        assert fast[name] == pytest.approx(slow[name], rel=1e-9, abs=1e-12)


def test_a_calibration_made_on_a_busy_cpu_is_remade_when_it_is_idle(calls, monkeypatch,
                                                                    caplog):
    monkeypatch.setattr(host_cache, "_busy", lambda: 5.0)
    assert _plan().target.calibrated and len(calls) == 1
    assert "the CPU was busy while calibrating (load 5.0" in caplog.text
    made = json.loads(_path().read_text())["host_cache_made"]
    assert made["busy_load"] == 5.0
    _plan()  # still busy: the marked file is used
    monkeypatch.setattr(host_cache, "_busy", lambda: None)
    _plan()  # idle, but made moments ago: used
    assert len(calls) == 1
    monkeypatch.setattr(host_cache.time, "time", lambda: made["time"] + 3600)
    _plan()  # idle and made an hour ago: remade, unmarked
    assert len(calls) == 2
    assert json.loads(_path().read_text())["host_cache_made"]["busy_load"] is None
    _plan()
    assert len(calls) == 2


def test_an_onnx_plan_reads_the_cache_without_importing_torch(calls, tmp_path):
    """The key is read without torch (versions from package metadata, threads from
    OMP_NUM_THREADS or the cores), so a cached host keeps ONNX planning torch-free."""
    import subprocess
    import sys

    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((16, 16), np.float32), "W")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "mm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16])],
                              [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              tmp_path / "m.onnx")
    assert host_cache.cached_host_profile(1).calibrated and calls == [1]
    child = ("import sys, graphopt\n"
             f"p = graphopt.plan({str(tmp_path / 'm.onnx')!r}, target='cpu')\n"
             "print(p.target.calibrated, 'torch' in sys.modules)\n")
    root = str(Path(graphopt.__file__).resolve().parent.parent)
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                          timeout=120, cwd=root, env={**os.environ, "PYTHONPATH": root,
                                                      "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-2:] == ["True", "False"]
    assert "calibrating" not in done.stderr  # read from the cache, not made again
