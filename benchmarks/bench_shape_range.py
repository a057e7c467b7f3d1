"""Shape ranges cost little: planning a range against one shape, a dynamic module against a
static one at the opt shape.

1. Planning: the ~6k-fx-node residual MLP of ``bench_planning.py`` (batch 16), traced with a
   static batch and with ``Dim("batch", min=1, max=256)``. Timed twice: the whole
   ``graphopt.plan`` call (trace included), and the planning alone (conversion + analysis + cost
   + decisions + JSON report of the traced program; a range costs min and max too). Best of
   ``--repeat``. Floor (issue 11): a range plans in <= 1.5x a single shape.
2. Running: ``graphopt.optimize`` with and without ``dynamic_shapes`` (target cpu,
   ``measure=False`` so both apply the same passes), then both modules timed at the opt shape,
   interleaved, median of ``--runs`` rounds of ``--calls`` calls each. Floor: the dynamic module
   is no slower than the static one (ratio <= 1, within noise).

Usage: python benchmarks/bench_shape_range.py [--repeat 3] [--runs 15] [--calls 20]
"""

from __future__ import annotations

import argparse
import gc
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.export import Dim

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import graphopt  # noqa: E402
from benchmarks.bench_planning import BATCH, FX_NODES_PER_BLOCK, WIDTH, best_of  # noqa: E402
from graphopt.decisions.planner import build_plan  # noqa: E402
from graphopt.frontends.torch_frontend import trace_torch  # noqa: E402
from graphopt.hardware import get_target  # noqa: E402
from graphopt.report import render_json  # noqa: E402
from tests.zoo import ConvNet, ResidualMLP, TransformerBlock  # noqa: E402


def planning(repeat: int) -> None:
    blocks = round(6000 / FX_NODES_PER_BLOCK)
    model = ResidualMLP(blocks).eval()
    x = torch.randn(BATCH, WIDTH)
    spec = ({0: Dim("batch", min=1, max=256)},)
    target = get_target("h100")
    static_g = trace_torch(model, (x,))
    range_g = trace_torch(model, (x,), dynamic_shapes=spec)
    fx_nodes = len(static_g.source_model.graph.nodes)

    def plan_only(graph):
        return lambda: render_json(build_plan(graph, target).to_dict())

    t_static = best_of(repeat, plan_only(static_g))
    t_range = best_of(repeat, plan_only(range_g))
    w_static = best_of(repeat, lambda: graphopt.plan(model, (x,), target=target).to_json())
    w_range = best_of(repeat, lambda: graphopt.plan(model, (x,), target=target,
                                                    dynamic_shapes=spec).to_json())
    print(f"planning, {blocks} blocks ({fx_nodes} fx nodes), target h100, best of {repeat}:")
    print(f"  planning alone:          one shape {t_static:7.3f} s, range {t_range:7.3f} s, "
          f"ratio {t_range / t_static:.2f} (floor <= 1.5)")
    print(f"  graphopt.plan (+ trace): one shape {w_static:7.3f} s, range {w_range:7.3f} s, "
          f"ratio {w_range / w_static:.2f} (floor <= 1.5)")


def _median_call_s(module: torch.nn.Module, args: tuple, calls: int) -> float:
    t = time.perf_counter()
    for _ in range(calls):
        module(*args)
    return (time.perf_counter() - t) / calls


def running(runs: int, calls: int) -> None:
    cases = {
        "transformer block (8, 128, 288)": (
            TransformerBlock(), (torch.randn(8, 128, 288),),
            ({0: Dim("batch", min=1, max=64), 1: Dim("seq", min=2, max=512)},)),
        "convnet (16, 3, 64, 64)": (ConvNet(), (torch.randn(16, 3, 64, 64),),
                                    ({0: Dim("batch", min=1, max=128)},)),
    }
    print(f"running at the opt shape, target cpu, median of {runs} interleaved rounds x "
          f"{calls} calls:")
    for name, (model, args, spec) in cases.items():
        model.eval()
        static = graphopt.optimize(model, args, target="cpu", measure=False).module
        dynamic = graphopt.optimize(model, args, target="cpu", measure=False,
                                    dynamic_shapes=spec).module
        times: dict[str, list[float]] = {"static": [], "dynamic": []}
        with torch.inference_mode():
            for m in (static, dynamic):
                _median_call_s(m, args, 3)  # warm up
            for _ in range(runs):
                gc.collect()
                times["static"].append(_median_call_s(static, args, calls))
                times["dynamic"].append(_median_call_s(dynamic, args, calls))
        s, d = statistics.median(times["static"]), statistics.median(times["dynamic"])
        print(f"  {name}: static {s * 1e3:7.3f} ms, dynamic {d * 1e3:7.3f} ms, "
              f"dynamic/static {d / s:.3f} (floor <= 1)")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--calls", type=int, default=20)
    args = ap.parse_args()
    cpu = platform.processor() or platform.machine()
    print(f"machine: {platform.node()} {cpu}, {torch.get_num_threads()} torch threads, "
          f"python {platform.python_version()}, torch {torch.__version__}")
    planning(args.repeat)
    running(args.runs, args.calls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
