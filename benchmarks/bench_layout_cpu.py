"""Is channels_last faster than NCHW for fp32 convs on this CPU (torch eager, oneDNN)?

The CPU rule of the layout pass (``_CPU_GAIN`` in ``graphopt/backends/torch/layout.py``) cites what
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
machine hits all of them alike), each round times enough calls for ~50 ms; ratios are medians
of per-round (paired) ratios, and ``load`` is how many cores other processes used meanwhile.

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

from graphopt.backends.torch.cleanup import fold_batchnorm_and_drop_dropout  # noqa: E402
from graphopt.backends.torch.layout import _cpu_class, channels_last  # noqa: E402
from graphopt.backends.torch.layout_regions import conv_info  # noqa: E402
from graphopt.backends.torch.pipeline import prepare  # noqa: E402
from graphopt.ir.options import Options  # noqa: E402

BATCH = 8
CL = torch.channels_last
ROUND_S = 0.05  # seconds per timed round (a few calls of the fast cases)


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


def timed_rounds(fns: list[Callable[[], object]], rounds: int
                 ) -> tuple[list[list[float]], float]:
    """(seconds per call of each fn, one per round; CPU share other processes took meanwhile).

    The fns are interleaved within a round (in rotating order: the fn after a big one may find
    the allocator's cache trimmed), so round i of every fn saw about the same neighbours:
    ratios are taken round by round (paired) and their median reported. The
    other-load share (from /proc/stat, in cores) says how noisy the run was.
    """
    for fn in fns:  # warm-up: oneDNN primitive creation, allocator
        fn()
        fn()
    t0 = time.perf_counter()
    fns[0]()
    iters = max(1, min(200, int(ROUND_S / max(time.perf_counter() - t0, 1e-6))))
    times: list[list[float]] = [[] for _ in fns]
    busy0, mine0 = _cpu_jiffies()
    start = time.perf_counter()
    for r in range(rounds):
        for i in [(r + k) % len(fns) for k in range(len(fns))]:  # rotating order
            fn = fns[i]
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            times[i].append((time.perf_counter() - t0) / iters)
    busy1, mine1 = _cpu_jiffies()
    others = max(0, (busy1 - busy0) - (mine1 - mine0)) / 100.0  # USER_HZ = 100
    return times, others / (time.perf_counter() - start)


def paired(num: list[float], den: list[float]) -> float:
    """Median over rounds of num[i] / den[i]."""
    return statistics.median(n / d for n, d in zip(num, den, strict=True))


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
    print(f"\n1. per conv, batch {BATCH}, fp32, {rounds} interleaved rounds. nchw/cl ms: fastest "
          "round; ratio = NCHW/channels_last and gain = (NCHW - cl) / (copy in + copy out), "
          "both medians of per-round values; load = other processes' CPU use (cores)")
    print(f"{'conv':<30} {'class':<11} {'nchw ms':>8} {'cl ms':>8} {'ratio':>6} "
          f"{'in ms':>6} {'out ms':>6} {'gain':>6} {'load':>5}")
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
            (nchw, cl, cin, cout), load = timed_rounds(
                [lambda: conv(x), lambda: conv_cl(x_cl),  # noqa: B023
                 lambda: x.contiguous(memory_format=CL),  # noqa: B023
                 lambda: y_cl.contiguous()], rounds)  # noqa: B023
        gain = statistics.median((n - c) / (i + o) for n, c, i, o in zip(nchw, cl, cin, cout,
                                                                         strict=True))
        print(f"{name:<30} {conv_class(conv, shape):<11} {min(nchw) * 1e3:8.2f} "
              f"{min(cl) * 1e3:8.2f} {paired(nchw, cl):6.2f} {min(cin) * 1e3:6.2f} "
              f"{min(cout) * 1e3:6.2f} {gain:6.2f} {load:5.2f}", flush=True)


# ------------------------------------------------------------------- part 2: blocks and nets
class BasicBlock(nn.Module):
    """ResNet basic block: conv3x3-bn-relu-conv3x3-bn + identity, relu."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.c2, self.b2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.b2(self.c2(torch.relu(self.b1(self.c1(x))))) + x)


class ConvStack(nn.Module):
    """``n`` conv3x3-relu layers with a residual around them."""

    def __init__(self, c: int, n: int) -> None:
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv2d(c, c, 3, padding=1) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        for conv in self.convs:
            y = torch.relu(conv(y))
        return y + x


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


class MobileNetLike(nn.Module):
    """Stem 3x3/2, then depthwise 3x3 + pointwise 1x1 pairs (stride 2 every other), pool, fc."""

    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, 32, 3, 2, 1), nn.ReLU6()]
        c = 32
        for out, stride in ((64, 1), (128, 2), (128, 1), (256, 2), (256, 1)):
            layers += [nn.Conv2d(c, c, 3, stride, 1, groups=c), nn.ReLU6(),
                       nn.Conv2d(c, out, 1), nn.ReLU6()]
            c = out
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(c, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).mean((2, 3)))


def net_cases() -> list[tuple[str, nn.Module, tuple[int, ...]]]:
    return [
        ("basic block 64ch @56", BasicBlock(64), (BATCH, 64, 56, 56)),
        ("basic block 128ch @56", BasicBlock(128), (BATCH, 128, 56, 56)),
        ("basic block 128ch @28", BasicBlock(128), (BATCH, 128, 28, 28)),
        ("basic block 512ch @7", BasicBlock(512), (BATCH, 512, 7, 7)),
        ("3 convs 64ch @56 + residual", ConvStack(64, 3), (BATCH, 64, 56, 56)),
        ("4 convs 128ch @28 + residual", ConvStack(128, 4), (BATCH, 128, 28, 28)),
        ("bottleneck 256/64 @56", Bottleneck(256, 64), (BATCH, 256, 56, 56)),
        ("resnext bottleneck 256/128 g32 @28", Bottleneck(256, 128, 32), (BATCH, 256, 28, 28)),
        ("single conv3x3 64 @56", nn.Conv2d(64, 64, 3, padding=1), (BATCH, 64, 56, 56)),
        ("depthwise conv 128 @56", nn.Conv2d(128, 128, 3, padding=1, groups=128),
         (BATCH, 128, 56, 56)),
        ("small resnet @224 (to 128ch @28)", SmallResNet(), (BATCH, 3, 224, 224)),
        ("resnet-18-like @224 (to 512ch @7)", SmallResNet(deep=True), (BATCH, 3, 224, 224)),
        ("mobilenet-like @224 (to 256ch @28)", MobileNetLike(), (BATCH, 3, 224, 224)),
    ]


def through_graphopt(model: nn.Module, x: torch.Tensor, layout: str
                     ) -> tuple[torch.nn.Module, str]:
    """(module after BN folding and the layout pass on target "cpu", what the pass decided)."""
    gm, ctx = prepare(model, (x,), "cpu", Options(layout=layout))  # type: ignore[arg-type]
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
    print(f"\n2. blocks and nets through graphopt, target cpu, batch {BATCH}, fp32, {rounds} "
          "interleaved rounds; ratio = BN-folded module time / time after the layout pass, "
          "median of per-round ratios (and of fastest rounds)")
    print(f"{'model':<36} {'base ms':>8} {'auto':>6} {'(min)':>6} {'forced':>7} {'(min)':>6} "
          f"{'load':>5}  auto decision (model gain/cost)")
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
            (tb, ta, tf), load = timed_rounds([lambda: base(x), lambda: auto(x),  # noqa: B023
                                               lambda: forced(x)], rounds)  # noqa: B023
        print(f"{name:<36} {min(tb) * 1e3:8.2f} {paired(tb, ta):6.2f} {min(tb) / min(ta):6.2f} "
              f"{paired(tb, tf):7.2f} {min(tb) / min(tf):6.2f} {load:5.2f}  {decided}"
              f"{'' if err < 1e-5 else f'  REL ERR {err:.1e}'}", flush=True)


def boundary_in_context(rounds: int, only: str) -> None:
    print(f"\n3. boundary copies inside a block vs alone, batch {BATCH}, fp32, {rounds} rounds: "
          "factor = (block with entry+exit copies - block fed channels_last and returning it) "
          "/ (the same two copies timed alone), median of per-round values")
    print(f"{'block':<36} {'nchw ms':>8} {'steady':>7} {'bound':>7} {'copies':>7} "
          f"{'factor':>7} {'load':>5}")
    for name, model, shape in net_cases()[:4]:
        if only and only not in name:
            continue
        torch.manual_seed(0)
        model = model.eval()
        model_cl = copy.deepcopy(model)
        for mod in model_cl.modules():
            if isinstance(mod, nn.Conv2d):
                mod.weight.data = mod.weight.data.contiguous(memory_format=CL)
        x = torch.randn(shape)
        x_cl = x.contiguous(memory_format=CL)
        with torch.no_grad():
            y_cl = model_cl(x_cl)
            (nchw, steady, bound, cin, cout), load = timed_rounds(
                [lambda: model(x), lambda: model_cl(x_cl),  # noqa: B023
                 lambda: model_cl(x.contiguous(memory_format=CL)).contiguous(),  # noqa: B023
                 lambda: x.contiguous(memory_format=CL), lambda: y_cl.contiguous()],  # noqa: B023
                rounds)
        factor = statistics.median((b - s) / (i + o) for b, s, i, o in zip(bound, steady, cin,
                                                                          cout, strict=True))
        print(f"{name:<36} {min(nchw) * 1e3:8.2f} {min(steady) * 1e3:7.2f} "
              f"{min(bound) * 1e3:7.2f} {(min(cin) + min(cout)) * 1e3:7.2f} {factor:7.2f} "
              f"{load:5.2f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    ap.add_argument("--only", default="", help="run cases whose name contains this")
    ap.add_argument("--part", type=int, default=0, help="1, 2 or 3 (default: all)")
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
    if args.part in (0, 3):
        boundary_in_context(args.rounds, args.only)


if __name__ == "__main__":
    main()
