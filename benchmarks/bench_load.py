"""Loading a saved ~6k-fx-node optimized module in a fresh process (issue 11 item 3).

The model is bench_planning's residual MLP (1,000 blocks of Linear 64x64 + LayerNorm, ~7k fx
nodes), optimized for target ``cpu`` with ``measure=False`` and written with
``Optimized.save``. Each round starts a new Python process that imports graphopt and torch
(not timed: both are imported by any serving process anyway), then times
``graphopt.load(path)`` and one call of the loaded module; the best round is kept.

Floor (issue 11): loading the saved 6k-node model takes <= 2 s.

Usage: python benchmarks/bench_load.py [--blocks 1000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import graphopt  # noqa: E402
from benchmarks.bench_planning import BATCH, WIDTH  # noqa: E402
from tests.zoo import ResidualMLP  # noqa: E402

FLOOR_S = 2.0

# runs in the fresh process: it never imports the model's class
_LOAD = """
import json, sys, time
import torch, graphopt
t = time.perf_counter()
m = graphopt.load(sys.argv[1])
load_s = time.perf_counter() - t
x = torch.randn(*json.loads(sys.argv[2]))
t = time.perf_counter()
m(x)
print(json.dumps({"load_s": load_s, "first_call_s": time.perf_counter() - t,
                  "nodes": len(m.graph_module.graph.nodes)}))
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    cpu = platform.processor() or platform.machine()
    print(f"machine: {platform.node()} {cpu}, {torch.get_num_threads()} torch threads, "
          f"python {platform.python_version()}, torch {torch.__version__}")
    model = ResidualMLP(args.blocks).eval()
    x = torch.randn(BATCH, WIDTH)
    t = time.perf_counter()
    opt = graphopt.optimize(model, x, target="cpu", measure=False)
    optimize_s = time.perf_counter() - t
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.pt2"
        t = time.perf_counter()
        opt.save(path)
        save_s = time.perf_counter() - t
        size_mb = path.stat().st_size / 1e6
        rounds = []
        for _ in range(args.repeat):
            out = subprocess.run([sys.executable, "-c", _LOAD, str(path),
                                  json.dumps([BATCH, WIDTH])],
                                 capture_output=True, text=True, check=True)
            rounds.append(json.loads(out.stdout.strip().splitlines()[-1]))
    best = min(rounds, key=lambda r: r["load_s"])
    print(f"{args.blocks} blocks, {best['nodes']} fx nodes in the loaded graph: optimize "
          f"{optimize_s:.1f} s, save {save_s:.1f} s ({size_mb:.1f} MB)")
    print(f"load in a fresh process: best {best['load_s']:.3f} s of "
          f"{[round(r['load_s'], 3) for r in rounds]}, first call {best['first_call_s']:.3f} s")
    ok = best["load_s"] <= FLOOR_S
    print(f"floor <= {FLOOR_S} s: {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
