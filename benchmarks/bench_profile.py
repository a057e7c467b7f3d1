"""Predicted against measured on this CPU, over the zoo (issue 12, item 6), in one run.

1. ``graphopt.calibrate`` measures this machine once (per-op fixed costs, GEMM/conv FLOP/s,
   bandwidth; its one in-model factor is fitted on its own two reference blocks, not on the
   zoo).
2. Every architecture of ``tests/arch_zoo.py`` (18 transformers models, tiny configs, random
   weights) is profiled with ``graphopt.profile`` twice: against the calibrated profile and
   against the uncalibrated ``cpu`` target (datasheet rates, the bandwidth guess, one launch
   overhead, free views).
3. Per model it prints the per-node Spearman, the median per-node predicted/measured ratio,
   the whole-model ratio (plan estimate / the planned graph as graphopt emits it, best of the
   runs without the profiler) and the same estimate over the user's module as called (which
   adds the framework's Python around the graph), then the floors of issue 12: per-node
   Spearman >= 0.8 and model ratio in [0.67, 1.5] for every model.

Run: ``python benchmarks/bench_profile.py [--threads 1] [--runs 10] [--models llama,bert]``.
On a machine shared with other jobs use ``--threads 1``: with more threads an op waits for a
descheduled peer a scheduler tick at a time, and the measurements are of the neighbours.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import graphopt  # noqa: E402
from graphopt.measure import spearman  # noqa: E402
from tests.arch_zoo import ARCHS, build  # noqa: E402

SPEARMAN_FLOOR = 0.8
RATIO_FLOOR = (0.67, 1.5)


def _row(plan: graphopt.Plan) -> dict:
    pred = plan.summary.prediction
    pairs = [(n.cost.est_time_s, n.measured_s) for n in plan.nodes
             if n.measured_s and n.cost.est_time_s > 0]
    return {"spearman": pred["spearman"], "median": pred["median_ratio"],
            "model": pred["model_ratio"], "module": pred.get("module_ratio"),
            "nodes": pred["nodes_measured"],
            "measured_s": pred["measured_model_s"], "pairs": pairs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=None, help="intra-op threads (default: "
                                                              "torch's)")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--models", help="comma-separated zoo names (default: all 18)")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    names = args.models.split(",") if args.models else [a.name for a in ARCHS]
    threads = args.threads or torch.get_num_threads()
    host = graphopt.plan(torch.nn.Identity(), (torch.zeros(1),), target="cpu").target
    print(f"machine: {platform.node() or 'vm'} {platform.machine()}, {host.display_name}, "
          f"{os.cpu_count()} CPUs, python {platform.python_version()}, torch "
          f"{torch.__version__}, graphopt {graphopt.__version__}, {threads} intra-op "
          f"thread(s), load {os.getloadavg()[0]:.2f}")
    t0 = time.perf_counter()
    calibrated = graphopt.calibrate(threads=threads)
    print(f"calibrate: {time.perf_counter() - t0:.1f} s; {calibrated.source}")
    print()
    print("| model | nodes | Spearman | median pred/meas | model pred/meas | measured | "
          "your module pred/meas | uncalibrated: Spearman | model pred/meas |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows, pooled, pooled_raw = {}, [], []
    for name in names:
        module, inputs = build(name)
        got = _row(graphopt.profile(module, inputs, target=calibrated, runs=args.runs,
                                    warmup=3, threads=threads))
        raw = _row(graphopt.profile(module, inputs, target="cpu", runs=args.runs, warmup=3,
                                    threads=threads))
        rows[name] = got
        pooled += got["pairs"]
        pooled_raw += raw["pairs"]
        print(f"| {name} | {got['nodes']} | {got['spearman']:.3f} | {got['median']:.2f} | "
              f"{got['model']:.2f} | {got['measured_s'] * 1e3:.2f} ms | {got['module']:.2f} | "
              f"{raw['spearman']:.3f} | {raw['model']:.2f} |", flush=True)
    rhos = [r["spearman"] for r in rows.values()]
    ratios = [r["model"] for r in rows.values()]
    low, high = RATIO_FLOOR
    rho_ok = all(r >= SPEARMAN_FLOOR for r in rhos)
    ratio_ok = all(low <= r <= high for r in ratios)
    print()
    print(f"calibrated: per-node Spearman min {min(rhos):.3f}, median "
          f"{statistics.median(rhos):.3f}; all {len(pooled)} nodes pooled "
          f"{spearman(*zip(*pooled, strict=True)):.3f} (uncalibrated pooled "
          f"{spearman(*zip(*pooled_raw, strict=True)):.3f})")
    print(f"calibrated: model pred/meas min {min(ratios):.2f}, median "
          f"{statistics.median(ratios):.2f}, max {max(ratios):.2f}")
    below = [n for n, r in rows.items() if r["spearman"] < SPEARMAN_FLOOR]
    outside = [n for n, r in rows.items() if not low <= r["model"] <= high]
    print(f"floor: per-node Spearman >= {SPEARMAN_FLOOR} for every model: "
          f"{'met' if rho_ok else 'NOT met'} ({', '.join(below) or 'none below'})")
    print(f"floor: model pred/meas in [{low}, {high}] for every model: "
          f"{'met' if ratio_ok else 'NOT met'} ({', '.join(outside) or 'none outside'})")
    return 0 if rho_ok and ratio_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
