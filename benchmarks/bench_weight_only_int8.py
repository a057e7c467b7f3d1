"""Weight-only INT8 for weight-bound GEMMs (gemv shapes) in ONNX Runtime (issue 34, item 2).

One MatMul ``y = x @ W`` (``x``: rows x K, ``W``: K x N constant), as:

* ``fp32``: the MatMul as it is;
* ``dyn int8``: ``quantize_dynamic`` (per-channel int8 weights, uint8 activations per call:
  DynamicQuantizeLinear + MatMulInteger), graphopt's ``int8_dynamic``;
* ``nbits8 bB``: ``MatMulNBitsQuantizer(bits=8, block_size=B)``: int8 weights in blocks along K,
  fp32 activations (``accuracy_level`` unset: dequantized to fp32), com.microsoft MatMulNBits;
* ``nbits8 b32 acc4``: the same with ``accuracy_level=4`` (activations quantized to int8 per
  block, an integer dot product);
* ``nbits4 b32``: the same at 4 bits (graphopt's ``int4``), for reference.

Timed interleaved (``peers_common.interleaved``: a best-of sample per option per round, the
order rotated); ratio = best fp32 round / best option round (median of per-round ratios in
brackets); error = max |y - y_fp32| / max |y_fp32| on the timed input.
Run: ``python benchmarks/bench_weight_only_int8.py [--rounds 7] [--threads 2]``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers_common import Option, interleaved, machine, ratio  # noqa: E402

SHAPES = ((1, 4096, 4096), (1, 768, 3072), (1, 3072, 768), (8, 4096, 4096))


def matmul(rows: int, k: int, n: int) -> onnx.ModelProto:
    w = (np.random.default_rng(0).standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "mm",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, n])],
                          [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def nbits(m: onnx.ModelProto, bits: int, block: int, accuracy: int = 0) -> onnx.ModelProto:
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    copy = onnx.ModelProto()
    copy.CopyFrom(m)  # the quantizer edits the model it is given
    q = MatMulNBitsQuantizer(copy, bits=bits, block_size=block, is_symmetric=True,
                             accuracy_level=accuracy or None)
    q.process()
    return q.model.model


def dynamic(m: onnx.ModelProto) -> onnx.ModelProto:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as d:
        quantize_dynamic(m, Path(d) / "q.onnx", per_channel=True, weight_type=QuantType.QInt8,
                         reduce_range=True)
        return onnx.load(str(Path(d) / "q.onnx"))


def session(m: onnx.ModelProto, threads: int) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--budget", type=float, default=0.3)
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    print(f"# {machine(args.threads)}")
    for rows, k, n in SHAPES:
        m = matmul(rows, k, n)
        feed = {"x": np.random.default_rng(1).standard_normal((rows, k)).astype(np.float32)}
        ref = session(m, args.threads).run(None, feed)[0]
        options = []
        for name, model in (("fp32", m), ("A/A fp32", m), ("dyn int8", dynamic(m)),
                            ("nbits8 b32", nbits(m, 8, 32)), ("nbits8 b128", nbits(m, 8, 128)),
                            ("nbits8 b32 acc4", nbits(m, 8, 32, 4)),
                            ("nbits4 b32", nbits(m, 4, 32))):
            try:
                s = session(model, args.threads)
                y = s.run(None, feed)[0]
            except Exception as e:  # bits=8 may be refused by this ORT
                print(f"  {name}: cannot run: {type(e).__name__}: {str(e)[:200]}")
                continue
            err = float(np.abs(y - ref).max() / np.abs(ref).max())
            ops = sorted({x.op_type for x in model.graph.node})
            options.append(Option(name, lambda s=s, feed=feed: s.run(None, feed),
                                  f"err {err:.4f}; ops {','.join(ops)}"))
        interleaved(options, args.rounds, args.budget)
        print(f"\n### {rows}x{k} @ {k}x{n}\n| option | best us | vs fp32 | notes |\n"
              "|---|---:|---:|---|")
        for o in options:
            r = ratio(options[0].times, o.times)
            print(f"| {o.name} | {min(o.times) * 1e6:.0f} | {r[0]:.2f}x ({r[1]:.2f}x) | {o.note} |",
                  flush=True)


if __name__ == "__main__":
    main()
