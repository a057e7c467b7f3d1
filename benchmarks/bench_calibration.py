"""graphopt's cost model against published GPU kernel measurements (issue 12, item 5).

Loads ``benchmarks/calibration/measurements.csv`` (one published measurement a row, with its
source; see ``benchmarks/calibration/README.md``), asks the planner's own what-if calculator
(:func:`graphopt.cost.estimate_op`) for the same op, dims, dtype and target, and prints per
family: count, median and worst predicted/measured ratio, and the Spearman rank correlation of
predicted against measured time; then overall median |ln(pred/meas)| and the number of points off
by more than 2x, beside the issue's floors.

Mapping rows to ``estimate_op`` kinds:
- gemm -> ``gemm`` (M, N, K); gemv -> ``gemv`` (N outputs, K, M = batch of vectors)
- attention -> ``attention`` (batch, heads, seq = seq_q, seq_kv, kv_heads, causal, head_dim);
  the kernel column (FlashAttention-2/3, ...) is not an input: estimate_op has no kernel choice
- conv -> ``conv`` (batch, c_in, c_out, h, w, kernel, stride, padding)
- memory -> ``elementwise``: a stream with k arrays (k-1 loads, 1 store) moving B bytes is an
  elementwise op with ``inputs = k - 1`` and ``numel = B / (k * 4)`` in fp32 (the source's
  arrays may be fp64: only the bytes moved matter to a memory-bound op)

It runs no GPU code: every number is a prediction on the named target's datasheet profile.

Usage: python benchmarks/bench_calibration.py [--csv PATH] [--points]
"""

from __future__ import annotations

import argparse
import csv
import math
import platform
import statistics
import sys
from pathlib import Path

import graphopt
from graphopt.cost import estimate_op

HERE = Path(__file__).resolve().parent
DEFAULT_CSV = HERE / "calibration" / "measurements.csv"
FAMILIES = ("gemm", "gemv", "attention", "conv", "memory")
# issue 12's floors on our own set
FLOOR_MEDIAN_LN = 0.10
FLOOR_RATIO = (0.8, 1.25)
FLOOR_MAX_OFF = 2.0


def _int(row: dict[str, str], key: str) -> int:
    return int(row[key])


def _estimate(row: dict[str, str]) -> float:
    fam, gpu, dtype = row["family"], row["gpu"], row["dtype"]
    if fam == "gemm":
        dims = {k: _int(row, k) for k in ("M", "N", "K")}
        return estimate_op("gemm", dtype=dtype, target=gpu, **dims).time_s
    if fam == "gemv":
        dims = {k: _int(row, k) for k in ("M", "N", "K")}
        return estimate_op("gemv", dtype=dtype, target=gpu, **dims).time_s
    if fam == "attention":
        return estimate_op("attention", dtype=dtype, target=gpu, batch=_int(row, "batch"),
                           heads=_int(row, "heads"), kv_heads=_int(row, "kv_heads"),
                           seq=_int(row, "seq_q"), seq_kv=_int(row, "seq_kv"),
                           head_dim=_int(row, "head_dim"), causal=_int(row, "causal")).time_s
    if fam == "conv":
        k, pad = _int(row, "kernel_size"), _int(row, "padding")
        # estimate_op rejects an explicit padding=0 (dims must be >= 1); its default is k // 2
        extra = {} if pad == k // 2 else {"padding": pad}
        return estimate_op("conv", dtype=dtype, target=gpu, batch=_int(row, "batch"),
                           c_in=_int(row, "c_in"), c_out=_int(row, "c_out"), h=_int(row, "h"),
                           w=_int(row, "w"), kernel=k, stride=_int(row, "stride"),
                           **extra).time_s
    if fam == "memory":
        streams, nbytes = _int(row, "streams"), _int(row, "bytes_moved")
        numel = nbytes // (streams * 4)
        return estimate_op("elementwise", dtype="fp32", target=gpu, numel=numel,
                           inputs=streams - 1).time_s
    raise ValueError(f"unknown family {fam!r}")


def _ranks(xs: list[float]) -> list[float]:
    order = sorted(range(len(xs)), key=xs.__getitem__)
    ranks = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(a: list[float], b: list[float]) -> float:
    if len(a) < 3:
        return float("nan")
    return statistics.correlation(_ranks(a), _ranks(b))


def _label(row: dict[str, str]) -> str:
    fam = row["family"]
    if fam in ("gemm", "gemv"):
        dims = f"{row['M']}x{row['N']}x{row['K']}"
    elif fam == "attention":
        dims = (f"b{row['batch']} h{row['heads']}/{row['kv_heads']} {row['seq_q']}x"
                f"{row['seq_kv']} d{row['head_dim']}{' causal' if row['causal'] == '1' else ''}")
    elif fam == "conv":
        dims = (f"n{row['batch']} {row['c_in']}->{row['c_out']} {row['h']}x{row['w']} "
                f"k{row['kernel_size']} s{row['stride']}")
    else:
        dims = f"{int(row['bytes_moved']) / 1e9:.2f} GB, {row['streams']} streams"
    return f"{fam:9} {row['gpu']:9} {row['dtype']:4} {dims}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    ap.add_argument("--points", action="store_true", help="print every point's ratio")
    args = ap.parse_args()

    with args.csv.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    print(f"machine: {platform.node()} {platform.machine()}, python {platform.python_version()}, "
          f"graphopt {getattr(graphopt, '__version__', '?')}; runs no GPU code: predictions "
          f"from the targets' datasheet profiles against published measurements")
    shown = args.csv.relative_to(HERE.parent) if args.csv.is_relative_to(HERE.parent) else args.csv
    print(f"data: {shown}, {len(rows)} points, {len({r['source_repo'] for r in rows})} sources\n")

    pts: list[tuple[dict[str, str], float, float]] = []
    for r in rows:
        pts.append((r, _estimate(r), float(r["measured_s"])))

    if args.points:
        for r, p, m in pts:
            print(f"  {_label(r):55} meas {m * 1e6:10.1f} us  pred {p * 1e6:10.1f} us  "
                  f"ratio {p / m:5.2f}")
        print()

    print(f"{'family':10} {'n':>3} {'median pred/meas':>17} {'worst':>7} {'min':>6} {'max':>6} "
          f"{'spearman':>9}  floor [0.8, 1.25]")
    fam_ok = True
    for fam in FAMILIES:
        sel = [(p, m) for r, p, m in pts if r["family"] == fam]
        if not sel:
            continue
        ratios = [p / m for p, m in sel]
        med = statistics.median(ratios)
        worst = max(ratios, key=lambda x: abs(math.log(x)))
        rho = spearman([p for p, _ in sel], [m for _, m in sel])
        ok = FLOOR_RATIO[0] <= med <= FLOOR_RATIO[1]
        fam_ok &= ok
        print(f"{fam:10} {len(sel):3} {med:17.2f} {worst:7.2f} {min(ratios):6.2f} "
              f"{max(ratios):6.2f} {rho:9.2f}  {'met' if ok else 'NOT met'}")

    lns = [abs(math.log(p / m)) for _, p, m in pts]
    med_ln = statistics.median(lns)
    off = [(r, p / m) for r, p, m in pts if max(p / m, m / p) > FLOOR_MAX_OFF]
    rho_all = spearman([p for _, p, _ in pts], [m for _, _, m in pts])
    print(f"\nall {len(pts)} points: median |ln(pred/meas)| = {med_ln:.3f} (floor <= "
          f"{FLOOR_MEDIAN_LN:.2f}: {'met' if med_ln <= FLOOR_MEDIAN_LN else 'NOT met'}); "
          f"spearman {rho_all:.3f}")
    print(f"each family's median ratio in [{FLOOR_RATIO[0]}, {FLOOR_RATIO[1]}]: "
          f"{'met' if fam_ok else 'NOT met'}")
    print(f"points off by more than {FLOOR_MAX_OFF:g}x: {len(off)} (floor 0: "
          f"{'met' if not off else 'NOT met'})")
    for r, ratio in sorted(off, key=lambda t: -abs(math.log(t[1]))):
        print(f"  {_label(r):55} pred/meas {ratio:5.2f}  [{r['kernel']}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
