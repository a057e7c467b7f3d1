"""How long ``graphopt.optimize(model, inputs, target="cpu")`` takes, phase by phase, on the six
models of ``bench_host_peers.py`` (issue 34, item 3: within 20 s each at 2 threads, with the
same choices).

Run: ``python benchmarks/bench_optimize_time.py [--models bert,resnet] [--exhaustive]``.

The host calibration is made (and cached) before any model is timed, as a user's second run
finds it. Each model is optimized once; the phases are the wall time inside the functions named
(``optimize_torch``: tracing, planning and the torch passes with their timing and guard;
``ensure_onnx``: the ONNX export and its passes; the torch.compile and OpenVINO builds; the
deploy timing rounds). ``--exhaustive`` optimizes each model a second time the old way
(torch.compile always built, at least 7 rounds of 0.15 s per candidate, up to 28), and says
whether the recommended artifact is the same: the budget must not change the choice.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_host_peers import MODELS, build  # noqa: E402
from peers_common import machine  # noqa: E402

import graphopt  # noqa: E402
from graphopt.api import deploy, optimized  # noqa: E402
from graphopt.backends.torch import pipeline  # noqa: E402
from graphopt.measure import deploy_runs  # noqa: E402

BUDGET_S = 20.0  # issue 34, item 3
PHASES = ((pipeline, "optimize_torch"), (optimized.Optimized, "ensure_onnx"),
          (deploy, "_compiled"), (deploy, "_openvino"), (deploy, "settled_rounds"))


@contextlib.contextmanager
def phase_timers(spent: dict[str, float]) -> Iterator[None]:
    """Wrap each function of :data:`PHASES` to add its wall time to ``spent`` (restored on
    exit); a nested call is counted once, in its outermost phase."""
    saved = [(owner, name, getattr(owner, name)) for owner, name in PHASES]

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - t
        return wrapper

    try:
        for owner, name, fn in saved:
            setattr(owner, name, timed(name, fn))
        yield
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)


@contextlib.contextmanager
def exhaustive() -> Iterator[None]:
    """The deploy choice as it was before the budget: every candidate built, long rounds."""
    saved = (deploy.compile_out_of_reach, deploy_runs.TIMING_BUDGET_S,
             deploy_runs.MAX_TIMING_S, deploy_runs.MIN_ROUNDS)
    deploy.compile_out_of_reach = lambda *_: None  # always built
    deploy_runs.TIMING_BUDGET_S, deploy_runs.MAX_TIMING_S = 1e9, 1e9
    deploy_runs.MIN_ROUNDS = deploy_runs.ROUNDS  # no early stop before the first rounds
    try:
        yield
    finally:
        (deploy.compile_out_of_reach, deploy_runs.TIMING_BUDGET_S, deploy_runs.MAX_TIMING_S,
         deploy_runs.MIN_ROUNDS) = saved


def optimize_once(model: Any, inputs: Any) -> tuple[float, dict[str, float], Any]:
    spent: dict[str, float] = {}
    with phase_timers(spent):
        start = time.perf_counter()
        opt = graphopt.optimize(model, inputs, target="cpu")
        total = time.perf_counter() - start
    return total, spent, opt


def describe(total: float, spent: dict[str, float], opt: Any) -> str:
    phases = ", ".join(f"{name} {s:.1f}" for name, s in spent.items())
    rows = "; ".join(f"{r.artifact} {r.seconds * 1e3:.3g} ms" if r.seconds else
                     f"{r.artifact}: {(r.error or 'not timed')[:70]}"
                     for r in opt.deploy.candidates)
    return (f"{total:5.1f} s -> {opt.deploy.artifact} (phases s: {phases})\n"
            f"      candidates: {rows}\n      timing: {opt.deploy.method[:160]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--exhaustive", action="store_true",
                    help="also optimize the old way and compare the choices")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(args.threads)
    print(f"machine: {machine(args.threads)}", flush=True)
    names = [m for m in args.models.split(",") if m]
    model, inputs, _ = build(names[0])
    graphopt.plan(model, inputs, target="cpu")  # the host calibration, cached
    results = []
    for name in names:
        model, inputs, what = build(name)
        total, spent, opt = optimize_once(model, inputs)
        print(f"{name:9s} {what}\n    {describe(total, spent, opt)}", flush=True)
        same = None
        if args.exhaustive:
            with exhaustive():
                old_total, old_spent, old = optimize_once(model, inputs)
            same = old.deploy.artifact == opt.deploy.artifact
            print(f"    exhaustive: {describe(old_total, old_spent, old)}\n"
                  f"    same choice: {same}", flush=True)
        results.append((name, total, same))
    met = sum(t <= BUDGET_S for _, t, _ in results)
    print(f"optimize within {BUDGET_S:g} s on {met} of {len(results)} models: "
          + ", ".join(f"{n} {t:.1f} s" for n, t, _ in results))
    if args.exhaustive:
        print("same choice as the exhaustive run on "
              f"{sum(bool(s) for _, _, s in results)} of {len(results)} models")


if __name__ == "__main__":
    main()
