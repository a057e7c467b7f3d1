"""graphopt-optimized ONNX vs a plain export, both in ONNX Runtime on this CPU (issue 6).

For each zoo model (tests/zoo.py: MLP, transformer, CNN, norm and RMSNorm blocks): the plain
model is torch's TorchScript export (what ``graphopt.frontends.onnx_export`` produces before any
pass), run in ``onnxruntime.InferenceSession`` with default options; the graphopt model is
``graphopt optimize --target cpu`` of the same export, run through ``graphopt.ort_session``
(its session config). Timing interleaves the two (ABAB rounds with alternating order, same
inputs); the speedup is the median over rounds of plain / graphopt per-call time (paired, so
drift from other jobs on the machine cancels), with the interquartile range of those ratios;
"A/A control" is the same statistic for the plain model against a second plain session: the
noise floor of one run.
Also checks the error against the plain model's outputs. Floor: speedup >= 1.00 on every
model, error within tolerance.

Run: ``python benchmarks/bench_onnx_cpu.py [--rounds N]``.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from graphopt.backends.onnx.pipeline import optimize_onnx, save_onnx  # noqa: E402
from graphopt.backends.onnx.session import ort_session  # noqa: E402
from graphopt.frontends.onnx_export import export_torch  # noqa: E402
from graphopt.ir.options import Options  # noqa: E402
from tests.zoo import zoo  # noqa: E402


def _per_call(sess: ort.InferenceSession, feeds: dict[str, np.ndarray], n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        sess.run(None, feeds)
    return (time.perf_counter() - t) / n


def bench(name: str, rounds: int, calls: int, tmp: Path) -> dict[str, object]:
    model, inputs = zoo()[name]
    exported = export_torch(model, inputs)
    plain_path = tmp / f"{name}.plain.onnx"
    plain_path.write_bytes(exported.model.SerializeToString())
    done = optimize_onnx(exported.model, "cpu", Options(), samples=[exported.feeds])
    opt, info = done.model, done.report
    opt_path = save_onnx(opt, tmp / f"{name}.graphopt.onnx", info["session"])
    plain = ort.InferenceSession(str(plain_path), providers=["CPUExecutionProvider"])
    control = ort.InferenceSession(str(plain_path), providers=["CPUExecutionProvider"])
    fast = ort_session(opt_path)
    feeds = {k: v for k, v in exported.feeds.items()}
    ref = plain.run(None, feeds)
    got = fast.run(None, feeds)
    err = max(float(np.abs(r - g).max() / max(np.abs(r).max(), 1e-30)) for r, g in
              zip(ref, got, strict=True))
    for s in (plain, fast, control):  # warm up: allocator, thread pool, first-run kernels
        _per_call(s, feeds, calls)
    a, b, c = [], [], []
    for i in range(rounds):
        order = [(plain, a), (fast, b), (control, c)]
        for sess, acc in order[i % 3:] + order[:i % 3]:  # rotate who goes first
            acc.append(_per_call(sess, feeds, calls))
    t_plain, t_opt = statistics.median(a), statistics.median(b)
    ratios = sorted(x / y for x, y in zip(a, b, strict=True))
    q1, q3 = ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]
    aa = statistics.median(x / y for x, y in zip(a, c, strict=True))
    return {"model": name, "plain_us": t_plain * 1e6, "graphopt_us": t_opt * 1e6,
            "speedup": statistics.median(ratios), "iqr": (q1, q3), "aa": aa,
            "threads": info["session"]["intra_op_num_threads"], "max_err_rel_scale": err,
            "tolerance": info["tolerance"]["rel_to_scale"], "passes": info["passes_applied"],
            "quantized": sorted((info["notes"].get("quantize") or {}).get("nodes", {}))}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--models", nargs="*", default=sorted(zoo()))
    args = p.parse_args()
    torch.manual_seed(0)
    print(f"# {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch "
          f"threads, onnxruntime {ort.__version__}, {args.rounds} rounds x {args.calls} calls")
    print("| model | plain ORT | graphopt ORT | speedup (IQR) | A/A control | max err / scale | "
          "tolerance | graphopt changes |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    worst = float("inf")
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            r = bench(name, args.rounds, args.calls, Path(tmp))
            worst = min(worst, float(r["speedup"]))
            ok = ok and float(r["max_err_rel_scale"]) <= float(r["tolerance"])
            passes = ", ".join(r["passes"]) or "no pass"
            if r["quantized"]:
                passes += f" ({', '.join(r['quantized'])})"
            if r["threads"]:
                passes += f"; {r['threads']} intra-op thread(s)"
            q1, q3 = r["iqr"]
            print(f"| {name} | {r['plain_us']:.1f} us | {r['graphopt_us']:.1f} us | "
                  f"{r['speedup']:.2f}x ({q1:.2f}-{q3:.2f}) | {r['aa']:.2f}x | "
                  f"{r['max_err_rel_scale']:.2g} | {r['tolerance']:g} | {passes} |", flush=True)
    print(f"\nworst speedup {worst:.2f}x (floor 1.00x); errors within tolerance: {ok}")
    return 0 if worst >= 1.0 and ok else 1


if __name__ == "__main__":
    sys.exit(main())
