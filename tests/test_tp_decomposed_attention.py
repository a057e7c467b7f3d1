"""Tensor-parallel blocks around attention written out as MatMul -> Softmax -> MatMul (an ONNX
export without a fused attention op): recognized with its heads, split by the cost model,
and not recognized when the attention's output leaves the block."""

from __future__ import annotations

import pytest

from graphopt.analysis.kernel_class import KernelClass
from graphopt.decisions.planner import build_plan
from graphopt.hardware import get_target
from graphopt.partition import parse_devices
from graphopt.partition.tensor_parallel import tensor_parallel
from graphopt.partition.tp_blocks import find_tp_blocks
from tests.irbuild import G

H100 = get_target("h100")
S, HEADS, D = 128, 8, 64
H = HEADS * D


def _heads(g: G, x: str, w: str, name: str, transpose_k: bool = False) -> str:
    """x (1, S, H) -> MatMul w -> (1, S, heads, d) -> (1, heads, S, d), or (1, heads, d, S)."""
    y = g.op("MatMul", [x, g.param(w, (H, H))], (1, S, H), name=name)
    shape = g.param(f"{name}_shape", (4,), "int64", kind="constant")
    r = g.op("Reshape", [y, shape], (1, S, HEADS, D), name=f"{name}_split")
    perm, out = ([0, 2, 3, 1], (1, HEADS, D, S)) if transpose_k else ([0, 2, 1, 3],
                                                                      (1, HEADS, S, D))
    return g.op("Transpose", [r], out, name=f"{name}_heads", perm=perm)


def attention_graph(leak: bool = False):
    g = G()
    x = g.input("x", (1, S, H))
    q, kt, v = _heads(g, x, "wq", "q"), _heads(g, x, "wk", "k", True), _heads(g, x, "wv", "v")
    scores = g.op("MatMul", [q, kt], (1, HEADS, S, S), name="qk")
    scale = g.param("scale", (), kind="constant")
    scaled = g.op("Div", [scores, scale], (1, HEADS, S, S), name="scaled")
    probs = g.op("Softmax", [scaled], (1, HEADS, S, S), name="probs", axis=-1)
    ctx = g.op("MatMul", [probs, v], (1, HEADS, S, D), name="pv")
    merged = g.op("Transpose", [ctx], (1, S, HEADS, D), name="merge", perm=[0, 2, 1, 3])
    flat = g.op("Reshape", [merged, g.param("flat_shape", (3,), "int64", kind="constant")],
                (1, S, H), name="flat")
    out = g.op("MatMul", [flat, g.param("wo", (H, H))], (1, S, H), name="o")
    return g.build([out, ctx] if leak else [out])


def test_decomposed_attention_is_one_block_with_its_heads():
    plan = build_plan(attention_graph(), H100)
    unit = [n.name for n in plan.nodes if n.analysis.kernel_class is KernelClass.ATTENTION]
    assert unit == ["qk", "scaled", "probs", "pv"]  # one pattern, four nodes
    (b,), why = find_tp_blocks(plan, 2)
    assert why == []
    assert (b.kind, b.column, b.row) == ("attention", ("q", "k", "v"), ("o",))
    assert (b.heads, b.kv_heads, b.head_dim, b.hidden, b.inner) == (HEADS, HEADS, D, H, H)
    assert b.attention == ("qk", "scaled", "probs", "pv") and not b.fused_qkv
    assert {"q_heads", "k_heads", "v_heads", "merge", "flat"} <= set(b.nodes)
    assert b.weight_layout == "k_by_n"  # MatMul weights: costed, not emitted by ColwiseParallel


def test_decomposed_attention_splits_by_heads():
    plan = build_plan(attention_graph(), H100)
    tp = tensor_parallel(plan, parse_devices("cuda:0=h100,cuda:1=h100"))
    (s,) = tp.splits
    assert s.kind == "attention" and s.compute_s < s.unsplit_s
    assert [c.after for c in tp.collectives] == ["o"]
    # every node of the softmax pattern runs 4 of the 8 heads on each device
    reasons = {x.node: x.reason for x in tp.schedule if x.device == "cuda:0"}
    assert all(reasons[n].startswith("inside attention@o") for n in ("qk", "probs", "pv"))
    assert tp.makespan_s == pytest.approx(
        sum(max(x.finish_s - x.start_s for x in tp.schedule if x.node == n.name)
            for n in plan.nodes) + tp.collectives[0].finish_s - tp.collectives[0].start_s,
        rel=1e-9)


def test_must_not_fire_when_the_heads_leave_the_block():
    plan = build_plan(attention_graph(leak=True), H100)  # pv is also a graph output
    blocks, why = find_tp_blocks(plan, 2)
    assert blocks == []
    assert why == ["attention at qk not split: the attention's output is read outside the block "
                   "or returned"]
