"""Static INT8 for convolutional networks on this CPU, whole models (issue 34, item 2).

Per model, every option on the same fp32 ONNX file and the same inputs, timed interleaved
(one best-of sample per option per round, the order rotated every round; ``peers_common``):

* ``ORT fp32``: ONNX Runtime, graph optimizations on (the baseline of every ratio);
* ``ORT QDQ``: graphopt's static QDQ (``backends.onnx.quantize_ort.ort_static_qdq``: U8S8,
  per-channel int8 weights, MinMax-calibrated uint8 activations, ``reduce_range`` as
  ``decisions.quantization.choice.int8_scheme`` sets it for the host) of the dense convs
  (``group == 1``, the convs graphopt's legality rule allows), which ORT fuses into
  ``QLinearConv`` (counted in its optimized graph); ``--all-convs`` adds the depthwise ones;
* ``ORT QDQ plan``: the same for only the convs graphopt's plan for this host puts at int8
  (``graphopt.plan(model, target="cpu")``: the per-node cost), what ``optimize`` quantizes;
* ``OV fp32``: OpenVINO on the fp32 file (its default inference precision);
* ``OV QDQ``: OpenVINO on the same QDQ file as ``ORT QDQ`` (its low-precision transformations
  read the QuantizeLinear/DequantizeLinear pairs); the runtime model's layers that ran in
  u8/i8 are counted;
* ``OV NNCF``: ``nncf.quantize`` (post-training INT8, default preset) of the OpenVINO model
  with the same calibration batches: the reference point.

Calibration: ``--calib`` batches of seeded standard-normal inputs (a normalized image's
range); accuracy is measured on ``--fresh`` other batches (a different seed), each option's
outputs against ORT fp32's: max |error| / max |reference| and cosine, the worst over outputs
and batches. Ratios: best fp32 round / best option round, with the median of the paired
per-round ratios in brackets; ``A/A`` (a second fp32 session) is the run's noise floor.

Run: ``python benchmarks/bench_conv_int8.py [--models resnet_like_b1,...] [--rounds 5]
[--threads 2] [--budget 1.0] [--all-convs]``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_published_peers import MODELS  # noqa: E402
from peers_common import Option, compare, interleaved, machine, ratio  # noqa: E402

from graphopt.backends.onnx.quantize_ort import ort_static_qdq  # noqa: E402
from graphopt.decisions.quantization.choice import int8_scheme  # noqa: E402
from graphopt.hardware.detect import host_cpu_profile  # noqa: E402

#: key -> (input shape, what it is); published models come out of their wheels: those of
#: bench_published_peers.py, and the PP-OCRv4 detector beside its recognizer
PUBLISHED = {**MODELS,
             "paddle_det": ((1, 3, 480, 640), "PP-OCRv4 text detector (DBNet), 480x640")}
TORCH = {
    "resnet_like_b1": "examples/resnet_like.py, batch 1, 224x224",
    "resnet_like_b8": "examples/resnet_like.py, batch 8, 224x224",
    "resnet50_b1": "ResNet-50 (transformers ResNetModel, random weights), batch 1, 224x224",
    "resnet50_b8": "ResNet-50 (transformers ResNetModel, random weights), batch 8, 224x224",
}
_DET = ("rapidocr-onnxruntime", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx")


def cache_dir() -> Path:
    test_cache = ROOT / ".pytest_cache" / "d" / "published-onnx"
    return test_cache if test_cache.is_dir() else (
        Path.home() / ".cache" / "graphopt-benchmarks" / "published-onnx")


def published(key: str, tmp: Path) -> tuple[onnx.ModelProto, str]:
    """The model out of its wheel (cached by ``tests.published_wheels``), input made static."""
    from tests.published_wheels import fetch_model

    shape = PUBLISHED[key][0]
    if key == "paddle_det":  # in the rapidocr wheel beside paddle_rec
        fetch_model(cache_dir(), "paddle_rec")
        wheel = sorted((cache_dir() / "wheels").glob("rapidocr_onnxruntime-*.whl"))[0]
        with zipfile.ZipFile(wheel) as z:
            model = onnx.load_from_string(z.read(_DET[1]))
    else:
        path = fetch_model(cache_dir(), key)
        if isinstance(path, str):
            raise SystemExit(path)
        model = onnx.load(str(path))
    inits = {t.name for t in model.graph.initializer}
    (inp,) = [i for i in model.graph.input if i.name not in inits]
    for d, n in zip(inp.type.tensor_type.shape.dim, shape, strict=True):
        d.Clear()
        d.dim_value = n
    return model, inp.name


def exported(key: str) -> tuple[onnx.ModelProto, str]:
    import torch

    from graphopt.frontends.onnx_export import export_torch

    batch = int(key.rsplit("_b", 1)[1])
    if key.startswith("resnet_like"):
        sys.path.insert(0, str(ROOT / "examples"))
        from resnet_like import build

        model, inputs = build(batch=batch)
    else:
        from bench_host_peers import build as build_peer

        model, (one,), _ = build_peer("resnet")
        inputs = (one.repeat(batch, 1, 1, 1),)
    with torch.inference_mode():
        ex = export_torch(model, inputs, opset=17)
    return ex.model, next(iter(ex.feeds))


def batches(model: onnx.ModelProto, name: str, n: int, seed: int) -> list[dict[str, np.ndarray]]:
    (inp,) = [i for i in model.graph.input if i.name == name]
    shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
    rng = np.random.default_rng(seed)
    return [{name: rng.standard_normal(shape).astype(np.float32)} for _ in range(n)]


def dense_convs(model: onnx.ModelProto, all_convs: bool) -> list[str]:
    out = []
    for n in model.graph.node:
        group = next((a.i for a in n.attribute if a.name == "group"), 1)
        if n.op_type == "Conv" and (all_convs or group == 1):
            out.append(n.name)
    return out


def plan_int8(model: onnx.ModelProto) -> list[str]:
    """The convs graphopt's plan for this host puts at int8 (its cost per node)."""
    import graphopt

    plan = graphopt.plan(model, target="cpu")
    return [n.name for n in plan.nodes if n.op_type == "Conv" and "precision" in n.decisions
            and n.decisions["precision"].detail.format == "int8"]


def ort_session(model: onnx.ModelProto | str, threads: int, optimized: Path | None = None
                ) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    if optimized is not None:
        so.optimized_model_filepath = str(optimized)
    src = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


def accuracy(run: Callable[[dict[str, np.ndarray]], list[np.ndarray]],
             fresh: list[dict[str, np.ndarray]], refs: list[list[np.ndarray]]) -> str:
    worst = (0.0, 1.0)
    for feed, ref in zip(fresh, refs, strict=True):
        e = compare(ref, run(feed))
        worst = (max(worst[0], e[0]), min(worst[1], e[1]))
    return f"err {worst[0]:.4f} cos {worst[1]:.5f}"


def ov_options(fp32_path: Path, qdq_path: Path, calib: list[dict[str, np.ndarray]],
               fresh: list[dict[str, np.ndarray]], refs: list[list[np.ndarray]], threads: int
               ) -> list[Option]:
    import nncf
    import openvino as ov

    core = ov.Core()
    feed0 = calib[0]
    out = []

    def compiled(name: str, model: Any, prefix: str) -> Option:
        c = core.compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": threads})
        rt = c.get_runtime_model()
        prec = [op.get_rt_info()["runtimePrecision"].astype(str) for op in rt.get_ops()
                if "runtimePrecision" in op.get_rt_info()
                and op.get_rt_info()["layerType"].astype(str) in ("Convolution", "FullyConnected",
                                                                  "MatMul")]
        low = sum(p in ("u8", "i8", "I8", "U8") for p in prec)
        hint = c.get_property("INFERENCE_PRECISION_HINT")
        req = c.create_infer_request()
        fn = lambda: req.infer(feed0, share_inputs=True)  # noqa: E731
        acc = accuracy(lambda f: [np.asarray(o) for o in req.infer(f).to_tuple()], fresh, refs)
        return Option(name, fn, f"{prefix}runs {hint}; convs/matmuls in int8: {low}/{len(prec)};"
                                f" {acc}")

    out.append(compiled("OV fp32", core.read_model(str(fp32_path)), ""))
    out.append(compiled("OV QDQ", core.read_model(str(qdq_path)), ""))
    nncf.set_log_level(logging.ERROR)
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        q = nncf.quantize(core.read_model(str(fp32_path)), nncf.Dataset(calib),
                          subset_size=len(calib))
    out.append(compiled("OV NNCF", q, f"nncf.quantize {time.perf_counter() - start:.1f} s; "))
    return out


def bench(key: str, args: argparse.Namespace, scheme_rr: bool) -> None:
    what = PUBLISHED[key][1] if key in PUBLISHED else TORCH[key]
    with tempfile.TemporaryDirectory(prefix="bench-conv-int8-") as d:
        tmp = Path(d)
        model, name = published(key, tmp) if key in PUBLISHED else exported(key)
        calib = batches(model, name, args.calib, 0)
        fresh = batches(model, name, args.fresh, 1)
        fp32_path, qdq_path = tmp / "fp32.onnx", tmp / "qdq.onnx"
        onnx.save(model, str(fp32_path))
        convs = dense_convs(model, args.all_convs)
        n_conv = sum(n.op_type == "Conv" for n in model.graph.node)
        start = time.perf_counter()
        qdq = ort_static_qdq(model, convs, ["Conv"], calib, "int8", symmetric=False,
                             reduce_range=scheme_rr)
        q_s = time.perf_counter() - start
        onnx.save(qdq, str(qdq_path))
        base = ort_session(str(fp32_path), args.threads)
        refs = [base.run(None, f) for f in fresh]
        aa = ort_session(str(fp32_path), args.threads)
        qs = ort_session(str(qdq_path), args.threads, tmp / "qdq.opt.onnx")
        fused = sum(n.op_type == "QLinearConv" for n in onnx.load(str(tmp / "qdq.opt.onnx"),
                                                                   load_external_data=False)
                    .graph.node)
        picks = plan_int8(model)
        planned = ort_static_qdq(model, picks, ["Conv"], calib, "int8", symmetric=False,
                                 reduce_range=scheme_rr) if picks else model
        ps = ort_session(planned, args.threads)
        feed0 = calib[0]
        options = [
            Option("ORT fp32", lambda: base.run(None, feed0), "baseline"),
            Option("A/A fp32", lambda: aa.run(None, feed0), "a second fp32 session"),
            Option("ORT QDQ", lambda: qs.run(None, feed0),
                   f"{len(convs)}/{n_conv} convs QDQ (reduce_range={scheme_rr}, quantize "
                   f"{q_s:.1f} s), {fused} QLinearConv after ORT's fusions; "
                   + accuracy(lambda f: qs.run(None, f), fresh, refs)),
            Option("ORT QDQ plan", lambda: ps.run(None, feed0),
                   f"the {len(picks)} convs graphopt's plan puts at int8 on this host; "
                   + accuracy(lambda f: ps.run(None, f), fresh, refs))]
        if not args.no_openvino:
            options += ov_options(fp32_path, qdq_path, calib, fresh, refs, args.threads)
        interleaved(options, args.rounds, args.budget)
    base_t = options[0].times
    print(f"\n### {key}: {what}")
    print("| option | best ms | vs ORT fp32 best (median) | rounds ms | notes |\n"
          "|---|---:|---:|---|---|")
    for o in options:
        r = ratio(base_t, o.times)
        print(f"| {o.name} | {min(o.times) * 1e3:.2f} | {r[0]:.2f}x ({r[1]:.2f}x) | "
              f"{' '.join(f'{t * 1e3:.1f}' for t in o.times)} | {o.note} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join([*TORCH, *PUBLISHED]))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--budget", type=float, default=1.0, help="seconds per best-of sample")
    ap.add_argument("--calib", type=int, default=8)
    ap.add_argument("--fresh", type=int, default=2)
    ap.add_argument("--all-convs", action="store_true", help="QDQ the depthwise convs too")
    ap.add_argument("--no-openvino", action="store_true")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    host = host_cpu_profile()
    rr = int8_scheme(host, "int8_static").reduce_range
    print(f"# {machine(args.threads)}\n# graphopt host profile: {host.display_name}; "
          f"static INT8 reduce_range={rr}; rounds {args.rounds}, {args.budget} s per sample, "
          f"calibration {args.calib} N(0,1) batches, accuracy on {args.fresh} fresh batches",
          flush=True)
    for key in args.models.split(","):
        try:
            bench(key, args, rr)
        except Exception as e:  # one model's failure must not end the run
            print(f"\n### {key}: failed: {type(e).__name__}: {str(e)[:300]}", flush=True)


if __name__ == "__main__":
    main()
