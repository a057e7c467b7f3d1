"""What one dynamic INT8 call costs inside graphopt's INT8 pass: ONNX Runtime's quantizer,
without and with setting aside the large initializers no quantized node reads
(``backends/onnx/quantize_ort._set_aside``), and graphopt's own writer of the same graph
(``backends/onnx/int8_matmul``, the pass's path from opset 11).

The model is GPT-2 with 4 layers (``bench_host_peers.build("gpt2")``, the TorchScript export
graphopt makes, its Gemms written as MatMul + Add as the pass does), quantizing every MatMul
with a constant weight. The ways alternate call by call, their order rotated
each round, for ``--rounds`` rounds; each ratio is the median of the paired per-round ratios
against ORT's plain call, the best call of each beside it. The outputs of the quantized models
are compared on the export's inputs (they must be equal).

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
from graphopt.backends.onnx.int8_matmul import dynamic_int8_matmuls  # noqa: E402
from graphopt.backends.onnx.quantize import _gemms_as_matmuls  # noqa: E402
from graphopt.frontends.onnx_export import export_torch  # noqa: E402

WAYS = ("ORT quantize_dynamic", "ORT, large initializers set aside", "graphopt's writer")


def one_call(model, nodes, way: str):
    saved = quantize_ort._ASIDE_BYTES
    quantize_ort._ASIDE_BYTES = 1 << 62 if way == WAYS[0] else saved
    try:
        start = time.perf_counter()
        out = dynamic_int8_matmuls(model, nodes, reduce_range=True) if way == WAYS[2] else \
            quantize_ort.ort_dynamic_int8(model, nodes, reduce_range=True)
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
    # as the pass does: GPT-2's Conv1D layers export as Gemm, written as MatMul + Add first
    model = _gemms_as_matmuls(model, {n.name for n in model.graph.node if n.op_type == "Gemm"})
    weights = {t.name for t in model.graph.initializer}
    nodes = [n.name for n in model.graph.node  # those the pass picks: a constant weight
             if n.op_type == "MatMul" and n.input[1] in weights]
    print(f"{what}: {model.ByteSize() / 1e6:.0f} MB, {len(nodes)} MatMuls quantized")
    times: dict[str, list[float]] = {w: [] for w in WAYS}
    outs = {}
    for r in range(args.rounds):
        for way in WAYS[r % 3:] + WAYS[:r % 3]:
            seconds, outs[way] = one_call(model, nodes, way)
            times[way].append(seconds)
    for way in WAYS:
        ratio = statistics.median(a / b for a, b in zip(times[WAYS[0]], times[way], strict=True))
        print(f"{way}: best {min(times[way]):.2f} s, {ratio:.2f}x faster than {WAYS[0]} "
              f"(median of {args.rounds} paired rounds)")
    runs = [ort.InferenceSession(outs[w].SerializeToString(), providers=["CPUExecutionProvider"])
            .run(None, exported.feeds) for w in WAYS]
    same = all(np.array_equal(x, y) for other in runs[1:] for x, y in zip(runs[0], other,
                                                                         strict=True))
    print(f"the quantized models give equal outputs: {same}")


if __name__ == "__main__":
    main()
