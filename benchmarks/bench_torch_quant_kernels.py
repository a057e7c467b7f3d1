"""torch's low-bit Linear kernels on this CPU against fp32 (issue 22): time and error of each
format as the optimized torch module runs it (the ``graphopt::*_linear`` ops of
``graphopt.backends.torch.quant_ops``, packed by ``pack_linear``), one 4096 x 4096 Linear at
M = 1 (decode) and M = 128 (prefill).

These are CPU numbers, stated as such: they check that each kernel runs and how much it
errs; a GPU's speed-ups come from its tensor cores and bandwidth, not from these.

Timing: interleaved rounds, the order rotated each round, best-of-n per option and round
after a warm-up; the ratio is fp32's best round over the format's. Error: max |ref - out|
over max |ref| and the cosine, against the fp32 Linear on the same inputs (Gaussian weights
scaled by 1/sqrt(K), Gaussian inputs).

``--probe`` instead runs each kernel on shapes around its limits in a child process per shape
(a crash is a result) and prints which ran: the measurements behind
``graphopt.decisions.quantization.torch_kernels``.

Run: ``python benchmarks/bench_torch_quant_kernels.py [--rounds N] [--threads T] [--probe]``.
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.two_trees import cpu_model  # noqa: E402
from graphopt.backends.timing import best_time  # noqa: E402
from graphopt.backends.torch.quant_ops import QUANT_OPS, pack_linear  # noqa: E402

SIZE = 4096
GROUP = 128


def options(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> dict[str, Callable[[], object]]:
    """name -> a call computing the Linear, each format packed once here, run by its op."""
    xb, wb, bb = x.bfloat16(), w.bfloat16(), b.bfloat16()

    def op(kernel: str, act: torch.Tensor, group: int | None = None) -> Callable[[], object]:
        packed = pack_linear(kernel, w, act.dtype, group)
        extra = (group,) if group else ()
        return lambda: QUANT_OPS[kernel](act, *packed, *extra, b)

    return {
        "fp32": lambda: torch.nn.functional.linear(x, w, b),
        "bf16": lambda: torch.nn.functional.linear(xb, wb, bb),
        "fp8_e4m3 (bf16 act)": op("fp8_e4m3", xb),
        "int8 dynamic W8A8 (bf16 act)": op("int8_dynamic", xb),
        "int8 weight-only (fp32 act)": op("int8_weight_only", x),
        "int8 weight-only (bf16 act)": op("int8_weight_only", xb),
        f"int4 g{GROUP} (bf16 act)": op("int4_weight_only", xb, GROUP),
    }


def measure(m: int, rounds: int) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(m, SIZE, generator=g)
    w = torch.randn(SIZE, SIZE, generator=g) / SIZE ** 0.5
    b = torch.randn(SIZE, generator=g)
    calls = options(x, w, b)
    with torch.inference_mode():
        ref = calls["fp32"]().double()
        best = dict.fromkeys(calls, float("inf"))
        names = list(calls)
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                best[name] = min(best[name], best_time(calls[name], budget_s=0.3, min_runs=3,
                                                       max_runs=200))
        print(f"\n## M = {m} ({m} x {SIZE} @ {SIZE} x {SIZE})\n")
        print("| format | best ms | vs fp32 | max err / scale | cosine |")
        print("|---|---:|---:|---:|---:|")
        for name in names:
            out = calls[name]().double()
            err = float((ref - out).abs().max() / ref.abs().max())
            cos = float((ref.flatten() @ out.flatten()) / (ref.norm() * out.norm()))
            print(f"| {name} | {best[name] * 1e3:.3f} | {best['fp32'] / best[name]:.2f}x | "
                  f"{err:.4f} | {cos:.6f} |")


_PROBE = """
import sys, torch
from graphopt.backends.torch import quant_kernels as qk
fmt, dt = sys.argv[1], sys.argv[4]
k, n, group = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[5])
x, w = torch.randn(8, k, dtype=getattr(torch, dt)), torch.randn(n, k)
if fmt == "fp8_e4m3":
    qk.fp8_linear(x, *qk.pack_fp8(w))
elif fmt == "int8_weight_only":
    qk.int8_weight_only_linear(x, *qk.pack_int8_weight_only(w, x.dtype))
else:
    qk.int4_linear(x, *qk.pack_int4(w, group, x.dtype), group)
"""


def probe() -> None:
    """Each kernel at shapes around its limits, one child process each."""
    cases = [("fp8_e4m3", k, n, "bfloat16", 0) for k, n in ((250, 256), (256, 250), (24, 256))]
    cases += [("int8_weight_only", k, 256, dt, 0) for dt in ("bfloat16", "float16", "float32")
              for k in (32, 96, 248, 250, 256, 264)]
    cases += [("int4_weight_only", k, n, "bfloat16", g) for k, n, g in
              ((256, 256, 32), (256, 248, 32), (256, 256, 16), (96, 256, 32), (256, 256, 256))]
    root = str(Path(__file__).resolve().parents[1])
    print("| kernel | K | N | activations | group | result |\n|---|---:|---:|---|---:|---|")
    for fmt, k, n, dt, group in cases:
        done = subprocess.run([sys.executable, "-c", _PROBE, fmt, str(k), str(n), dt,
                               str(group)], capture_output=True, text=True, cwd=root,
                              check=False)
        said = (done.stderr.strip().splitlines() or [""])[-1][:90]
        result = ("runs" if done.returncode == 0 else
                  f"CRASH (signal {-done.returncode})" if done.returncode < 0 else said)
        print(f"| {fmt} | {k} | {n} | {dt} | {group or ''} | {result} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--probe", action="store_true", help="the kernels' limits, not timings")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"machine: {cpu_model()}, {torch.get_num_threads()} threads; torch "
          f"{torch.__version__}, Python {platform.python_version()}")
    if args.probe:
        probe()
        return
    for m in (1, 128):
        measure(m, args.rounds)


if __name__ == "__main__":
    main()
