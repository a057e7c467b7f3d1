"""Partition's graph algorithms, hand-written against networkx, on a 50k-node transformer DAG.

Issue 32, item 6: ``partition/`` walks its DAG by hand while ``networkx`` sat unused beside it.
This times both, interleaved in one run (A, B, A, B, ...; best of ``--repeat``), and checks
they give the same answers:

1. DAG: the flat index arrays ``build_problem`` makes (``problem._Flow``) vs an
   ``nx.DiGraph`` of the same nodes and edges (the cost every networkx algorithm below pays
   first).
2. Topological order: the plan order checked against every edge (nodes arrive topologically
   sorted from the frontends; partition never sorts) vs ``nx.topological_sort`` and
   ``nx.lexicographical_topological_sort`` keyed by plan index (the deterministic one).
3. Upward rank and HEFT's order (``heft.rank_order``) vs the same rank over networkx's
   reversed topological order and successors.
4. Critical path length (the largest upward rank) vs ``nx.dag_longest_path_length`` with the
   node weights folded onto the edges.
5. Descendants and ancestors, the tensor-parallel finder's walks
   (``plan_flow.forward_from_tensors`` restricted to kernel classes, and an unrestricted
   descendant/ancestor walk over the problem's arrays) vs ``nx.descendants``/``nx.ancestors``
   on a ``subgraph_view``.
6. The whole ``split(plan, devices, "heft")`` with ``rank_order`` as it is vs over networkx.

The model: ``--blocks`` pre-norm transformer blocks as ONNX (LayerNorm, Q/K/V MatMuls,
Transpose, scores, scale, + mask, Softmax, context, output projection, residual Add, LayerNorm,
MLP up, Relu, down, residual Add: 17 nodes a block; the residual stream is the skip edge and the
mask a graph input every block reads), planned once on h100 (``decisions=False``, excluded).

Usage: python benchmarks/bench_graph_algos.py [--blocks 2942] [--repeat 5]
"""

from __future__ import annotations

import argparse
import gc
import math
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from graphopt.analysis.kernel_class import KernelClass  # noqa: E402
from graphopt.decisions.planner import build_plan  # noqa: E402
from graphopt.frontends.onnx_frontend import load_onnx  # noqa: E402
from graphopt.partition import build_problem, parse_devices, split  # noqa: E402
from graphopt.partition import heft as heft_mod  # noqa: E402
from graphopt.partition import splitter as splitter_mod  # noqa: E402
from graphopt.partition.plan_flow import PlanFlow, forward_from_tensors  # noqa: E402
from graphopt.partition.problem import Problem, _Flow  # noqa: E402

WIDTH, SEQ = 16, 8
DEVICES = "cuda:0=h100,cuda:1=a100,cpu"


def transformer_onnx(blocks: int) -> onnx.ModelProto:
    """``blocks`` pre-norm transformer blocks, 17 nodes each (see the module docstring)."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []

    def weight(name: str, shape: tuple[int, ...]) -> str:
        inits.append(numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name))
        return name

    x = "x"
    for i in range(blocks):
        g1, b1 = weight(f"g1_{i}", (WIDTH,)), weight(f"b1_{i}", (WIDTH,))
        wq, wk, wv, wo = (weight(f"{p}{i}", (WIDTH, WIDTH)) for p in ("wq", "wk", "wv", "wo"))
        g2, b2 = weight(f"g2_{i}", (WIDTH,)), weight(f"b2_{i}", (WIDTH,))
        w1, w2 = weight(f"w1_{i}", (WIDTH, 4 * WIDTH)), weight(f"w2_{i}", (4 * WIDTH, WIDTH))
        s = f"_{i}"
        nodes += [
            helper.make_node("LayerNormalization", [x, g1, b1], ["ln1" + s], axis=-1),
            helper.make_node("MatMul", ["ln1" + s, wq], ["q" + s]),
            helper.make_node("MatMul", ["ln1" + s, wk], ["k" + s]),
            helper.make_node("MatMul", ["ln1" + s, wv], ["v" + s]),
            helper.make_node("Transpose", ["k" + s], ["kt" + s], perm=[1, 0]),
            helper.make_node("MatMul", ["q" + s, "kt" + s], ["sc" + s]),
            helper.make_node("Mul", ["sc" + s, "scale"], ["ss" + s]),
            helper.make_node("Add", ["ss" + s, "mask"], ["sm" + s]),
            helper.make_node("Softmax", ["sm" + s], ["p" + s], axis=-1),
            helper.make_node("MatMul", ["p" + s, "v" + s], ["ctx" + s]),
            helper.make_node("MatMul", ["ctx" + s, wo], ["o" + s]),
            helper.make_node("Add", [x, "o" + s], ["r1" + s]),  # the residual skip edge
            helper.make_node("LayerNormalization", ["r1" + s, g2, b2], ["ln2" + s], axis=-1),
            helper.make_node("MatMul", ["ln2" + s, w1], ["h" + s]),
            helper.make_node("Relu", ["h" + s], ["a" + s]),
            helper.make_node("MatMul", ["a" + s, w2], ["m" + s]),
        ]
        nodes.append(helper.make_node("Add", ["r1" + s, "m" + s], ["x" + s]))
        x = "x" + s
    inits.append(numpy_helper.from_array(np.float32(WIDTH ** -0.5), "scale"))
    graph = helper.make_graph(
        nodes, "transformer",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [SEQ, WIDTH]),
         helper.make_tensor_value_info("mask", TensorProto.FLOAT, [SEQ, SEQ])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [SEQ, WIDTH])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


# ---- the networkx versions -------------------------------------------------------------------

def nx_dag(pb: Problem) -> nx.DiGraph:
    """Node i -> node j for every activation i writes and j reads; ``comm`` = HEFT's mean
    transfer time of the largest such tensor, ``w`` = the node's mean cost."""
    k = pb.k
    pairs = [(a, b) for a in range(k) for b in range(k) if a != b]
    mlat = sum(pb.latency[a][b] for a, b in pairs) / len(pairs) if pairs else 0.0
    minv = sum(pb.inv_bw[a][b] for a, b in pairs) / len(pairs) if pairs else 0.0
    g = nx.DiGraph()
    g.add_nodes_from((v, {"w": sum(pb.cost[d][v] for d in range(k)) / k}) for v in range(pb.n))
    for t, p in enumerate(pb.t_producer):
        if p < 0:
            continue
        comm = (mlat + pb.t_bytes[t] * minv) if pairs else 0.0
        for c in pb.t_consumers[t]:
            if not g.has_edge(p, c) or g.edges[p, c]["comm"] < comm:
                g.add_edge(p, c, comm=comm)
    return g


def nx_plan_dag(plan: Any) -> nx.DiGraph:
    """The plan's node DAG straight from its tensor names (what ``_Flow`` reads)."""
    producer = {t.name: i for i, n in enumerate(plan.nodes) for t in n.outputs if t is not None}
    g = nx.DiGraph()
    g.add_nodes_from(range(len(plan.nodes)))
    g.add_edges_from((producer[t.name], i) for i, n in enumerate(plan.nodes) for t in n.inputs
                     if t is not None and t.name in producer)
    return g


def nx_rank_order(pb: Problem, g: nx.DiGraph | None = None) -> tuple[int, ...]:
    """HEFT case 1 over networkx: the upward rank in reversed topological order."""
    g = nx_dag(pb) if g is None else g
    rank: dict[int, float] = {}
    for v in reversed(list(nx.topological_sort(g))):
        rank[v] = g.nodes[v]["w"] + max((d["comm"] + rank[c] for _, c, d in g.out_edges(v,
                                                                                        data=True)),
                                        default=0.0)
    return tuple(sorted(range(pb.n), key=lambda v: (-rank[v], v)))


def nx_critical_path(g: nx.DiGraph) -> float:
    """The longest path with node weights: fold each node's weight onto its out-edges and a
    sink, as ``dag_longest_path_length`` weighs edges only."""
    h = nx.DiGraph()
    h.add_edges_from((u, v, {"x": d["comm"] + g.nodes[u]["w"]}) for u, v, d in g.edges(data=True))
    h.add_edges_from((v, "sink", {"x": g.nodes[v]["w"]}) for v in g.nodes)
    return nx.dag_longest_path_length(h, weight="x")


# ---- the hand-written versions beside them ---------------------------------------------------

def hand_topo_check(pb: Problem) -> bool:
    """Plan order is topological: every activation's readers come after its writer."""
    return all(c > p for t, p in enumerate(pb.t_producer) if p >= 0 for c in pb.t_consumers[t])


def hand_reach(pb: Problem, v: int, down: bool) -> set[int]:
    """Descendants (or ancestors) of node ``v`` over the problem's arrays."""
    out: set[int] = set()
    stack = [v]
    while stack:
        u = stack.pop()
        nxt = ([c for t in pb.node_outputs[u] for c in pb.t_consumers[t]] if down else
               [pb.t_producer[t] for t in pb.node_inputs[u] if pb.t_producer[t] >= 0])
        for w in nxt:
            if w not in out:
                out.add(w)
                stack.append(w)
    return out


def nx_flow(flow: PlanFlow) -> nx.DiGraph:
    """The plan's node DAG for the tensor-parallel walks."""
    g = nx.DiGraph()
    g.add_nodes_from(flow.nodes)
    g.add_edges_from((flow.producer[t], c) for t, cs in flow.consumers.items()
                     if t in flow.producer for c in cs)
    return g


def nx_forward(flow: PlanFlow, g: nx.DiGraph, start: str, through: frozenset) -> set[str]:
    """``forward_from_tensors`` from ``start``'s outputs: descendants through ``through``."""
    view = nx.subgraph_view(g, filter_node=lambda v: v == start or flow.cls(v) in through)
    return nx.descendants(view, start)


# ---- timing ----------------------------------------------------------------------------------

def interleaved(repeat: int, a: Callable[[], Any], b: Callable[[], Any]) -> tuple[float, float]:
    """Best of ``repeat`` for each, alternating so both see the same machine load."""
    ta = tb = math.inf
    for _ in range(repeat):
        for fn, is_a in ((a, True), (b, False)):
            gc.collect()
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            ta, tb = (min(ta, dt), tb) if is_a else (ta, min(tb, dt))
    return ta, tb


def row(name: str, ta: float, tb: float) -> None:
    print(f"  {name:44s} hand {ta * 1e3:9.1f} ms   networkx {tb * 1e3:9.1f} ms   "
          f"networkx/hand {tb / ta:6.2f}x")


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, python {platform.python_version()}, networkx {nx.__version__}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=2942)  # 50,014 nodes
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    print(f"machine: {machine()}")
    ds = parse_devices(DEVICES)
    t0 = time.perf_counter()
    plan = build_plan(load_onnx(transformer_onnx(args.blocks)), ds.devices[0].profile,
                      decisions=False)
    pb = build_problem(plan, ds)
    g = nx_dag(pb)
    print(f"{args.blocks} blocks: {pb.n} nodes, {g.number_of_edges()} edges on {DEVICES} "
          f"(model and plan {time.perf_counter() - t0:.1f} s, excluded)")
    rep = args.repeat

    # 1, 2: the DAG and a topological order
    row("1. DAG from the plan (index arrays vs DiGraph)",
        *interleaved(rep, lambda: _Flow(plan.nodes), lambda: nx_plan_dag(plan)))
    assert hand_topo_check(pb)
    index = {v: v for v in range(pb.n)}
    assert list(nx.lexicographical_topological_sort(g, key=index.__getitem__)) == list(range(pb.n))
    row("2. topological order (plan order checked)",
        *interleaved(rep, lambda: hand_topo_check(pb), lambda: list(nx.topological_sort(g))))
    row("2. ... lexicographical (deterministic)",
        *interleaved(rep, lambda: hand_topo_check(pb),
                     lambda: list(nx.lexicographical_topological_sort(g, key=index.__getitem__))))

    # 3, 4: upward rank, HEFT's order, the critical path
    assert heft_mod.rank_order(pb) == nx_rank_order(pb, g), "rank orders differ"
    row("3. upward rank + HEFT order (DAG prebuilt)",
        *interleaved(rep, lambda: heft_mod.rank_order(pb), lambda: nx_rank_order(pb, g)))
    row("3. ... building the DAG too",
        *interleaved(rep, lambda: heft_mod.rank_order(pb), lambda: nx_rank_order(pb)))
    crit_hand, crit_nx = max(heft_mod.upward_ranks(pb)), nx_critical_path(g)
    assert math.isclose(crit_hand, crit_nx, rel_tol=1e-9), (crit_hand, crit_nx)
    row("4. critical path length (DAG prebuilt)",
        *interleaved(rep, lambda: max(heft_mod.upward_ranks(pb)), lambda: nx_critical_path(g)))

    # 5: descendants and ancestors
    probes = [pb.n // 4, pb.n // 2, 3 * pb.n // 4]
    for v in probes:
        assert hand_reach(pb, v, True) == nx.descendants(g, v)
        assert hand_reach(pb, v, False) == nx.ancestors(g, v)
    row("5. descendants of 3 nodes",
        *interleaved(rep, lambda: [hand_reach(pb, v, True) for v in probes],
                     lambda: [nx.descendants(g, v) for v in probes]))
    row("5. ancestors of 3 nodes",
        *interleaved(rep, lambda: [hand_reach(pb, v, False) for v in probes],
                     lambda: [nx.ancestors(g, v) for v in probes]))
    flow = PlanFlow(plan)
    fg = nx_flow(flow)
    # the finder's paths pass views and elementwise nodes; here the residual Adds chain every
    # walk to the end of the model, the worst case
    through = frozenset({KernelClass.ELEMENTWISE, KernelClass.DATA_MOVEMENT, KernelClass.VIEW,
                         KernelClass.SOFTMAX})
    gemms = [n.name for n in plan.nodes if n.analysis.kernel_class not in through]
    starts = gemms[:: max(1, len(gemms) // 20)]
    outs = {s: [t.name for t in flow.nodes[s].outputs if t is not None] for s in starts}
    for s in starts:
        assert forward_from_tensors(flow, outs[s], through) == nx_forward(flow, fg, s, through)
    row(f"5. class-restricted walks from {len(starts)} GEMMs",
        *interleaved(rep, lambda: [forward_from_tensors(flow, outs[s], through) for s in starts],
                     lambda: [nx_forward(flow, fg, s, through) for s in starts]))
    row("5. ... building the nx DAG too",
        *interleaved(rep, lambda: [forward_from_tensors(flow, outs[s], through) for s in starts],
                     lambda: [nx_forward(flow, nx_flow(flow), s, through) for s in starts]))

    # 6: the whole split, heft strategy
    def split_with(rank: Callable[[Problem], tuple[int, ...]]) -> Any:
        splitter_mod.rank_order = rank
        try:
            return split(plan, ds, "heft")
        finally:
            splitter_mod.rank_order = heft_mod.rank_order

    a, b = split_with(heft_mod.rank_order), split_with(nx_rank_order)
    assert a.to_dict() == b.to_dict(), "the splits differ"
    row("6. split(plan, devices, 'heft') end to end",
        *interleaved(max(3, rep // 2), lambda: split_with(heft_mod.rank_order),
                     lambda: split_with(nx_rank_order)))
    print("every networkx answer equals graphopt's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
