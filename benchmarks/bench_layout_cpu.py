"""Is channels_last faster than NCHW for fp32 convs on this CPU (torch eager, oneDNN)?

The layout pass's CPU rule (``graphopt/rewrites/layout.py``) cites what this script prints.
Each case runs the same module twice: in NCHW (as the user wrote it) and in channels_last the
way the pass rewrites it (activation converted at the region entry, weights converted once
ahead of time, ``.contiguous()`` at the exit). "steady" drops the two boundary copies: what a
region costs when its neighbours are already channels_last.

Timing: NCHW and channels_last are interleaved round by round (so a noisy neighbour on a
shared machine hits both), each round times ``--iters`` calls; the script prints the median
and the minimum round and the ratio NCHW / channels_last (> 1: channels_last is faster) of
both. The spread (max/min of the NCHW rounds) says how noisy the run was.

Usage: python benchmarks/bench_layout_cpu.py [--rounds 15] [--iters 3] [--threads N]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

BATCH = 8


def machine() -> str:
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return (f"{model}; {torch.get_num_threads()} threads; torch {torch.__version__}; "
            f"ATen CPU capability {torch.backends.cpu.get_cpu_capability()}; "
            f"oneDNN {'on' if torch.backends.mkldnn.is_available() else 'off'}")


class BasicBlock(nn.Module):
    """ResNet basic block: conv3x3-bn-relu-conv3x3-bn + identity, relu."""

    def __init__(self, c: int, fold_bn: bool = False) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(c, c, 3, padding=1, bias=fold_bn)
        self.c2 = nn.Conv2d(c, c, 3, padding=1, bias=fold_bn)
        self.b1: nn.Module = nn.Identity() if fold_bn else nn.BatchNorm2d(c)
        self.b2: nn.Module = nn.Identity() if fold_bn else nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.b1(self.c1(x)))
        return torch.relu(self.b2(self.c2(y)) + x)


class Bottleneck(nn.Module):
    """ResNet(-Xt) bottleneck: 1x1 reduce, 3x3 (grouped for ResNeXt), 1x1 expand, residual."""

    def __init__(self, c: int, mid: int, groups: int = 1) -> None:
        super().__init__()
        self.a = nn.Conv2d(c, mid, 1)
        self.b = nn.Conv2d(mid, mid, 3, padding=1, groups=groups)
        self.c = nn.Conv2d(mid, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.c(torch.relu(self.b(torch.relu(self.a(x))))) + x)


class SmallResNet(nn.Module):
    """Stem (7x7/2 conv, maxpool) + two basic blocks + avgpool + linear: a whole conv net."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        self.blocks = nn.Sequential(BasicBlock(64), BasicBlock(64))
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1)
        return self.head(torch.flatten(y, 1))


def cases() -> list[tuple[str, nn.Module, tuple[int, ...]]]:
    return [
        ("resnet basic block 64ch 56x56 (bn)", BasicBlock(64), (BATCH, 64, 56, 56)),
        ("resnet basic block 64ch 56x56 (bn folded)", BasicBlock(64, True), (BATCH, 64, 56, 56)),
        ("resnet basic block 128ch 56x56 (bn)", BasicBlock(128), (BATCH, 128, 56, 56)),
        ("resnet basic block 128ch 28x28 (bn)", BasicBlock(128), (BATCH, 128, 28, 28)),
        ("plain conv3x3 64->64 56x56", nn.Conv2d(64, 64, 3, padding=1), (BATCH, 64, 56, 56)),
        ("plain conv3x3 128->128 56x56", nn.Conv2d(128, 128, 3, padding=1),
         (BATCH, 128, 56, 56)),
        ("conv1x1 64->256 56x56", nn.Conv2d(64, 256, 1), (BATCH, 64, 56, 56)),
        ("stem conv7x7/2 3->64 224x224", nn.Conv2d(3, 64, 7, 2, 3), (BATCH, 3, 224, 224)),
        ("depthwise conv3x3 128ch 56x56 (1 ch/group)",
         nn.Conv2d(128, 128, 3, padding=1, groups=128), (BATCH, 128, 56, 56)),
        ("grouped conv3x3 64ch g=4 (16 ch/group) 56x56",
         nn.Conv2d(64, 64, 3, padding=1, groups=4), (BATCH, 64, 56, 56)),
        ("grouped conv3x3 128ch g=32 (4 ch/group) 56x56",
         nn.Conv2d(128, 128, 3, padding=1, groups=32), (BATCH, 128, 56, 56)),
        ("resnext bottleneck 256ch mid128 g=32 28x28", Bottleneck(256, 128, 32),
         (BATCH, 256, 28, 28)),
        ("resnet bottleneck 256ch mid64 56x56", Bottleneck(256, 64), (BATCH, 256, 56, 56)),
        ("small resnet 224x224 (stem, 2 blocks, pool, linear)", SmallResNet(),
         (BATCH, 3, 224, 224)),
    ]


def _rounds(fns: list[Callable[[], object]], rounds: int, iters: int) -> list[list[float]]:
    times: list[list[float]] = [[] for _ in fns]
    for fn in fns:  # warm-up: oneDNN primitive creation, allocator
        for _ in range(2):
            fn()
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            times[i].append((time.perf_counter() - t0) / iters)
    return times


def measure(model: nn.Module, shape: tuple[int, ...], rounds: int, iters: int
            ) -> dict[str, float]:
    torch.manual_seed(0)
    model = model.eval()
    x = torch.randn(shape)
    x_cl = x.contiguous(memory_format=torch.channels_last)
    model_cl = _channels_last_copy(model)

    def nchw() -> object:
        return model(x)

    def cl_boundary() -> object:  # what the pass emits: entry copy, region, exit copy
        return model_cl(x.contiguous(memory_format=torch.channels_last)).contiguous()

    def cl_steady() -> object:
        return model_cl(x_cl)

    with torch.no_grad():
        ref, out = model(x), cl_boundary()
        err = float((ref - out).abs().max() / ref.abs().max())
        t_nchw, t_cl, t_steady = _rounds([nchw, cl_boundary, cl_steady], rounds, iters)
    med, best = statistics.median, min
    return {"nchw_ms": med(t_nchw) * 1e3, "cl_ms": med(t_cl) * 1e3,
            "ratio_median": med(t_nchw) / med(t_cl), "ratio_min": best(t_nchw) / best(t_cl),
            "ratio_steady": med(t_nchw) / med(t_steady), "spread": max(t_nchw) / min(t_nchw),
            "rel_err": err}


def _channels_last_copy(model: nn.Module) -> nn.Module:
    import copy

    m = copy.deepcopy(model)
    for mod in m.modules():  # 4-D conv weights only, as the pass does (not the linear head)
        if isinstance(mod, nn.Conv2d):
            mod.weight.data = mod.weight.data.contiguous(memory_format=torch.channels_last)
    return m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    ap.add_argument("--only", default="", help="run cases whose name contains this")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"machine: {machine()}")
    print(f"batch {BATCH}, fp32, {args.rounds} interleaved rounds x {args.iters} calls; ratio = "
          "NCHW time / channels_last time (> 1: channels_last faster)")
    print(f"{'case':<54} {'nchw ms':>8} {'cl ms':>8} {'med':>6} {'min':>6} {'steady':>6} "
          f"{'spread':>6} {'rel err':>8}")
    for name, model, shape in cases():
        if args.only and args.only not in name:
            continue
        r = measure(model, shape, args.rounds, args.iters)
        print(f"{name:<54} {r['nchw_ms']:8.2f} {r['cl_ms']:8.2f} {r['ratio_median']:6.2f} "
              f"{r['ratio_min']:6.2f} {r['ratio_steady']:6.2f} {r['spread']:6.2f} "
              f"{r['rel_err']:8.1e}", flush=True)


if __name__ == "__main__":
    main()
