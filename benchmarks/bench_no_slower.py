"""No slower than before: this tree against a baseline revision, in one run (issue 10).

Measured for each tree, in fresh Python processes, rounds interleaved (baseline, current,
baseline, ...) so load on a shared machine hits both alike; the best time of each is kept:

1. planning a ~6k fx-node torch graph and its ONNX twin (what ``bench_planning.py`` times:
   frontend + analysis + cost + report JSON; tracing excluded), best of 7;
2. ``graphopt.optimize(<6,000-node ONNX model>, target=T, measure=False)`` for T = cpu (best
   of 5) and h100 (once a round: its fp16 accuracy guard built ~37 ORT sessions, ~2 min,
   until issue 21's probe: 4 sessions in all now, ``bench_guard.py``) on the residual MLP of
   ``bench_planning.onnx_blocks`` (1,500 blocks).

Prints current / baseline per measurement (< 1: faster now). The baseline tree comes from
``git archive``; its own ``benchmarks/bench_planning.py`` builds the models.

Run: ``python benchmarks/bench_no_slower.py [--baseline 305cd38] [--rounds 2]``.
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
from pathlib import Path

from two_trees import ROOT, baseline_tree, head_revision, run_worker

_WORKER = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
sys.path[:0] = [{tree!r}, {tree!r} + "/benchmarks"]
import torch
import graphopt
from bench_planning import BATCH, WIDTH, onnx_blocks
from bench_planning import best_of as best  # the same timer in both trees
from graphopt.frontends.onnx_frontend import load_onnx
from graphopt.frontends.torch_frontend import graph_from_exported_program
from graphopt.hardware import get_target
from graphopt.decisions.planner import build_plan
from graphopt.report import render_json
from tests.zoo import ResidualMLP

h100, out = get_target("h100"), {{}}
model = ResidualMLP(857).eval()
ep = torch.export.export(model, (torch.randn(BATCH, WIDTH),), strict=False)
proto = onnx_blocks(857)
out["plan torch 6k fx nodes"] = best(7, lambda: render_json(
    build_plan(graph_from_exported_program(ep), h100).to_dict()))
out["plan onnx 3.4k nodes"] = best(7, lambda: render_json(
    build_plan(load_onnx(proto), h100).to_dict()))
big = onnx_blocks(1500)
big.ir_version = 10  # onnx writes its newest IR version; ONNX Runtime reads up to 13
for target, n in (("cpu", 5), ("h100", 1)):
    out[f"optimize onnx 6k nodes, {{target}}"] = best(n, lambda: graphopt.optimize(
        big, target=target, measure=False))
print("RESULT " + json.dumps(out))
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", default="305cd38",
                    help="revision to compare with (default: the tree before issue 10)")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    head = head_revision()
    print(f"machine: {platform.node()} {platform.processor() or platform.machine()}, "
          f"python {platform.python_version()}; baseline {args.baseline}, current {head} "
          "(working tree)")
    with tempfile.TemporaryDirectory() as tmp:
        base = baseline_tree(args.baseline, Path(tmp))
        best: dict[str, dict[str, float]] = {"baseline": {}, "current": {}}
        for r in range(args.rounds):
            for label, tree in (("baseline", base), ("current", ROOT)):
                for k, v in run_worker(_WORKER, tree).items():
                    best[label][k] = min(v, best[label].get(k, v))
                print(f"round {r + 1}: {label} done", flush=True)
    print(f"\n| measurement | baseline {args.baseline} | current {head} | current / baseline |")
    print("|---|---:|---:|---:|")
    for k, b in best["baseline"].items():
        c = best["current"][k]
        print(f"| {k} | {b:.3f} s | {c:.3f} s | **{c / b:.2f}** |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
