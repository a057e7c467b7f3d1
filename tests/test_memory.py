"""Memory plan: parameters once, activation peak from lifetimes, reserve policy, batch sizing."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch import nn

import graphopt
from graphopt.decisions import memory_plan, plan_precisions, render_breakdown
from graphopt.decisions.memory_runtime.memory import (
    CPU_RESERVE,
    GIB,
    GPU_RESERVE,
    MIB,
    ReservePolicy,
    gemm_workspace_bytes,
    usable_memory,
)
from graphopt.decisions.planner import build_plan
from graphopt.errors import GraphoptError
from graphopt.hardware.profile import HardwareProfile
from graphopt.hardware.registry import get_target
from graphopt.ir.plan import Plan
from tests.irbuild import G

NO_RESERVE = ReservePolicy(0, 0.0, "test: none")


def residual_graph(batch: int = 8, extra_param_view: bool = False):
    """x -> fc1 -> relu -> view -> mm -> view -> add(., fc1): fc1's output lives to the end.

    fp32 sizes at batch 8: x 2048 B, every other activation 4096 B; w1 32768 B, w2 16384 B.
    """
    g = G()
    x = g.input("x", (batch, 64))
    w1 = g.param("w1", (128, 64))
    h1 = g.op("Linear", [x, w1], (batch, 128), name="fc1")
    h2 = g.op("Relu", [h1], (batch, 128), name="relu")
    v = g.op("Reshape", [h2], (batch, 2, 64), name="view1")
    w2 = g.param("w2", (64, 64))
    if extra_param_view:  # W.t() in torch: a view of a parameter, not an activation
        w2 = g.op("Transpose", [w2], (64, 64), name="w2_t", alias=True, perm=[1, 0])
    h3 = g.op("MatMul", [v, w2], (batch, 2, 64), name="mm")
    f = g.op("Reshape", [h3], (batch, 128), name="view2")
    o = g.op("Add", [f, h1], (batch, 128), name="add")
    return g.build([o])


def _plan(graph, target: HardwareProfile | str = "rtx-4090") -> Plan:
    return build_plan(graph, get_target(target) if isinstance(target, str) else target)


def test_activation_peak_from_lifetimes_by_hand() -> None:
    p = _plan(residual_graph())
    mp = memory_plan(p)
    # live sets per step (bytes): fc1 x+h1 = 6144; relu h1+h2 = 8192; view1 8192;
    # mm h1+h2+h3 = 12288; view2 h1+h3 = 8192; add h1+h3+out = 12288.
    assert mp.activation_peak_bytes == 12288
    assert mp.peak_node == "mm"
    assert mp.activation_total_bytes == 2048 + 4 * 4096  # views add no storage
    # the largest single node: add reads view2 (h3's storage, 4096) and h1 (4096), writes 4096
    largest_node = 4096 + 4096 + 4096
    assert largest_node <= mp.activation_peak_bytes <= mp.activation_total_bytes
    assert mp.activation_peak_bytes < mp.activation_total_bytes  # not the sum


def test_view_of_a_parameter_is_not_an_activation() -> None:
    plain = memory_plan(_plan(residual_graph()))
    viewed = memory_plan(_plan(residual_graph(extra_param_view=True)))
    assert viewed.activation_peak_bytes == plain.activation_peak_bytes
    assert viewed.activation_total_bytes == plain.activation_total_bytes
    assert viewed.param_bytes == plain.param_bytes == 32768 + 16384


def test_tied_weight_counted_once() -> None:
    g = G()
    x = g.input("x", (4, 32))
    w = g.param("w", (32, 32))
    h = g.op("Linear", [x, w], (4, 32), name="a")
    o = g.op("Linear", [h, w], (4, 32), name="b")
    mp = memory_plan(_plan(g.build([o])))
    assert mp.param_count == 32 * 32 and mp.param_bytes == 32 * 32 * 4


def test_precision_formats_and_compression() -> None:
    p = _plan(residual_graph())
    fp32 = memory_plan(p)
    assert fp32.compression_ratio == 1.0 and fp32.saved_bytes == 0
    bf16 = memory_plan(p, "bf16")
    assert bf16.param_bytes == (128 * 64 + 64 * 64) * 2
    assert bf16.compression_ratio == pytest.approx(2.0)
    q4 = memory_plan(p, "Q4_K_M")  # rank-2 weights at 4.84 bpw
    assert q4.param_bytes == math.ceil(128 * 64 * 4.84 / 8) + math.ceil(64 * 64 * 4.84 / 8)
    assert q4.saved_bytes == fp32.param_bytes - q4.param_bytes
    assert memory_plan(p, {"fc1": 8}).param_bytes == 128 * 64 + 64 * 64 * 4  # per node, bits
    assert memory_plan(p, activation_dtype="bf16").activation_peak_bytes == 12288 // 2


def test_bias_keeps_its_dtype_under_block_formats() -> None:
    g = G()
    x = g.input("x", (4, 64))
    w, b = g.param("w", (64, 64)), g.param("b", (64,))
    o = g.op("Linear", [x, w, b], (4, 64), name="fc")
    p = _plan(g.build([o]))
    assert memory_plan(p, "q8_0").param_bytes == 64 * 64 * 8.5 / 8 + 64 * 4
    assert memory_plan(p, "fp16").param_bytes == (64 * 64 + 64) * 2


def test_precision_decisions_as_input() -> None:
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                          nn.Linear(256, 256)).eval()
    p = graphopt.plan(model, (torch.randn(64, 256),), target="h100")
    mp = memory_plan(p, plan_precisions(p))
    assert mp.param_format == "per-node"
    assert mp.param_bytes < memory_plan(p).param_bytes
    assert memory_plan(p).param_bytes == p.model.param_bytes


def test_reserve_policy_scales() -> None:
    card = get_target("rtx-4090")
    assert GPU_RESERVE.reserve(card.memory_bytes) == int(0.08 * 24 * GIB)  # ~1.92 GiB
    assert usable_memory(card) == 24 * GIB - int(0.08 * 24 * GIB)
    small = dataclasses.replace(card, memory_bytes=8 * GIB)  # 8 % = 0.64 GiB < 1 GiB floor
    assert GPU_RESERVE.reserve(small.memory_bytes) == GIB
    assert CPU_RESERVE.reserve(16 * GIB) == 2 * GIB and CPU_RESERVE.reserve(64 * GIB) == int(
        6.4 * GIB)
    assert ReservePolicy(GIB, 0.5, "x").reserve(GIB // 2) == GIB // 2  # never above the total


def test_workspace_per_generation() -> None:
    assert gemm_workspace_bytes(get_target("h100"))[0] == 32 * MIB
    assert gemm_workspace_bytes(get_target("b200"))[0] == 32 * MIB
    assert gemm_workspace_bytes(get_target("a100"))[0] == 4 * MIB
    assert gemm_workspace_bytes(get_target("xeon-8380"))[0] == 0
    g = G()
    x = g.input("x", (4, 8))
    o = g.op("Relu", [x], (4, 8), name="r")
    assert memory_plan(_plan(g.build([o]), "h100")).workspace_bytes == 0  # no GEMM


def _sized(total: int) -> Plan:
    """The residual graph on a CPU (no workspace) with ``total`` bytes of memory."""
    cpu = dataclasses.replace(get_target("xeon-8380"), memory_bytes=total)
    return _plan(residual_graph(), cpu)


PARAMS = 32768 + 16384
PER_SAMPLE = 12288 // 8  # activation peak at the traced batch 8, per sample


@pytest.mark.parametrize(("samples", "expected"), [(13, 8), (16, 16), (23, 16), (5, 5), (1, 1)])
def test_max_batch_by_hand(samples: int, expected: int) -> None:
    mp = memory_plan(_sized(PARAMS + samples * PER_SAMPLE + 100), reserve_policy=NO_RESERVE)
    assert mp.max_batch_size == expected
    if samples < 8:
        assert "fewer than 8" in mp.batch_note
    assert mp.fits == (samples >= 8)  # traced at batch 8


def test_max_batch_zero_when_nothing_fits() -> None:
    mp = memory_plan(_sized(PARAMS + 1000), reserve_policy=NO_RESERVE)
    assert mp.max_batch_size == 0 and not mp.fits and "not even batch 1" in mp.batch_note
    mp = memory_plan(_sized(PARAMS - 1), reserve_policy=NO_RESERVE)
    assert mp.max_batch_size == 0 and mp.free_bytes < 0


def test_max_batch_on_a_gpu_with_the_default_policy() -> None:
    mp = memory_plan(_plan(residual_graph(), "rtx-4090"))
    usable = 24 * GIB - int(0.08 * 24 * GIB)
    raw = (usable - PARAMS - 4 * MIB) // PER_SAMPLE
    assert mp.max_batch_size == raw - raw % 8 and mp.fits


def test_breakdown_rows_sum_to_total() -> None:
    mp = memory_plan(_plan(residual_graph(), "rtx-4090"))
    rows = mp.breakdown
    assert [r.component for r in rows] == ["parameters", "activations (peak)", "workspace",
                                           "reserve", "free"]
    assert sum(r.bytes for r in rows) == mp.total_bytes
    assert sum(r.percent for r in rows) == pytest.approx(100.0, abs=0.05)
    md = render_breakdown(mp)
    assert "| component | bytes | size | % of total |" in md and "| reserve |" in md
    d = mp.to_json()
    for key in ("param_bytes", "activation_peak_bytes", "max_batch_size", "fits",
                "compression_ratio", "breakdown", "reserve_policy"):
        assert key in d


def test_torch_model_peak_bounds() -> None:
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 8)).eval()
    p = graphopt.plan(model, (torch.randn(16, 32),), target="l4")
    mp = memory_plan(p)
    assert mp.traced_batch == 16
    biggest = max(sum(t.nbytes for t in (*n.inputs, *n.outputs)
                      if t is not None and t.kind in ("input", "activation"))
                  for n in p.nodes)
    assert biggest <= mp.activation_peak_bytes <= mp.activation_total_bytes


def test_bad_input() -> None:
    p = _plan(residual_graph())
    with pytest.raises(GraphoptError) as e:
        memory_plan(p, "q3_xyz")
    assert e.value.fix
    with pytest.raises(GraphoptError):
        memory_plan(p, batch_dim=-1)
    with pytest.raises(GraphoptError):
        memory_plan(p, activation_dtype="fp13")
    with pytest.raises(GraphoptError):
        memory_plan(p, {"fc1": 0})
