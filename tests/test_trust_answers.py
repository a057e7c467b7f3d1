"""Issue 30, findings 8 and 9: a GraphoptError that names the problem and the fix, or a correct
answer, where a user's call used to end in a traceback or a misleading result.

Each test is written as the user hits it: the public call with the input that broke it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

import graphopt
from graphopt.backends.onnx.numerics import compare as onnx_compare
from graphopt.backends.torch.verify import compare_outputs
from graphopt.decisions.tolerance import tolerance_for
from graphopt.hardware.detect import HOST_ISA_ENV, host_cpu_profile
from graphopt.hardware.profile import HardwareProfile
from graphopt.measure import host_cache


class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2 = nn.Linear(64, 64), nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class _OwnNonFinite(nn.Module):
    """Outputs that hold the model's own inf and NaN (a masked score row, 0/0)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        mask = torch.zeros_like(y)
        mask[:, :4] = float("-inf")
        mask[:, 4:6] = float("nan")
        return y + mask


# --- finding 8: tracebacks ------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["int4", "int8_weight_only", "fp8"])
def test_a_zero_row_example_with_a_named_format_is_a_graphopt_error(fmt: str) -> None:
    with pytest.raises(graphopt.GraphoptError, match="at least one row") as e:
        graphopt.optimize(_Mlp().eval(), (torch.randn(0, 64),), target="h100", quantize=fmt)
    assert "(0, 64)" in str(e.value)


def test_a_cache_path_the_os_refuses_calibrates_for_the_run(tmp_path, monkeypatch,
                                                             caplog) -> None:
    made: list[int] = []

    def measure(threads: int) -> HardwareProfile:
        made.append(threads)
        return host_cpu_profile()

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / ("a" * 5000)))  # ENAMETOOLONG
    monkeypatch.delenv(host_cache.NO_CALIBRATE_ENV, raising=False)
    monkeypatch.delenv(HOST_ISA_ENV, raising=False)
    monkeypatch.setattr(host_cache, "_measure", measure)
    monkeypatch.setattr(host_cache, "_unsaved", {})
    profile = host_cache.cached_host_profile(threads=1)
    assert profile is not None and made == [1]
    assert "XDG_CACHE_HOME" in caplog.text
    host_cache.cached_host_profile(threads=1)  # the run's own copy: not measured again
    assert made == [1]


def test_devices_as_a_list_is_the_same_split_as_the_string() -> None:
    x = (torch.randn(8, 64),)
    as_list = graphopt.plan(_Mlp().eval(), x, "h100", devices=["cuda:0=h100", "cuda:1=h100"])
    as_text = graphopt.plan(_Mlp().eval(), x, "h100", devices="cuda:0=h100,cuda:1=h100")
    assert as_list.partition == as_text.partition
    with pytest.raises(graphopt.GraphoptError, match="not a device list"):
        graphopt.plan(_Mlp().eval(), x, "h100", devices=42)


def test_a_cache_len_past_the_host_memory_is_a_graphopt_error() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(num_hidden_layers=1, hidden_size=32,
                                      num_attention_heads=2, num_key_value_heads=2,
                                      intermediate_size=64, vocab_size=64)
    model = transformers.LlamaForCausalLM(config).eval()
    with pytest.raises(graphopt.GraphoptError, match="smaller cache_len"):
        graphopt.plan_llm(model, "h100", batch=(1, 4), prompt_len=8, cache_len=2 ** 62)


# --- finding 9: misleading answers ----------------------------------------------------------
def test_the_models_own_inf_and_nan_count_as_equal() -> None:
    model = _OwnNonFinite().eval()
    x = torch.randn(4, 32)
    opt = graphopt.optimize(model, (x,), target="cpu")
    assert all(n["within"] for n in opt.numerics), opt.numerics
    ref, out = model(x), opt.module(x)
    assert torch.equal(ref.isnan(), out.isnan()) and torch.equal(ref.isinf(), out.isinf())


def test_an_inf_or_nan_the_reference_does_not_have_is_an_error() -> None:
    tol = tolerance_for("fp32")
    ref = torch.tensor([1.0, float("nan"), float("inf"), 2.0])
    assert compare_outputs(ref, ref.clone(), tol)[0].within
    for bad in ([1.0, float("nan"), float("-inf"), 2.0],  # another inf
                [1.0, float("inf"), float("inf"), 2.0],  # inf for NaN
                [float("nan"), float("nan"), float("inf"), 2.0]):  # NaN for a number
        assert not compare_outputs(ref, torch.tensor(bad), tol)[0].within, bad
    r = [[np.array([1.0, np.nan, np.inf], dtype=np.float32)]]
    assert onnx_compare(r, [[r[0][0].copy()]], ["y"], tol)[0].within
    other = [[np.array([1.0, np.inf, np.inf], dtype=np.float32)]]
    assert not onnx_compare(r, other, ["y"], tol)[0].within


@pytest.mark.parametrize("value", [True, False])
def test_a_boolean_tolerance_is_not_a_budget(value: bool) -> None:
    with pytest.raises(graphopt.GraphoptError, match="positive number"):
        graphopt.optimize(_Mlp().eval(), (torch.randn(2, 64),), target="cpu", tolerance=value)


def test_measure_takes_only_a_boolean() -> None:
    with pytest.raises(graphopt.GraphoptError, match="True, False or None"):
        graphopt.optimize(_Mlp().eval(), (torch.randn(2, 64),), target="cpu", measure="yes")


def test_a_float_budget_still_works() -> None:
    opt = graphopt.optimize(_Mlp().eval(), (torch.randn(2, 64),), target="cpu", tolerance=0.01)
    assert all(math.isfinite(n["max_abs"]) for n in opt.numerics)


# --- issue 33, finding 6: strings are routed by what they name ------------------------------
def test_optimize_takes_a_builder_spec_as_plan_does(tmp_path) -> None:
    (tmp_path / "mm.py").write_text(
        "import torch\n\ndef build():\n"
        "    torch.manual_seed(0)\n"
        "    m = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).eval()\n"
        "    return m, (torch.randn(4, 16),)\n")
    opt = graphopt.optimize(f"{tmp_path}/mm.py:build", target="cpu")
    assert opt.module is not None and all(n["within"] for n in opt.numerics)
    with pytest.raises(graphopt.GraphoptError, match="functions in"):
        graphopt.optimize(f"{tmp_path}/mm.py", target="cpu")
    with pytest.raises(graphopt.GraphoptError, match="names no file"):
        graphopt.optimize("my_model", target="cpu")


# --- thread counts a saved file carries -------------------------------------------------------
def test_a_saved_files_thread_count_is_bounded(tmp_path) -> None:
    """A .pt2's runtime record asking for 4096 threads is refused at load; a plan made for a
    bigger CPU than this one sets at most this machine's CPUs."""
    import dataclasses
    import json
    import os
    import zipfile

    from graphopt.decisions.memory_runtime.runtime import Setting, apply_runtime_settings

    opt = graphopt.optimize(_Mlp().eval(), (torch.randn(2, 64),), target="cpu", measure=False)
    good = opt.save(tmp_path / "good.pt2")
    bad = tmp_path / "bad.pt2"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(bad, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename.endswith("graphopt_runtime.json"):
                record = json.loads(data)
                record["settings"]["num_threads"] = {"value": 4096, "reason": "crafted"}
                data = json.dumps(record).encode()
            dst.writestr(item, data)
    with pytest.raises(graphopt.GraphoptError, match="num_threads is 4096"):
        graphopt.load(bad)
    settings = graphopt.load(good).runtime_settings
    many = dataclasses.replace(settings, num_threads=Setting(512, "a 256-core server's plan"))
    before = torch.get_num_threads()
    try:
        with apply_runtime_settings(many) as report:
            assert torch.get_num_threads() <= (os.cpu_count() or 1)
            assert "more than this machine" in report["num_threads"]
    finally:
        torch.set_num_threads(before)
