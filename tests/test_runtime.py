"""Runtime settings per target and exact restore by the context manager."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import torch

from graphopt.decisions.memory_runtime.runtime import (
    ALLOC_CONF_ENV,
    RuntimeSettings,
    Setting,
    apply_runtime_settings,
    runtime_settings,
    snapshot_torch_state,
)
from graphopt.hardware.registry import get_target


@pytest.fixture(autouse=True)
def _isolate(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No test may leak torch state into the next, whatever the code under test does."""
    monkeypatch.delenv(ALLOC_CONF_ENV, raising=False)
    before = snapshot_torch_state()
    yield
    assert snapshot_torch_state() == before


def _values(s: RuntimeSettings) -> dict[str, object]:
    return {k: v["value"] for k, v in s.to_json().items() if isinstance(v, dict)}


def test_h100_settings() -> None:
    v = _values(runtime_settings("h100", has_convs=True, head_dim=128, max_batch_size=48))
    assert v["matmul_allow_tf32"] is True and v["cudnn_allow_tf32"] is True
    assert v["float32_matmul_precision"] == "high" and v["cudnn_benchmark"] is True
    assert v["cuda_alloc_conf"] == "expandable_segments:True"
    assert v["sdpa_backends"] == ["flash", "efficient", "math"]
    assert v["batch_size"] == 48 and v["num_threads"] is None


def test_v100_and_t4_settings() -> None:
    v = _values(runtime_settings("v100", head_dim=64))
    assert v["matmul_allow_tf32"] is False and v["float32_matmul_precision"] == "highest"
    assert v["sdpa_backends"][0] == "efficient"  # no flash before sm_80
    t4 = _values(runtime_settings("t4"))  # 16 GiB: fragmentation guard, not expandable segments
    assert t4["cuda_alloc_conf"].startswith("max_split_size_mb:")


def test_cpu_settings() -> None:
    cpu = get_target("cpu")
    s = runtime_settings(cpu, max_batch_size=None)
    v = _values(s)
    assert s.device == "cpu" and v["num_threads"] == cpu.cores and v["mkldnn_enabled"] is True
    assert v["matmul_allow_tf32"] is None and v["cuda_alloc_conf"] is None
    assert v["sdpa_backends"] == ["flash", "math"] and v["batch_size"] is None
    assert _values(runtime_settings("xeon-8480"))["num_threads"] == 56


def test_precision_and_shape_rules() -> None:
    strict = _values(runtime_settings("a100", precision="fp32"))
    assert strict["matmul_allow_tf32"] is False and strict["float32_matmul_precision"] == "highest"
    assert strict["sdpa_backends"][0] == "efficient"  # fp32 activations: no flash
    dyn = _values(runtime_settings("a100", has_convs=True, static_shapes=False))
    assert dyn["cudnn_benchmark"] is False
    assert _values(runtime_settings("a100"))["cudnn_benchmark"] is False  # no convs
    assert _values(runtime_settings("h100", head_dim=320))["sdpa_backends"][0] == "efficient"
    assert _values(runtime_settings("h100", head_dim=100))["sdpa_backends"] == ["math"]


@pytest.mark.parametrize("target", ["h100", "v100", "t4", "rtx-5090", "cpu", "graviton3"])
def test_every_setting_has_a_reason_and_serializes(target: str) -> None:
    d = runtime_settings(target, has_convs=True).to_json()
    json.dumps(d)
    assert all(v["reason"] for v in d.values() if isinstance(v, dict))


def test_context_manager_applies_and_restores_exactly() -> None:
    torch.backends.cudnn.benchmark = False
    before = snapshot_torch_state()
    with apply_runtime_settings(runtime_settings("h100", has_convs=True)) as report:
        assert torch.backends.cuda.matmul.allow_tf32 is True
        assert torch.get_float32_matmul_precision() == "high"
        assert torch.backends.cudnn.benchmark is True
        assert "set" in report["cuda_alloc_conf"]  # CUDA is not initialized here
        assert torch.backends.cuda.flash_sdp_enabled() is True
        x = torch.randn(1, 2, 8, 64)
        torch.nn.functional.scaled_dot_product_attention(x, x, x)
    assert snapshot_torch_state() == before
    assert torch.backends.cuda.matmul.allow_tf32 is before["cuda.matmul.allow_tf32"]  # readable


def test_context_manager_restores_after_exception() -> None:
    torch.backends.cudnn.benchmark = True  # a non-default starting state
    try:
        before = snapshot_torch_state()
        cpu = runtime_settings("cpu")
        with pytest.raises(RuntimeError, match="boom"):
            with apply_runtime_settings(cpu):
                assert torch.get_num_threads() == cpu.num_threads.value
                raise RuntimeError("boom")
        assert snapshot_torch_state() == before
    finally:
        torch.backends.cudnn.benchmark = False


def test_alloc_conf_not_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    s = runtime_settings("h100")
    monkeypatch.setenv(ALLOC_CONF_ENV, "max_split_size_mb:64")
    with apply_runtime_settings(s) as report:
        assert "kept the user's" in report["cuda_alloc_conf"]
        assert torch.cuda.is_initialized() is False
    monkeypatch.delenv(ALLOC_CONF_ENV)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with apply_runtime_settings(s) as report:
        assert "before the process starts" in report["cuda_alloc_conf"]
        assert ALLOC_CONF_ENV not in __import__("os").environ


def test_none_values_leave_state_alone() -> None:
    base = runtime_settings("cpu")
    untouched = RuntimeSettings(**{**{f: getattr(base, f) for f in base.__slots__},
                                   "float32_matmul_precision": Setting(None, "test"),
                                   "num_threads": Setting(None, "test"),
                                   "mkldnn_enabled": Setting(None, "test"),
                                   "sdpa_backends": Setting(None, "test")})
    before = snapshot_torch_state()
    with apply_runtime_settings(untouched) as report:
        assert report == {} and snapshot_torch_state() == before
