"""Is channels_last faster than NCHW for fp32 convs on this CPU (torch eager, oneDNN)?

The CPU rule of the layout pass (``_CPU_GAIN`` in ``graphopt/rewrites/layout.py``) cites what
this script prints. Two parts:

1. Per conv: NCHW time, channels_last time with input and weight already channels_last
   ("steady"), and the two boundary copies the pass would add around the conv alone (input to
   channels_last, output back to NCHW). ``gain`` = (NCHW - steady) / (copy in + copy out) is
   the quantity ``_CPU_GAIN`` holds per conv class (``class`` is the pass's own classifier):
   a region pays when the sum of its convs' gains beats its boundary copies.
2. Whole blocks and nets through graphopt: ``prepare`` + BN folding, then the layout pass on
   target ``cpu`` in ``auto`` (what it decides) and forced; ratio = time of the folded module /
   time after the layout pass (> 1: the pass made it faster).

Timing: the variants of a case are interleaved round by round (a noisy neighbour on a shared
machine hits all of them), each round times enough calls for ~20 ms; the script prints ratios
of the MINIMUM round (least disturbed) and, in part 2, of the median too; ``spread`` is
max/min of the baseline's rounds (how noisy the run was).

Usage: python benchmarks/bench_layout_cpu.py [--rounds 15] [--threads N] [--only TEXT]
"""

from __future__ import annotations

import argparse
import copy
import logging
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from graphopt.rewrites.cleanup import fold_batchnorm_and_drop_dropout  # noqa: E402
from graphopt.rewrites.context import OptimizeOptions  # noqa: E402
from graphopt.rewrites.layout import _cpu_class, channels_last  # noqa: E402
from graphopt.rewrites.layout_regions import conv_info  # noqa: E402
from graphopt.rewrites.pipeline import prepare  # noqa: E402

BATCH = 8
CL = torch.channels_last
ROUND_S = 0.08  # seconds per timed round: several 10 ms jiffies for the quiet-round check
QUIET_SHARE = 0.1  # a round is quiet if other processes used < 10% of our cores during it


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


def _cpu_jiffies() -> tuple[int, int]:
    """(busy jiffies of the whole machine, jiffies of this process); (0, 0) off Linux."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        busy = sum(int(f) for f in fields) - int(fields[3]) - int(fields[4])  # - idle, iowait
        mine = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        return busy, int(mine[11]) + int(mine[12])  # utime + stime, all threads
    except (OSError, IndexError, ValueError):
        return 0, 0


def timed_rounds(fns: list[Callable[[], object]], rounds: int) -> list[list[float]]:
    """Seconds per call of each fn, one entry per QUIET round; fns interleaved in a round.

    A round is quiet when other processes used under ``QUIET_SHARE`` of the machine's CPU time
    during it (from /proc/stat; 10 ms jiffies, hence rounds of ~``ROUND_S``). Noisy rounds are
    dropped; if fewer than 3 rounds of a fn were quiet, all its rounds are kept.
    """
    for fn in fns:  # warm-up: oneDNN primitive creation, allocator
        fn()
        fn()
    t0 = time.perf_counter()
    fns[0]()
    iters = max(1, min(200, int(ROUND_S / max(time.perf_counter() - t0, 1e-6))))
    hz = 100.0  # USER_HZ: jiffies per second on Linux
    cores = torch.get_num_threads()
    quiet: list[list[float]] = [[] for _ in fns]
    every: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            busy0, mine0 = _cpu_jiffies()
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            wall = time.perf_counter() - t0
            busy1, mine1 = _cpu_jiffies()
            others = max(0, (busy1 - busy0) - (mine1 - mine0)) / hz
            every[i].append(wall / iters)
            if others <= QUIET_SHARE * wall * cores:
                quiet[i].append(wall / iters)
    return [q if len(q) >= 3 else e for q, e in zip(quiet, every, strict=True)]


# ---------------------------------------------------------------------------- part 1: convs
def conv_cases() -> list[tuple[str, nn.Conv2d, tuple[int, ...]]]:
    cases = []
    for c, hw in ((64, 56), (128, 56), (128, 28), (256, 28), (256, 14), (512, 14), (512, 7)):
        cases.append((f"3x3 {c}->{c} @{hw}", nn.Conv2d(c, c, 3, padding=1), (c, hw)))
    cases.append(("3x3/2 64->128 @56", nn.Conv2d(64, 128, 3, 2, 1), (64, 56)))
    for ci, co, hw in ((64, 256, 56), (256, 64, 56), (256, 256, 14), (2048, 512, 7)):
        cases.append((f"1x1 {ci}->{co} @{hw}", nn.Conv2d(ci, co, 1), (ci, hw)))
    cases.append(("stem 7x7/2 3->64 @224", nn.Conv2d(3, 64, 7, 2, 3), (3, 224)))
    for c, g, hw in ((128, 128, 56), (512, 512, 14), (64, 4, 56), (128, 32, 56), (256, 32, 28)):
        cases.append((f"groups={g} {c} @{hw} ({c // g}/group)",
                      nn.Conv2d(c, c, 3, padding=1, groups=g), (c, hw)))
    return [(name, conv, (BATCH, c, hw, hw)) for name, conv, (c, hw) in cases]


def conv_class(conv: nn.Conv2d, shape: tuple[int, ...]) -> str:
    """The layout pass's classification of this conv (traced the way the pass sees it)."""
    ep = torch.export.export(conv, (torch.randn(shape),))
    for node in ep.module().graph.nodes:
        info = conv_info(node)
        if info is not None:
            return _cpu_class(info)
    return "?"


def per_conv(rounds: int, only: str) -> None:
    print(f"\n1. per conv, batch {BATCH}, fp32 (min over {rounds} rounds; gain = saving / "
          "(copy in + copy out))")
    print(f"{'conv':<30} {'class':<11} {'nchw ms':>8} {'cl ms':>8} {'ratio':>6} "
          f"{'in ms':>6} {'out ms':>6} {'gain':>6}")
    for name, conv, shape in conv_cases():
        if only and only not in name:
            continue
        torch.manual_seed(0)
        conv = conv.eval()
        conv_cl = copy.deepcopy(conv)
        conv_cl.weight.data = conv_cl.weight.data.contiguous(memory_format=CL)
        x = torch.randn(shape)
        x_cl = x.contiguous(memory_format=CL)
        with torch.no_grad():
            y_cl = conv_cl(x_cl)
            t = timed_rounds([lambda: conv(x), lambda: conv_cl(x_cl),  # noqa: B023
                              lambda: x.contiguous(memory_format=CL),  # noqa: B023
                              lambda: y_cl.contiguous()], rounds)  # noqa: B023
        nchw, cl, cin, cout = (min(ts) for ts in t)
        print(f"{name:<30} {conv_class(conv, shape):<11} {nchw * 1e3:8.2f} {cl * 1e3:8.2f} "
              f"{nchw / cl:6.2f} {cin * 1e3:6.2f} {cout * 1e3:6.2f} "
              f"{(nchw - cl) / (cin + cout):6.2f}", flush=True)


# ------------------------------------------------------------------- part 2: blocks and nets
class BasicBlock(nn.Module):
    """ResNet basic block: conv3x3-bn-relu-conv3x3-bn + identity, relu."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.c2, self.b2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.b2(self.c2(torch.relu(self.b1(self.c1(x))))) + x)


class Bottleneck(nn.Module):
    """ResNet(-Xt) bottleneck: 1x1 reduce, 3x3 (grouped for ResNeXt), 1x1 expand, residual."""

    def __init__(self, c: int, mid: int, groups: int = 1) -> None:
        super().__init__()
        self.a, self.c = nn.Conv2d(c, mid, 1), nn.Conv2d(mid, c, 1)
        self.b = nn.Conv2d(mid, mid, 3, padding=1, groups=groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.c(torch.relu(self.b(torch.relu(self.a(x))))) + x)


class SmallResNet(nn.Module):
    """Stem (7x7/2, maxpool), basic blocks at 64 and 128 channels, avgpool, linear."""

    def __init__(self, deep: bool = False) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                                   nn.ReLU(), nn.MaxPool2d(3, 2, 1), BasicBlock(64),
                                   BasicBlock(64), nn.Conv2d(64, 128, 3, 2, 1), nn.ReLU(),
                                   BasicBlock(128)]
        if deep:  # down to 7x7 at 512 channels, like ResNet-18's last stages
            layers += [nn.Conv2d(128, 256, 3, 2, 1), nn.ReLU(), BasicBlock(256),
                       nn.Conv2d(256, 512, 3, 2, 1), nn.ReLU(), BasicBlock(512)]
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(512 if deep else 128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(self.body(x), 1), 1))


def net_cases() -> list[tuple[str, nn.Module, tuple[int, ...]]]:
    return [
        ("basic block 64ch @56", BasicBlock(64), (BATCH, 64, 56, 56)),
        ("basic block 128ch @56", BasicBlock(128), (BATCH, 128, 56, 56)),
        ("basic block 128ch @28", BasicBlock(128), (BATCH, 128, 28, 28)),
        ("basic block 512ch @7", BasicBlock(512), (BATCH, 512, 7, 7)),
        ("bottleneck 256/64 @56", Bottleneck(256, 64), (BATCH, 256, 56, 56)),
        ("resnext bottleneck 256/128 g32 @28", Bottleneck(256, 128, 32), (BATCH, 256, 28, 28)),
        ("single conv3x3 64 @56", nn.Conv2d(64, 64, 3, padding=1), (BATCH, 64, 56, 56)),
        ("depthwise conv 128 @56", nn.Conv2d(128, 128, 3, padding=1, groups=128),
         (BATCH, 128, 56, 56)),
        ("small resnet @224 (to 128ch @28)", SmallResNet(), (BATCH, 3, 224, 224)),
        ("resnet-18-like @224 (to 512ch @7)", SmallResNet(deep=True), (BATCH, 3, 224, 224)),
    ]


def through_graphopt(model: nn.Module, x: torch.Tensor, layout: str
                     ) -> tuple[torch.nn.Module, str]:
    """(module after BN folding and the layout pass on target "cpu", what the pass decided)."""
    gm, ctx = prepare(model, (x,), "cpu", OptimizeOptions(layout=layout))  # type: ignore[arg-type]
    fold_batchnorm_and_drop_dropout(gm, ctx)
    channels_last(gm, ctx)
    gm.recompile()
    notes = ctx.notes["layout"]
    applied = sum(r["applied"] for r in notes["regions"])
    gain = sum(r["gain_s"] for r in notes["regions"]) * 1e3
    cost = sum(r["cost_s"] for r in notes["regions"]) * 1e3
    return gm, (f"{applied}/{len(notes['regions'])} regions, {notes['conversions']} conv., "
                f"model {gain:.2f}/{cost:.2f} ms")


def per_net(rounds: int, only: str) -> None:
    print(f"\n2. blocks and nets through graphopt, target cpu, batch {BATCH}, fp32; ratio = "
          "BN-folded module time / time after the layout pass (min and median rounds)")
    print(f"{'model':<36} {'base ms':>8} {'auto':>6} {'(med)':>6} {'forced':>7} {'(med)':>6} "
          f"{'spread':>6}  auto decision (model gain/cost)")
    for name, model, shape in net_cases():
        if only and only not in name:
            continue
        torch.manual_seed(0)
        model = model.eval()
        x = torch.randn(shape)
        base, _ = through_graphopt(model, x, "keep")
        auto, decided = through_graphopt(model, x, "auto")
        forced, _ = through_graphopt(model, x, "channels_last")
        with torch.no_grad():
            ref = base(x)
            err = float((forced(x) - ref).abs().max() / ref.abs().max())
            t = timed_rounds([lambda: base(x), lambda: auto(x), lambda: forced(x)],  # noqa: B023
                             rounds)
        (b_min, a_min, f_min), (b_med, a_med, f_med) = ([f(ts) for ts in t]
                                                        for f in (min, statistics.median))
        print(f"{name:<36} {b_min * 1e3:8.2f} {b_min / a_min:6.2f} {b_med / a_med:6.2f} "
              f"{b_min / f_min:7.2f} {b_med / f_med:6.2f} {max(t[0]) / b_min:6.2f}  {decided}"
              f"{'' if err < 1e-5 else f'  REL ERR {err:.1e}'}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    ap.add_argument("--only", default="", help="run cases whose name contains this")
    ap.add_argument("--part", type=int, default=0, help="1 or 2 (default: both)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    print(f"machine: {machine()}")
    if args.part in (0, 1):
        per_conv(args.rounds, args.only)
    if args.part in (0, 2):
        per_net(args.rounds, args.only)


if __name__ == "__main__":
    main()
