"""Planning time on graphs of about 1k, 6k and 50k fx nodes, torch and ONNX.

The model is N residual blocks ``x = LayerNorm(x + Linear64x64(x))`` at batch 16 (1,000 blocks
make ~7k fx nodes: 3 ops and 4 parameters per block). Tracing (``torch.export``) is timed but
excluded from planning time; planning = frontend conversion to graphopt's graph + analysis +
cost + report dict + JSON text. The ONNX graph is built directly with ``onnx.helper`` (the same
ops the legacy exporter emits), then loaded by the ONNX frontend (shape inference included).

Floors (issue 2): planning a ~6k-node graph <= 2 s; time per node grows < 1.5x from 1k to 50k.

Usage: python benchmarks/bench_planning.py [--sizes 1000,6000,50000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import gc
import platform
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from graphopt.decisions.planner import build_plan  # noqa: E402
from graphopt.frontends.onnx_frontend import load_onnx  # noqa: E402
from graphopt.frontends.torch_frontend import graph_from_exported_program  # noqa: E402
from graphopt.hardware import get_target  # noqa: E402
from graphopt.report import render_json  # noqa: E402
from tests.zoo import ResidualMLP  # noqa: E402

WIDTH, BATCH = 64, 16
FX_NODES_PER_BLOCK = 7


def onnx_blocks(blocks: int) -> onnx.ModelProto:
    """The same residual MLP as ONNX: MatMul, Add (bias), Add (residual), LayerNormalization."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    x = "x"
    for i in range(blocks):
        w, b, g, beta = f"w{i}", f"b{i}", f"g{i}", f"beta{i}"
        inits += [numpy_helper.from_array(rng.standard_normal((WIDTH, WIDTH), np.float32), w),
                  numpy_helper.from_array(np.zeros(WIDTH, np.float32), b),
                  numpy_helper.from_array(np.ones(WIDTH, np.float32), g),
                  numpy_helper.from_array(np.zeros(WIDTH, np.float32), beta)]
        nodes += [helper.make_node("MatMul", [x, w], [f"mm{i}"]),
                  helper.make_node("Add", [f"mm{i}", b], [f"lin{i}"]),
                  helper.make_node("Add", [x, f"lin{i}"], [f"res{i}"]),
                  helper.make_node("LayerNormalization", [f"res{i}", g, beta], [f"ln{i}"],
                                   axis=-1, epsilon=1e-5)]
        x = f"ln{i}"
    graph = helper.make_graph(
        nodes, "residual_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [BATCH, WIDTH])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [BATCH, WIDTH])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def best_of(repeat: int, fn) -> float:
    times = []
    for _ in range(repeat):
        gc.collect()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,6000,50000", help="approximate fx node counts")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    target = get_target("h100")
    cpu = platform.processor() or platform.machine()
    print(f"machine: {platform.node()} {cpu}, {torch.get_num_threads()} torch threads, "
          f"python {platform.python_version()}, torch {torch.__version__}")
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        blocks = max(1, round(size / FX_NODES_PER_BLOCK))
        model = ResidualMLP(blocks).eval()
        t0 = time.perf_counter()
        ep = torch.export.export(model, (torch.randn(BATCH, WIDTH),), strict=False)
        trace_s = time.perf_counter() - t0
        fx_nodes = len(ep.graph.nodes)

        def plan_torch(ep=ep):
            render_json(build_plan(graph_from_exported_program(ep), target).to_dict())

        proto = onnx_blocks(blocks)

        def plan_onnx(proto=proto):
            render_json(build_plan(load_onnx(proto), target).to_dict())

        t_torch = best_of(args.repeat, plan_torch)
        t_onnx = best_of(args.repeat, plan_onnx)
        onnx_nodes = len(proto.graph.node)
        rows.append((fx_nodes, t_torch, onnx_nodes, t_onnx))
        print(f"{blocks:5d} blocks: torch {fx_nodes:6d} fx nodes, trace {trace_s:6.1f} s "
              f"(excluded), plan {t_torch:6.3f} s = {t_torch / fx_nodes * 1e6:6.1f} us/node | "
              f"onnx {onnx_nodes:6d} nodes, plan {t_onnx:6.3f} s = "
              f"{t_onnx / onnx_nodes * 1e6:6.1f} us/node")
    if len(rows) >= 2:
        (n0, t0_, o0, u0), (n1, t1_, o1, u1) = rows[0], rows[-1]
        print(f"time/node growth {n0}->{n1} fx nodes: torch {(t1_ / n1) / (t0_ / n0):.2f}x, "
              f"onnx {(u1 / o1) / (u0 / o0):.2f}x (floor: < 1.5x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
