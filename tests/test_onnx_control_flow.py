"""Issue 31, item 8 (ONNX): recurrences and control flow are costed, not left ``other``.

* ``LSTM``/``GRU``/``RNN`` are the GEMM sequence of the recurrence: the FLOPs are compared with
  the GEMMs counted by hand (``x @ W^T`` and ``h @ R^T`` per step and direction) plus the gate
  sums and cell updates :mod:`graphopt.analysis.recurrent` derives.
* ``If`` costs its costlier branch: the branches' nodes are analysed and costed like any node.
* ``Loop``/``Scan`` cost their body times the trip count (a constant ``M``, the scanned length),
  and say so when it is unknown.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import graphopt
from graphopt.analysis.kernel_class import KernelClass as K
from tests.onnx_frontend_models import init, load, make, rng_array, vi

_SEQ, _BATCH, _IN, _HIDDEN = 5, 3, 8, 16


def _plan(model):
    return graphopt.plan(model, target="cpu")


def _rnn(op: str, gates: int, directions: int, bias: bool = True, layout: int = 0,
         batch: int = _BATCH):
    d = "bidirectional" if directions == 2 else "forward"
    inits = [init("W", rng_array(directions, gates * _HIDDEN, _IN)),
             init("R", rng_array(directions, gates * _HIDDEN, _HIDDEN))]
    if bias:
        inits.append(init("B", rng_array(directions, 2 * gates * _HIDDEN)))
    x = [batch, _SEQ, _IN] if layout else [_SEQ, batch, _IN]
    node = helper.make_node(op, ["X", "W", "R", "B" if bias else ""], ["Y"], name="rnn",
                            hidden_size=_HIDDEN, direction=d, layout=layout)
    return make([node], [vi("X", x)], [vi("Y", None)], inits)


def test_lstm_is_its_gemm_sequence() -> None:
    (node,) = _plan(_rnn("LSTM", 4, 1)).nodes
    a = node.analysis
    # per step: x[3, 8] @ W^T[8, 64] and h[3, 16] @ R^T[16, 64]
    gemms = 2 * _BATCH * 64 * _IN + 2 * _BATCH * 64 * _HIDDEN
    gate_sums = _BATCH * 64 * 3  # x part + h part, + Wb + Rb
    cell = _BATCH * _HIDDEN * (3 * 4 + 2 * 4 + 3 + 1)  # 3 sigmoid, 2 tanh, f*c+i*g, o*tanh(c)
    assert a.kernel_class is K.GEMM
    assert a.flops == _SEQ * (gemms + gate_sums + cell)
    assert dict(a.dims) == {"M": _BATCH, "N": 64, "K": _IN, "K_h": _HIDDEN, "batch": 1,
                            "steps": _SEQ, "directions": 1}
    assert node.cost.est_time_s > 0 and "unsupported_op" not in a.flags


def test_bidirectional_gru_without_bias_doubles_the_sequence() -> None:
    (node,) = _plan(_rnn("GRU", 3, 2, bias=False)).nodes
    gemms = 2 * _BATCH * 48 * (_IN + _HIDDEN)
    gate_sums = _BATCH * 48  # x part + h part only
    cell = _BATCH * _HIDDEN * (2 * 4 + 4 + 1 + 4)  # z, r sigmoids, tanh, r*(h@Rh), blend
    assert node.analysis.kernel_class is K.GEMM
    assert node.analysis.flops == 2 * _SEQ * (gemms + gate_sums + cell)


def test_batch_first_rnn_of_one_sequence_is_a_gemv_sequence() -> None:
    (node,) = _plan(_rnn("RNN", 1, 1, layout=1, batch=1)).nodes
    a = node.analysis
    assert a.kernel_class is K.GEMV
    assert (a.dims["M"], a.dims["steps"]) == (1, _SEQ)
    assert a.flops == _SEQ * (2 * 16 * (_IN + _HIDDEN) + 16 * 3 + 16 * 4)


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::torch.jit.TracerWarning")
def test_torch_lstm_exported_to_onnx_is_costed() -> None:
    """nn.LSTM through torch's exporter: one LSTM node (its bias input, default layout)."""
    torch = pytest.importorskip("torch")
    import io

    import onnx

    lstm = torch.nn.LSTM(_IN, _HIDDEN).eval()
    buf = io.BytesIO()
    torch.onnx.export(lstm, (torch.randn(_SEQ, _BATCH, _IN),), buf, dynamo=False)
    plan = graphopt.plan(onnx.load_from_string(buf.getvalue()), target="cpu")
    (node,) = [n for n in plan.nodes if n.op_type == "LSTM"]
    assert node.analysis.flops == _SEQ * (2 * _BATCH * 64 * (_IN + _HIDDEN) + _BATCH * 64 * 3
                                          + _BATCH * _HIDDEN * 24)
    assert not [n.op for n in plan.nodes if n.analysis.kernel_class is K.OTHER]


# --- control flow ------------------------------------------------------------------------------
def _branch(name: str, op: str) -> object:
    node = helper.make_node(op, ["X", "W"] if op == "MatMul" else ["X"], [name])
    return helper.make_graph([node], name, [], [vi(name, [64, 256])])


def _if(heavy_first: bool):
    heavy, light = _branch("t", "MatMul"), _branch("e", "Relu")
    then, other = (heavy, light) if heavy_first else (light, heavy)
    node = helper.make_node("If", ["c"], ["Y"], name="if", then_branch=then, else_branch=other)
    return make([node], [vi("c", [], TensorProto.BOOL), vi("X", [64, 256])], [vi("Y", [64, 256])],
                [init("W", rng_array(256, 256))])


@pytest.mark.parametrize("heavy_first", [True, False])
def test_if_costs_its_costlier_branch(heavy_first: bool) -> None:
    (node,) = _plan(_if(heavy_first)).nodes
    a = node.analysis
    # the same MatMul on its own: what the costly branch costs
    alone = _plan(make([helper.make_node("MatMul", ["X", "W"], ["Y"])], [vi("X", [64, 256])],
                       [vi("Y", [64, 256])], [init("W", rng_array(256, 256))])).nodes[0]
    assert a.kernel_class is K.CONTROL_FLOW
    assert a.flops == 2 * 64 * 256 * 256  # the MatMul's, not the Relu's 64 * 256
    assert a.dims["branch"] == (0 if heavy_first else 1)
    assert [[b.op_type for b in br] for br in a.branches] == (
        [["MatMul"], ["Relu"]] if heavy_first else [["Relu"], ["MatMul"]])
    assert node.cost.est_time_s == pytest.approx(alone.cost.est_time_s)
    relu = _plan(make([helper.make_node("Relu", ["X"], ["Y"])], [vi("X", [64, 256])],
                      [vi("Y", [64, 256])])).nodes[0]
    assert node.cost.est_time_s > 2 * relu.cost.est_time_s  # much costlier, and chosen
    assert ("then" if heavy_first else "else") in node.cost.note


def _loop(m: int | None, nested_if: bool = False):
    """h <- tanh(h @ W), ``m`` times (None: M is a graph input)."""
    nodes = [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
             helper.make_node("MatMul", ["h", "W"], ["h1"]),
             helper.make_node("Tanh", ["h1"], ["h_out"])]
    outs = [vi("cond_out", [], TensorProto.BOOL), vi("h_out", [4, 32])]
    if nested_if:
        nodes.append(helper.make_node("If", ["cond_in"], ["s"], then_branch=helper.make_graph(
            [helper.make_node("MatMul", ["h", "W"], ["a"])], "t", [], [vi("a", [4, 32])]),
            else_branch=helper.make_graph([helper.make_node("Neg", ["h"], ["b"])], "e", [],
                                          [vi("b", [4, 32])])))
        outs.append(vi("s", [4, 32]))
    body = helper.make_graph(nodes, "body", [vi("i", [], TensorProto.INT64),
                                             vi("cond_in", [], TensorProto.BOOL), vi("h", None)],
                             outs)
    inits = [init("W", rng_array(32, 32))]
    inputs = [vi("c", [], TensorProto.BOOL), vi("X", [4, 32])]
    if m is None:
        inputs.insert(0, vi("M", [], TensorProto.INT64))
    else:
        inits.append(init("M", np.array(m, dtype=np.int64)))
    node = helper.make_node("Loop", ["M", "c", "X"], ["Y"] + (["S"] if nested_if else []),
                            name="loop", body=body)
    return make([node], inputs, [vi("Y", [4, 32])] + ([vi("S", None)] if nested_if else []),
                inits)


_STEP = 2 * 4 * 32 * 32 + 4 * 128  # the MatMul, then tanh at 4 FLOPs per element


def test_loop_costs_its_body_times_a_constant_trip_count() -> None:
    plan = _plan(_loop(7))
    (node,) = plan.nodes
    a = node.analysis
    assert a.kernel_class is K.CONTROL_FLOW and a.trips == 7
    assert a.flops == 7 * _STEP
    one = sum(b.flops for b in a.branches[0])
    assert one == _STEP
    # the body's own shapes came from the Loop's input: the carried h is [4, 32]
    mm = next(b for b in a.branches[0] if b.op_type == "MatMul")
    assert dict(mm.dims) == {"M": 4, "N": 32, "K": 32, "batch": 1}
    assert "run 7 times" in node.cost.note


def test_nested_if_inside_a_loop_is_costed_too() -> None:
    a = _plan(_loop(3, nested_if=True)).nodes[0].analysis
    inner = next(b for b in a.branches[0] if b.op_type == "If")
    assert inner.kernel_class is K.CONTROL_FLOW and inner.flops == 2 * 4 * 32 * 32
    assert a.flops == 3 * (_STEP + 2 * 4 * 32 * 32)


def test_loop_with_an_unknown_trip_count_says_so() -> None:
    plan = _plan(_loop(None))
    a = plan.nodes[0].analysis
    assert a.trips == 1 and "trip_count_unknown" in a.flags
    assert a.flops == _STEP
    assert any("trip count is not a constant" in w for w in plan.warnings)


@pytest.mark.parametrize("scanned", ["input", "initializer"])
def test_scan_runs_its_body_once_per_slice(scanned: str) -> None:
    body = helper.make_graph([helper.make_node("Add", ["st", "x"], ["st2"]),
                              helper.make_node("Identity", ["st2"], ["o"])], "b",
                             [vi("st", None), vi("x", None)], [vi("st2", None), vi("o", None)])
    node = helper.make_node("Scan", ["S0", "X"], ["SF", "Ys"], name="scan", body=body,
                            num_scan_inputs=1)
    inputs, inits = [vi("S0", [2, 8])], []
    if scanned == "input":
        inputs.append(vi("X", [10, 2, 8]))
    else:
        inits.append(init("X", rng_array(10, 2, 8)))
    a = _plan(make([node], inputs, [vi("SF", None), vi("Ys", None)], inits)).nodes[0].analysis
    # each of the 10 slices [2, 8] is added to the state: 16 adds
    assert a.trips == 10 and a.flops == 10 * 16
    add = next(b for b in a.branches[0] if b.op_type == "Add")
    assert dict(add.dims) == {"numel": 16}


def test_onnx_einsum_and_scatter_are_costed() -> None:
    g = load(make([helper.make_node("Einsum", ["A", "B"], ["C"], equation="bij,bjk->bik")],
                  [vi("A", [2, 3, 4]), vi("B", [2, 4, 5])], [vi("C", None)]))
    a = graphopt.plan(g.source_model, target="cpu").nodes[0].analysis
    assert (a.kernel_class, dict(a.dims), a.flops) == (
        K.GEMM, {"M": 3, "N": 5, "K": 4, "batch": 2}, 2 * 2 * 3 * 5 * 4)
    scatter = make([helper.make_node("ScatterElements", ["D", "I", "U"], ["Y"], axis=0,
                                     reduction="add")],
                   [vi("D", [4, 5]), vi("I", [2, 5], TensorProto.INT64), vi("U", [2, 5])],
                   [vi("Y", None)])
    s = graphopt.plan(scatter, target="cpu").nodes[0].analysis
    # a copy of D with 10 updates added: reads D, I, U; writes D
    assert (s.kernel_class, dict(s.dims), s.flops) == (K.DATA_MOVEMENT,
                                                       {"numel": 20, "updates": 10}, 10)
    assert (s.bytes_read, s.bytes_written) == (80 + 80 + 40, 80)


def test_if_whose_branch_does_not_build_is_flagged_not_costed() -> None:
    then = helper.make_graph([helper.make_node("Relu", ["X"], ["t"]),
                              helper.make_node("Neg", ["X"], ["t"])], "then", [], [vi("t", [4])])
    other = helper.make_graph([helper.make_node("Neg", ["X"], ["o"])], "else", [], [vi("o", [4])])
    plan = _plan(make([helper.make_node("If", ["c"], ["Y"], then_branch=then, else_branch=other)],
                      [vi("c", [], TensorProto.BOOL), vi("X", [4])], [vi("Y", [4])]))
    a = plan.nodes[0].analysis
    assert a.kernel_class is K.CONTROL_FLOW and "body_not_analysed" in a.flags
    assert (a.flops, a.bytes_total, a.branches) == (0, 0, ())


def test_branches_are_sized_where_the_plan_sizes_the_model() -> None:
    """A model with a batch dim N planned at N = 64: the branch reading X is costed at 64 rows,
    not at the 1 an unsized dim is taken as."""
    heavy, light = _branch("t", "MatMul"), _branch("e", "Relu")
    node = helper.make_node("If", ["c"], ["Y"], name="if", then_branch=heavy, else_branch=light)
    model = make([node], [vi("c", [], TensorProto.BOOL), vi("X", ["N", 256])],
                 [vi("Y", ["N", 256])], [init("W", rng_array(256, 256))])
    a = graphopt.plan(model, target="cpu", dynamic_shapes={"N": 64}).nodes[0].analysis
    mm = a.branches[0][0]
    assert dict(mm.dims) == {"M": 64, "N": 256, "K": 256, "batch": 1}
    assert a.flops == 2 * 64 * 256 * 256 and "dynamic_shape" not in a.flags
