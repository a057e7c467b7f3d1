"""Optimized vs original eager on this CPU, for the test zoo and a ResNet-like net.

Both run under ``torch.no_grad()`` with the same inputs and thread count; the times are
medians of interleaved repetitions measured in one run, so machine noise hits both alike.
Floors (issue 3): ratio >= 1.00x on every zoo model with target="cpu"; conv nets >= 1.15x
median.

Usage: python benchmarks/bench_optimize_cpu.py [--reps 30]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import graphopt  # noqa: E402
from examples.resnet_like import build as build_resnet  # noqa: E402
from tests.zoo import zoo  # noqa: E402

CONV_NETS = {"odd_residual_cnn", "tc_guide_cnn", "convnet_grouped_depthwise", "norm_zoo",
             "resnet_like"}


def _bigger_zoo() -> dict[str, tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]:
    """The zoo at batch sizes where a run takes milliseconds, not microseconds."""
    models = zoo()
    scaled = {}
    for name, (model, inputs) in models.items():
        x = inputs[0]
        batch = 16 if x.dim() == 4 else 32
        shape = (batch, *x.shape[1:])
        if x.dim() == 4:
            shape = (batch, x.shape[1], 56, 56)
        scaled[name] = (model, (torch.randn(shape),))
    scaled["resnet_like"] = build_resnet(batch=8, resolution=112)
    return scaled


def _time(fn, args, reps: int) -> list[float]:
    out = []
    with torch.no_grad():
        for _ in range(reps):
            t = time.perf_counter()
            fn(*args)
            out.append(time.perf_counter() - t)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--target", default="cpu")
    args = ap.parse_args()
    print(f"machine: {platform.node()} {platform.processor() or platform.machine()}, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"target {graphopt.hardware.get_target(args.target).display_name}")
    ratios: dict[str, float] = {}
    for name, (model, inputs) in _bigger_zoo().items():
        opt = graphopt.optimize(model, inputs, target=args.target)
        for _ in range(3):  # warm both up (oneDNN primitive caches, allocator)
            _time(model, inputs, 1)
            _time(opt.module, inputs, 1)
        orig, new = [], []
        for _ in range(args.reps):  # interleave so drift affects both
            orig += _time(model, inputs, 1)
            new += _time(opt.module, inputs, 1)
        ratio = statistics.median(orig) / statistics.median(new)
        ratios[name] = ratio
        applied = ", ".join(opt.info.passes_applied) or "none"
        print(f"{name:28s} original {statistics.median(orig) * 1e3:8.3f} ms  optimized "
              f"{statistics.median(new) * 1e3:8.3f} ms  ratio {ratio:5.2f}x  passes: {applied}")
    conv = [r for n, r in ratios.items() if n in CONV_NETS]
    print(f"min ratio {min(ratios.values()):.2f}x (floor 1.00x); conv nets median "
          f"{statistics.median(conv):.2f}x (floor 1.15x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
