"""Issue 19: hostile hardware profiles, ``--devices`` and ``graphopt cost`` inputs.

A profile file, a device list or an op's dims may come from anywhere: each is refused promptly
with exit 2 and a message naming the problem (never a hang, a traceback or a negative time),
and a report is always valid JSON. Tests run the way a user hits them: the CLI or the API.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import graphopt
from graphopt.cli.main import main
from graphopt.cost.whatif import estimate_op
from graphopt.errors import GraphoptError
from graphopt.hardware.profile_file import FORMAT, MAX_PROFILE_BYTES, load_profile
from graphopt.hardware.registry import get_target
from graphopt.partition import make_device_set, parse_devices
from graphopt.partition.devices import MAX_DEVICES, Device
from tests.robustness_helpers import _mlp_onnx

_CALIBRATE = "graphopt calibrate -o"


def _valid(target: str = "cpu") -> dict[str, Any]:
    """A profile dict exactly as ``save_profile`` writes it."""
    return {"format": FORMAT, **get_target(target).to_dict()}


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return _mlp_onnx(tmp_path_factory.mktemp("model") / "m.onnx", 2)


def _fails(argv: list[str], capsys, *needles: str) -> str:
    """The CLI returns 2 with a message holding every needle, and no traceback."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and 'File "' not in err, err
    for needle in needles:
        assert needle in err, err
    return err


def test_a_valid_profile_file_plans(tmp_path, model, capsys):
    """The starting point of every case below loads and plans: the refusals are the edits."""
    path = tmp_path / "ok.json"
    path.write_text(json.dumps(_valid()))
    assert main(["plan", str(model), "--target", str(path)]) == 0


# -- what the path is ------------------------------------------------------------------------

def _plan_in_child(model: Path, target: Path) -> subprocess.CompletedProcess[str]:
    """``graphopt plan`` in a child with a timeout: a FIFO or /dev/zero read must not hang
    (or fill memory in) the test process."""
    code = ("import sys; from graphopt.cli.main import main; "
            "sys.exit(main(['plan', sys.argv[1], '--target', sys.argv[2]]))")
    root = Path(__file__).resolve().parent.parent
    return subprocess.run([sys.executable, "-c", code, str(model), str(target)],
                          capture_output=True, text=True, timeout=120, cwd=root)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs and /dev/zero")
@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_a_target_that_is_not_a_regular_file_is_refused_at_once(tmp_path, model, kind):
    """A FIFO blocked the open until a writer came; a link to /dev/zero was read until
    MemoryError. Both are refused from a stat, before any read."""
    target = tmp_path / "t.json"
    if kind == "fifo":
        os.mkfifo(target)
        needle = "named pipe (FIFO)"
    else:
        target.symlink_to("/dev/zero")
        needle = "character device"
    done = _plan_in_child(model, target)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert needle in done.stderr and "not a regular file" in done.stderr, done.stderr
    assert str(target) in done.stderr


def test_a_profile_file_over_the_size_cap_is_refused(tmp_path, model, capsys):
    """Valid JSON, but over 1 MiB: a profile is a few KB, so this is not one."""
    path = tmp_path / "big.json"
    path.write_text(json.dumps({**_valid(), "source": "x" * MAX_PROFILE_BYTES}))
    _fails(["plan", str(model), "--target", str(path)], capsys, "larger than 1 MiB", str(path))


# -- what the file holds ---------------------------------------------------------------------

def _set(*keys: str, value: Any):
    def edit(d: dict[str, Any]) -> None:
        for k in keys[:-1]:
            d = d[k]
        d[keys[-1]] = value
    return edit


def _drop(*keys: str):
    def edit(d: dict[str, Any]) -> None:
        for k in keys[:-1]:
            d = d[k]
        del d[keys[-1]]
    return edit


BAD_FIELDS = {
    "zero peak": ("cpu", _set("peak_flops", "fp32", value=0), "peak_flops.fp32 = 0"),
    "string peak": ("cpu", _set("peak_flops", "fp32", value="lots"),
                    "peak_flops.fp32 = 'lots' is not a number"),
    "string bandwidth": ("cpu", _set("bandwidth_bytes_per_s", value="20e9"),
                         "bandwidth_bytes_per_s = '20e9' is not a number"),
    "1e308 memory": ("cpu", _set("memory_bytes", value=1e308), "memory_bytes = 1e+308"),
    "10**400 memory": ("cpu", _set("memory_bytes", value=10**400), "memory_bytes = 1000"),
    "negative memory": ("cpu", _set("memory_bytes", value=-1), "memory_bytes = -1"),
    "negative launch": ("cpu", _set("launch_overhead_s", value=-1e-6),
                        "launch_overhead_s = -1e-06"),
    "negative latency": ("h100", _set("host_link", "latency_s", value=-1.0),
                         "host_link.latency_s = -1.0"),
    "bool cores": ("cpu", _set("cores", value=True), "cores = True is not a number"),
    "string cores": ("cpu", _set("cores", value="two"), "cores = 'two' is not a number"),
    "fractional SMs": ("h100", _set("sm_count", value=1.5), "sm_count = 1.5"),
    "bad capability": ("h100", _set("compute_capability", value="nine"), "compute_capability"),
    "unknown dtype": ("cpu", _set("peak_flops", "fp23", value=1e12), "'fp23', which is not"),
    "no peaks": ("cpu", _set("peak_flops", value={}), "peak_flops is empty"),
    "capabilities a string": ("cpu", _set("capabilities", value="avx"), "capabilities = 'avx'"),
    "link without bandwidth": ("h100", _drop("peer_link", "bandwidth_bytes_per_s"),
                               "missing field 'peer_link.bandwidth_bytes_per_s'"),
}


@pytest.mark.parametrize("case", BAD_FIELDS, ids=str)
def test_a_bad_field_is_refused_naming_field_file_and_fix(tmp_path, model, capsys, case):
    """Each gave a traceback, a negative time or a silent default before."""
    base, edit, needle = BAD_FIELDS[case]
    d = _valid(base)
    edit(d)
    path = tmp_path / "hand-edited.json"
    path.write_text(json.dumps(d))
    _fails(["plan", str(model), "--target", str(path)], capsys, needle, str(path), _CALIBRATE)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_literals_are_refused(tmp_path, model, capsys, literal):
    """Python's json reads these (RFC 8259 has no such numbers); they crashed the JSON report
    later, or gave NaN times."""
    text = json.dumps(_valid()).replace('"launch_overhead_s": 2e-06',
                                        f'"launch_overhead_s": {literal}')
    assert literal in text
    path = tmp_path / "nan.json"
    path.write_text(text)
    _fails(["plan", str(model), "--target", str(path)], capsys, f"holds {literal}", _CALIBRATE)


def test_deep_nesting_is_refused_not_a_recursion_error(tmp_path, model, capsys):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    _fails(["plan", str(model), "--target", str(path)], capsys, "nests more than", str(path))


# -- random profiles -------------------------------------------------------------------------

_SCALARS = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
            | st.floats(allow_nan=True, allow_infinity=True)
            | st.sampled_from([0, -1, 1e308, -1e-300, 1e-300, 2**63, "1e9", ""])
            | st.text(max_size=6))
_EDITS = ["scale", "scale", "scale", "replace", "drop", "add"]  # plausible edits most often
_FACTORS = st.sampled_from([0, -1, 1e-300, 1e-9, 0.5, 2, 1e9, 1e300]) | st.floats(0.01, 100)
_VALUES = st.recursive(_SCALARS, lambda kids: st.lists(kids, max_size=3)
                       | st.dictionaries(st.text(max_size=5), kids, max_size=3), max_leaves=6)


def _slots(d: Any, out: list[tuple[dict[str, Any], str]]) -> list[tuple[dict[str, Any], str]]:
    """Every (object, key) of a profile dict, nested objects included."""
    if isinstance(d, dict):
        for k, v in d.items():
            out.append((d, k))
            _slots(v, out)
    return out


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _no_constant(name: str) -> Any:
    raise AssertionError(f"the report holds {name}")


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("random") / "profile.json"


@settings(max_examples=100, deadline=timedelta(seconds=20),
          suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_random_profile_plans_or_is_refused(model, scratch, data):
    """A valid profile with values replaced, dropped or added: loading it and planning with it
    ends in a plan whose JSON report is strict JSON, or in a GraphoptError; nothing else."""
    d = _valid(data.draw(st.sampled_from(["cpu", "h100"]), label="base"))
    for _ in range(data.draw(st.integers(1, 3), label="edits")):
        how = data.draw(st.sampled_from(_EDITS), label="how")
        slots = _slots(d, [])
        numbers = [(o, k) for o, k in slots if _is_number(o[k])]
        if how == "scale" and numbers:  # a plausible edit: a number, another magnitude
            obj, key = data.draw(st.sampled_from(numbers), label="number")
            obj[key] = obj[key] * data.draw(_FACTORS, label="factor")
            continue
        if not slots:
            break
        obj, key = data.draw(st.sampled_from(slots), label="slot")
        if how == "drop":
            del obj[key]
        elif how == "add":
            obj[data.draw(st.text(max_size=5), label="new key")] = data.draw(_VALUES)
        else:
            obj[key] = data.draw(_VALUES, label="value")
    scratch.write_text(json.dumps(d))
    try:
        plan = graphopt.plan(str(model), target=load_profile(scratch))
    except GraphoptError as e:
        assert e.problem and e.fix
        event("refused")
        return
    event("planned")
    report = json.loads(plan.to_json(), parse_constant=_no_constant)
    assert "non_finite" not in report  # a validated profile gives finite numbers throughout
    times = [n[k] for n in report["nodes"] for k in ("est_time_s", "memory_time_s")]
    assert times and all(math.isfinite(t) and t >= 0 for t in times), times


# -- the JSON report -------------------------------------------------------------------------

def test_a_nan_in_the_report_is_written_as_null_and_named(model):
    """A profile built in Python is not read from a file, so it is not validated: a NaN launch
    overhead reaches the report, which raised ValueError and is now strict JSON that names
    the fields written as null (as the Markdown and HTML reports show a dash)."""
    bad = replace(get_target("cpu"), launch_overhead_s=math.nan)
    text = graphopt.plan(str(model), target=bad).to_json()
    report = json.loads(text, parse_constant=_no_constant)
    fields = report["non_finite"]["fields"]
    assert "null" in report["non_finite"]["why"]
    assert any(f.startswith("nodes[") and f.endswith("est_time_s") for f in fields), fields


# -- devices ---------------------------------------------------------------------------------

def test_a_thousand_devices_are_refused_at_once(model, capsys):
    """1,000 devices on a 4-node model got no answer in 90 s (a link per pair, a scheduler
    quadratic in devices): now a prompt, clear refusal."""
    spec = ",".join(f"cuda:{i}=h100" for i in range(1000))
    start = time.perf_counter()
    _fails(["plan", str(model), "--devices", spec], capsys, "1000 devices given",
           f"at most {MAX_DEVICES}")
    assert time.perf_counter() - start < 5


def test_the_device_bound_holds_for_the_api_and_admits_its_maximum():
    """The bound is MAX_DEVICES exactly, whichever way devices come in, and a set of the
    maximum is built fast (one link per pair of profiles, not per pair of devices)."""
    start = time.perf_counter()
    ds = parse_devices(",".join(f"cuda:{i}=h100@n{i // 8}" for i in range(MAX_DEVICES))
                       + ",net=400Gb/s")
    assert len(ds.devices) == MAX_DEVICES and time.perf_counter() - start < 5
    assert ds.link("cuda:0", "cuda:1").name == "nvlink4" and ds.link("cuda:0", "cuda:8").name \
        .startswith("net-")
    h100 = get_target("h100")
    many = [Device(f"d{i}", h100, h100.memory_bytes) for i in range(MAX_DEVICES + 1)]
    with pytest.raises(GraphoptError, match=f"{MAX_DEVICES + 1} devices given"):
        make_device_set(many)


# -- graphopt cost ---------------------------------------------------------------------------

@pytest.mark.parametrize("argv, needles", [
    (["attention", "1", "32", "1024", "128", "kv_heads=5"], ("kv_heads=5", "heads=32")),
    (["attention", "1", "32", "1024", "128", "kv_heads=64"], ("kv_heads=64", "heads=32")),
    (["attention", "1", "32", "1024", "128", "causal=7"], ("causal=7",)),
    (["elementwise", "100", "inputs=3"], ("inputs=3",)),
    (["gemm", str(10**30), "4096", "4096"], (f"M={10**30}", "2**40")),
    (["gemm", "4096", "4096", "4096", f"batch={10**12}"], ("tensor a", "2**48")),
    (["gemm", "64", "M=128", "4096"], ("M is given twice",)),
], ids=["kv-heads-not-dividing", "kv-heads-above-heads", "causal-7", "inputs-3", "dim-1e30",
        "tensor-too-big", "dim-twice"])
def test_cost_refuses_dims_that_build_no_real_op(capsys, argv, needles):
    """Each was silently dropped, clamped or costed as an absurd size."""
    _fails(["cost", *argv], capsys, *needles)


def test_estimate_op_refuses_kv_heads_not_dividing_heads():
    with pytest.raises(GraphoptError, match="kv_heads=6 does not divide heads=32"):
        estimate_op("attention", batch=1, heads=32, seq=128, head_dim=64, kv_heads=6)
    assert estimate_op("attention", batch=1, heads=32, seq=128, head_dim=64, kv_heads=8).bytes \
        < estimate_op("attention", batch=1, heads=32, seq=128, head_dim=64).bytes
