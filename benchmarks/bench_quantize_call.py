"""What one call of ONNX Runtime's dynamic quantizer costs inside graphopt's INT8 pass, with and
without setting aside the large initializers no quantized node reads
(``backends/onnx/quantize_ort._set_aside``).

The model is GPT-2 with 4 layers (``bench_host_peers.build("gpt2")``, the TorchScript export
graphopt makes), quantizing its MatMuls as ``ort_dynamic_int8`` does. The two ways alternate
call by call (ABBA) for ``--rounds`` rounds; the ratio is the median of the paired per-round
ratios, the best call of each beside it. The outputs of both quantized models are compared on
the export's inputs (they must be equal).

Run: ``python benchmarks/bench_quantize_call.py [--rounds 5]``.
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
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_host_peers import build  # noqa: E402
from peers_common import machine  # noqa: E402

from graphopt.backends.onnx import quantize_ort  # noqa: E402
from graphopt.frontends.onnx_export import export_torch  # noqa: E402


def one_call(model, nodes, aside: bool):
    saved = quantize_ort._ASIDE_BYTES
    quantize_ort._ASIDE_BYTES = saved if aside else 1 << 62
    try:
        start = time.perf_counter()
        out = quantize_ort.ort_dynamic_int8(model, nodes, reduce_range=True)
        return time.perf_counter() - start, out
    finally:
        quantize_ort._ASIDE_BYTES = saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    print(f"machine: {machine(threads)}")
    model_, inputs, what = build("gpt2")
    exported = export_torch(model_, inputs)
    model = exported.model
    nodes = [n.name for n in model.graph.node if n.op_type == "MatMul"]
    print(f"{what}: {model.ByteSize() / 1e6:.0f} MB, {len(nodes)} MatMuls quantized")
    times = {True: [], False: []}
    outs = {}
    for r in range(args.rounds):
        for aside in ((True, False) if r % 2 == 0 else (False, True)):
            seconds, outs[aside] = one_call(model, nodes, aside)
            times[aside].append(seconds)
    ratio = statistics.median(b / a for a, b in zip(times[True], times[False], strict=True))
    print(f"without setting aside: best {min(times[False]):.2f} s; set aside: best "
          f"{min(times[True]):.2f} s; {ratio:.2f}x faster (median of {args.rounds} paired "
          "rounds)")
    runs = [ort.InferenceSession(outs[a].SerializeToString(), providers=["CPUExecutionProvider"])
            .run(None, exported.feeds) for a in (True, False)]
    same = all(np.array_equal(x, y) for x, y in zip(*runs, strict=True))
    print(f"the two quantized models give equal outputs: {same}")


if __name__ == "__main__":
    main()
