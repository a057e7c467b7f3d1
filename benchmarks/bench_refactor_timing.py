"""Planning and optimize time of two graphopt trees, interleaved in one run (before and after
a refactor).

Each round runs, for each tree in turn, a fresh Python process that imports graphopt from that
tree and times ``graphopt.plan`` and ``graphopt.optimize(measure=False)`` on a few zoo models
(after one warm-up call each, so imports and first-call caches are not counted; the garbage
collector runs before and is off during each timed call). Rounds alternate the trees' order;
the medians per tree and their ratio are printed. One torch thread.

Usage: python benchmarks/bench_refactor_timing.py OLD_TREE [NEW_TREE] [--rounds 5]
       (NEW_TREE defaults to this checkout; a tree is a folder holding graphopt/ and tests/)
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = r"""
import gc, json, sys, time, warnings
sys.path.insert(0, sys.argv[1])
warnings.filterwarnings("ignore")
import torch
torch.set_num_threads(1)
import graphopt
from tests import arch_zoo, zoo
small = zoo.zoo()
models = {"transformer_hd72": small["transformer_hd72"], "tc_guide_cnn": small["tc_guide_cnn"],
          "llama": arch_zoo.build("llama"), "bert": arch_zoo.build("bert")}
out = {"plan": 0.0, "optimize": 0.0}
for name, (model, inputs) in models.items():
    for kind in ("plan", "optimize"):
        call = (lambda: graphopt.plan(model, inputs, target="h100")) if kind == "plan" else (
            lambda: graphopt.optimize(model, inputs, target="h100", measure=False))
        call()  # warm
        gc.collect()  # as timeit does: a full collection lands in whichever call allocates
        gc.disable()  # next, and a few hundred ms of it decided a whole comparison
        t = time.perf_counter()
        call()
        out[kind] += time.perf_counter() - t
        gc.enable()
print(json.dumps(out))
"""


def _run(tree: Path) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", _CHILD, str(tree)], capture_output=True,
                          text=True, timeout=900, cwd=tree)
    if done.returncode:
        raise SystemExit(f"{tree}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("old", type=Path)
    p.add_argument("new", type=Path, nargs="?", default=ROOT)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    trees = {"old": args.old.resolve(), "new": args.new.resolve()}
    times: dict[str, dict[str, list[float]]] = {k: {"plan": [], "optimize": []} for k in trees}
    for r in range(args.rounds):
        order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
        for name in order:
            for kind, s in _run(trees[name]).items():
                times[name][kind].append(s)
    print(f"machine: {platform.processor() or platform.machine()}, {args.rounds} rounds, "
          "4 zoo models (transformer_hd72, tc_guide_cnn, llama, bert), h100, 1 thread")
    for kind in ("plan", "optimize"):
        old, new = (statistics.median(times[k][kind]) for k in ("old", "new"))
        print(f"{kind:9} old {old * 1e3:8.1f} ms  new {new * 1e3:8.1f} ms  new/old {new / old:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
