"""What ``graphopt.plan``'s dry run of the padding and layout decisions adds to planning time.

``graphopt.plan`` = trace (torch.export) + ``build_plan`` (analysis, cost, decisions) + the dry
run (``api.planning.dry_run``: the padding and layout decisions ``optimize`` would make). This
times the three parts of the same call, interleaved per round, on every zoo model and the
transformers architectures, for h100 and cpu, and prints the dry run's share of the whole
(median over rounds). Issue 20 allows at most +10%. One torch thread.

Usage: python benchmarks/bench_plan_dry_run.py [--rounds 5] [--models llama,bert]
"""

from __future__ import annotations

import argparse
import gc
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from graphopt.api.planning import dry_run  # noqa: E402
from graphopt.decisions.planner import build_plan  # noqa: E402
from graphopt.frontends import load_graph  # noqa: E402
from graphopt.hardware import get_target  # noqa: E402
from tests import arch_zoo, zoo  # noqa: E402


def _models(only: set[str]) -> dict[str, tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]:
    out = dict(zoo.zoo())
    out.update({a.name: arch_zoo.build(a.name) for a in arch_zoo.ARCHS})
    return {k: v for k, v in out.items() if not only or k in only}


def _time_once(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], target: str
               ) -> tuple[float, float, float]:
    """(trace, plan, dry run) seconds of one ``graphopt.plan`` call, with the garbage collector
    off while timing (as ``timeit`` does: a collection lands in whichever part allocates)."""
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter()
        graph = load_graph(model, inputs, None)
        t1 = time.perf_counter()
        plan = build_plan(graph, get_target(target))
        t2 = time.perf_counter()
        dry_run(plan, graph)
        return t1 - t0, t2 - t1, time.perf_counter() - t2
    finally:
        gc.enable()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--models", default="")
    args = p.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    models = _models({m for m in args.models.split(",") if m})
    print(f"machine: {platform.processor() or platform.machine()}, {platform.platform()}; "
          f"torch {torch.__version__}, 1 thread, {args.rounds} rounds")
    print(f"{'model':28s} {'target':6s} {'trace':>9s} {'plan':>9s} {'dry run':>9s} "
          f"{'+% of plan()':>12s}")
    shares = []
    for name, (model, inputs) in models.items():
        for target in ("h100", "cpu"):
            _time_once(model, inputs, target)  # warm: first-call caches
            runs = [_time_once(model, inputs, target) for _ in range(args.rounds)]
            trace, plan, dry = (statistics.median(r[i] for r in runs) for i in range(3))
            share = dry / (trace + plan)
            shares.append(share)
            print(f"{name:28s} {target:6s} {trace * 1e3:8.1f}ms {plan * 1e3:8.1f}ms "
                  f"{dry * 1e3:8.1f}ms {share:11.1%}")
    print(f"dry run adds: median {statistics.median(shares):.1%}, max {max(shares):.1%} "
          f"of plan() without it ({len(shares)} model/target pairs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
