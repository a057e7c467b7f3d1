"""Whether ONNX Runtime's INT8 GEMM saturates on this CPU, and what the exact scheme costs: why
graphopt quantizes with ``reduce_range`` where the int8 path sums u8 x s8 pairs in int16
(``decisions/quantization/choice.py``, case 4), and what that costs against ORT's default.

1. Exactness: ``MatMulInteger`` on values where a pair of u8 x s8 products overflows int16
   (255 x 127 x 2 = 64770 > 32767, and 200 x 100 x 2 = 40000), against the exact integer
   product, for U8S8 (int8 weights: ORT's default, ``quantize_dynamic``) and U8U8 (uint8
   weights, zero point 128). A saturating path returns a wrong sum silently.
2. Speed: U8S8 against U8U8 at a transformer's GEMM (M=128, K=768, N=3072), interleaved rounds
   (the order alternated), best of 5 calls per round; the ratio is U8U8 / U8S8 time.
3. ``--gpt2``: the whole GPT-2 4L (``bench_host_peers.build("gpt2")``) quantized by ORT's
   ``quantize_dynamic`` three ways (U8S8 full range, its default; U8S8 ``reduce_range``; U8U8,
   ``QUInt8`` weights), beside fp32: each one's error against torch (of the output's scale,
   and cosine), then interleaved rounds (order rotated), best of 3 calls per round; each speed
   is the median of the paired per-round ratios of the U8S8 default's time over its own.

Run: ``python benchmarks/bench_int8_scheme.py [--rounds 15] [--threads T] [--gpt2]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers_common import best_of, machine  # noqa: E402


def session(weights: np.ndarray, zero_point: int, m: int, threads: int) -> ort.InferenceSession:
    k, n = weights.shape
    inits = [numpy_helper.from_array(weights, "W"),
             numpy_helper.from_array(np.array(0, np.uint8), "za"),
             numpy_helper.from_array(np.array(zero_point, weights.dtype), "zw")]
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["A", "W", "za", "zw"], ["Y"])], "gemm",
        [helper.make_tensor_value_info("A", TensorProto.UINT8, [m, k])],
        [helper.make_tensor_value_info("Y", TensorProto.INT32, [m, n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def exactness(threads: int) -> None:
    k, n = 256, 64
    for a, w in ((255, 127), (200, 100), (128, 64)):
        x = np.full((4, k), a, np.uint8)
        s8 = np.full((k, n), w, np.int8)
        s8[:, 1::2] *= -1
        u8 = (s8.astype(np.int16) + 128).astype(np.uint8)
        exact = x.astype(np.int64) @ s8.astype(np.int64)
        got_s8 = session(s8, 0, 4, threads).run(None, {"A": x})[0]
        got_u8 = session(u8, 128, 4, threads).run(None, {"A": x})[0]
        print(f"activation {a}, weight +-{w}: exact {exact[0, 0]}, U8S8 {got_s8[0, 0]} "
              f"({'exact' if np.array_equal(got_s8, exact) else 'SATURATED'}), U8U8 "
              f"{got_u8[0, 0]} ({'exact' if np.array_equal(got_u8, exact) else 'wrong'})")


def speed(rounds: int, threads: int) -> None:
    m, k, n = 128, 768, 3072
    rng = np.random.default_rng(0)
    x = {"A": rng.integers(0, 256, (m, k), dtype=np.uint8)}
    runs = {"U8S8": session(rng.integers(-127, 128, (k, n), dtype=np.int8), 0, m, threads),
            "U8U8": session(rng.integers(0, 256, (k, n), dtype=np.uint8), 128, m, threads)}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(rounds):
        for name in list(runs)[:: 1 if r % 2 == 0 else -1]:
            times[name].append(best_of(lambda s=runs[name]: s.run(None, x), 0.0, min_calls=5))
    ratio = statistics.median(u / s for u, s in zip(times["U8U8"], times["U8S8"], strict=True))
    print(f"M={m} K={k} N={n}: U8S8 {min(times['U8S8']) * 1e3:.2f} ms, U8U8 "
          f"{min(times['U8U8']) * 1e3:.2f} ms; U8U8 / U8S8 {ratio:.2f}x (median of {rounds} "
          "paired rounds)")


def whole_gpt2(rounds: int, threads: int) -> None:
    import tempfile

    import onnx
    import torch
    from bench_host_peers import build
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from graphopt.frontends.onnx_export import export_torch

    torch.set_num_threads(threads)
    model, inputs, what = build("gpt2")
    exported = export_torch(model, inputs, opset=17)
    with torch.no_grad():
        ref = model(*inputs).numpy()
    tmp = Path(tempfile.mkdtemp(prefix="graphopt-scheme-"))
    src = tmp / "fp32.onnx"
    onnx.save(exported.model, str(src))
    ways = {"U8S8 full range (ORT's default)": {"weight_type": QuantType.QInt8},
            "U8S8 reduce_range": {"weight_type": QuantType.QInt8, "reduce_range": True},
            "U8U8": {"weight_type": QuantType.QUInt8}}
    paths = {"fp32": src}
    for i, (name, kw) in enumerate(ways.items()):
        paths[name] = tmp / f"q{i}.onnx"
        quantize_dynamic(str(src), str(paths[name]), per_channel=True, **kw)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    runs = {n: ort.InferenceSession(str(p), options, providers=["CPUExecutionProvider"])
            for n, p in paths.items()}
    print(f"{what}, every MatMul with a constant weight quantized by quantize_dynamic:")
    for name, sess in runs.items():
        out = sess.run(None, exported.feeds)[0]
        cos = float((out * ref).sum() / np.linalg.norm(out) / np.linalg.norm(ref))
        print(f"  {name}: error {np.abs(out - ref).max() / np.abs(ref).max():.4f} of scale, "
              f"cosine {cos:.6f}")
    names = list(runs)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            best = float("inf")
            for _ in range(3):
                t = time.perf_counter()
                runs[name].run(None, exported.feeds)
                best = min(best, time.perf_counter() - t)
            times[name].append(best)
    base = times["U8S8 full range (ORT's default)"]
    for name in names:
        ratio = statistics.median(b / t for b, t in zip(base, times[name], strict=True))
        print(f"  {name}: best {min(times[name]) * 1e3:.1f} ms, speed {ratio:.3f}x ORT's "
              f"default (median of {rounds} paired rounds)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--gpt2", action="store_true", help="also the whole GPT-2 4L, three ways")
    args = ap.parse_args()
    print(f"machine: {machine(args.threads)}")
    exactness(args.threads)
    speed(args.rounds, args.threads)
    if args.gpt2:
        whole_gpt2(args.rounds, args.threads)


if __name__ == "__main__":
    main()
