"""The what-if calculator (issue 12 item 4): the planner's own cost of one op, API and CLI."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import onnx
import pytest

import graphopt
from graphopt.cost import estimate_op
from graphopt.errors import GraphoptError
from graphopt.hardware import get_target


def _matmul_model(m: int, k: int, n: int) -> onnx.ModelProto:
    h = onnx.helper
    x = h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [m, k])
    y = h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [m, n])
    w = onnx.numpy_helper.from_array(np.zeros((k, n), np.float32), "w")
    g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g", [x], [y], [w])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("target", ["h100", "a100", "v100", "cpu"])
@pytest.mark.parametrize("mkn", [(4096, 4096, 4096), (1, 4096, 11008), (128, 7168, 2112)])
def test_the_calculator_is_the_planners_model(target, mkn):
    m, k, n = mkn
    node = graphopt.plan(_matmul_model(m, k, n), target=target).node("mm")
    e = estimate_op("gemm" if m > 1 else "gemv", dtype="fp32", target=target,
                    **({"M": m} if m > 1 else {}), N=n, K=k)
    assert e.time_s == node.cost.est_time_s
    assert e.bound == node.cost.bottleneck
    assert e.kernel_class == node.analysis.kernel_class.value
    assert e.flops == node.analysis.flops == 2 * m * n * k


def test_a_compute_bound_gemm_by_hand():
    h100 = get_target("h100")
    e = estimate_op("gemm", M=8192, N=8192, K=8192, dtype="fp8", target="h100")
    assert e.bound == "compute" and e.kernel == "tensor cores, fp8"
    achievable = h100.peak_flops["fp8"] * e.compute_fraction
    assert e.time_s == pytest.approx(2 * 8192**3 / achievable + h100.launch_overhead_s)
    # Hopper FP8: the mean of ml-engineering's measured H100 (70.9%) and H200 (73.4%) MAMF
    assert e.compute_fraction == pytest.approx(0.72 * e.utilization * e.alignment_efficiency)
    assert "of the 1979 TFLOP/s fp8 peak" in e.reason


def test_kinds_classify_and_bound_as_expected():
    gemv = estimate_op("gemv", N=4096, K=4096, target="h100")
    assert gemv.kernel_class == "gemv" and gemv.bound == "memory"
    causal = estimate_op("attention", batch=1, heads=32, seq=4096, head_dim=128, causal=1)
    full = estimate_op("attention", batch=1, heads=32, seq=4096, head_dim=128)
    assert causal.kernel_class == "attention" and causal.flops < 0.6 * full.flops
    ew = estimate_op("elementwise", numel=1 << 26, target="a100")
    assert ew.bound == "memory" and ew.kernel.startswith("CUDA cores")
    conv = estimate_op("conv", batch=8, c_in=3, c_out=64, h=224, w=224, kernel=7, stride=2,
                       dtype="fp16", target="v100")
    # cuDNN pads 3 channels per filter tap to a 32-channel K step on Volta (cost.conv_taps)
    assert conv.dims["M"] == 8 * 112 * 112 and conv.kernel == "tensor cores, fp16"
    assert "3 input channels per filter tap fill 3 of 32" in conv.reason
    # an unaligned N costs more on Ampere's tensor cores, never less
    assert estimate_op("gemm", M=4096, N=4095, K=4096, target="a100").time_s > \
        estimate_op("gemm", M=4096, N=4096, K=4096, target="a100").time_s


@pytest.mark.parametrize(("kind", "dims", "match"), [
    ("matmul", {"M": 1}, "unknown op kind"),
    ("gemm", {"M": 4, "N": 4}, "missing K"),
    ("gemm", {"M": 4, "N": 4, "K": 4, "Q": 1}, "unknown Q"),
    ("gemm", {"M": 0, "N": 4, "K": 4}, "positive integers"),
    ("conv", {"batch": 1, "c_in": 3, "c_out": 8, "h": 4, "w": 4, "groups": 2}, "must divide"),
])
def test_bad_requests_say_what_to_give(kind, dims, match):
    with pytest.raises(GraphoptError, match=match):
        estimate_op(kind, **dims)
    with pytest.raises(GraphoptError, match="unknown dtype"):
        estimate_op("gemm", M=4, N=4, K=4, dtype="fp64")


def test_cli_cost():
    cli = [sys.executable, "-m", "graphopt.cli", "cost"]
    out = subprocess.run([*cli, "gemm", "4096", "4096", "4096", "--dtype", "fp8", "--target",
                          "h100"], capture_output=True, text=True, check=True).stdout
    assert "compute-bound, on tensor cores, fp8" in out
    data = json.loads(subprocess.run([*cli, "attention", "2", "8", "1024", "64", "causal=1",
                                      "--json"], capture_output=True, text=True,
                                     check=True).stdout)
    assert data["kernel_class"] == "attention" and math.isfinite(data["time_s"])
    assert data["dims"]["seq_q"] == 1024
    bad = subprocess.run([*cli, "gemm", "4096", "x", "3"], capture_output=True, text=True)
    assert bad.returncode == 2 and "not an integer" in bad.stderr


def test_conv_padding_zero_is_a_size():
    same = estimate_op("conv", batch=1, c_in=64, c_out=64, h=56, w=56, kernel=3)
    valid = estimate_op("conv", batch=1, c_in=64, c_out=64, h=56, w=56, kernel=3, padding=0)
    assert same.dims["M"] == 56 * 56 and valid.dims["M"] == 54 * 54
