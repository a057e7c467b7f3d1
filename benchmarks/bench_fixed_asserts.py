"""What dropping export's dtype checks that cannot fail saves per call of the optimized module.

For each transformers architecture of the test zoo (random weights, batch 2 x 16 tokens or
2 images), ``graphopt.optimize(target="cpu", measure=False)`` runs twice: as it is, and with
``graphopt.backends.torch.asserts.drop_fixed_asserts`` switched off. Both modules are timed in one
run, interleaved, one torch thread, under ``torch.no_grad()``; the median of each is kept.
Prints the checks left in each and the time ratio (kept / dropped: > 1 means faster now).

Usage: python benchmarks/bench_fixed_asserts.py [--reps 200] [--models llama,gpt2]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path
from unittest import mock

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import graphopt  # noqa: E402
from tests.arch_zoo import ARCHS, build  # noqa: E402

_ASSERT = torch.ops.aten._assert_tensor_metadata.default


def _checks(module: torch.nn.Module) -> int:
    gm = getattr(module, "graph_module", None)
    return -1 if gm is None else sum(n.target is _ASSERT for n in gm.graph.nodes)


def _median_pair(a: torch.nn.Module, b: torch.nn.Module, args: tuple, reps: int
                 ) -> tuple[float, float]:
    ta, tb = [], []
    with torch.no_grad():
        for _ in range(10):
            a(*args)
            b(*args)
        for _ in range(reps):
            for m, out in ((a, ta), (b, tb)):
                t = time.perf_counter()
                m(*args)
                out.append(time.perf_counter() - t)
    return statistics.median(ta), statistics.median(tb)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--models", default=",".join(a.name for a in ARCHS))
    args = ap.parse_args()
    warnings.simplefilter("ignore", FutureWarning)  # transformers' pytree notices
    torch.set_num_threads(1)
    print(f"machine: {platform.processor() or platform.machine()}; torch {torch.__version__}; "
          f"1 thread; {args.reps} interleaved calls each, medians")
    print(f"{'model':14s} {'checks kept':>11s} {'dropped':>8s} {'kept us':>9s} "
          f"{'dropped us':>10s} {'ratio':>6s}")
    ratios = []
    for name in args.models.split(","):
        model, inputs = build(name)
        model.eval()
        new = graphopt.optimize(model, inputs, target="cpu", measure=False).module
        with mock.patch("graphopt.backends.torch.asserts.drop_fixed_asserts", lambda gm: 0):
            old = graphopt.optimize(model, inputs, target="cpu", measure=False).module
        t_old, t_new = _median_pair(old, new, inputs, args.reps)
        ratios.append(t_old / t_new)
        print(f"{name:14s} {_checks(old):11d} {_checks(old) - _checks(new):8d} "
              f"{t_old * 1e6:9.1f} {t_new * 1e6:10.1f} {t_old / t_new:5.2f}x")
    print(f"median ratio {statistics.median(ratios):.2f}x over {len(ratios)} models")


if __name__ == "__main__":
    main()
