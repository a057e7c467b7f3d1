"""What ``bench_host_peers.py`` and ``bench_published_peers.py`` share: the machine header, the
tolerance check, the peers that run an ONNX file (ONNX Runtime fp32 and ``quantize_dynamic``,
OpenVINO at its default precision and with NNCF's INT8 weight compression) and the timing
(interleaved rounds, order rotated, best-of per round, paired ratios).

Every peer is checked against the reference output (eager fp32, or ONNX Runtime fp32 on the
original file) at graphopt's tolerance for the precision it runs
(``graphopt.decisions.tolerance.tolerance_for``); fp32 ones at graphopt's deploy check's
reordering floor (1e-4 of scale, cosine 0.9999: another engine sums in another order). A peer
outside it is printed with its error and not counted; one that cannot run (a package missing,
a compile failing) is printed with the reason and left out.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import logging
import math
import os
import platform
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from graphopt.errors import first_line  # the product's own: "Type: first line"

_ISA = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8", "amx_bf16")
#: graphopt's deploy check (api/deploy.py) allows this much reordering whatever the budget
REORDER = (1e-4, 0.9999)


# ------------------------------------------------------------------------------ machine
def _version(module: str) -> str:
    try:
        return __import__(module).__version__.split("-")[0]
    except ImportError:
        return "not installed"


def machine(threads: int) -> str:
    try:
        from two_trees import cpu_model

        cpu = cpu_model()
    except ImportError:
        cpu = platform.processor() or platform.machine()
    try:
        flags = next((ln.split(":", 1)[1].split() for ln in
                      Path("/proc/cpuinfo").read_text().splitlines()
                      if ln.startswith(("flags", "Features"))), [])
    except OSError:
        flags = []
    isa = " ".join(f for f in _ISA if f in flags) or "none of " + " ".join(_ISA)
    versions = ", ".join(f"{m} {_version(m)}" for m in
                         ("torch", "onnxruntime", "openvino", "nncf", "transformers"))
    return (f"{cpu}, {os.cpu_count()} logical CPUs, ISA: {isa}; {threads} threads; {versions}, "
            f"{platform.python_implementation()} {platform.python_version()}")


# ------------------------------------------------------------------------------ numerics
def _arrays(x: Any) -> list[np.ndarray]:
    if isinstance(x, (list, tuple)):
        return [a for item in x for a in _arrays(item)]
    if hasattr(x, "detach"):  # a torch tensor (any dtype: bf16 is cast to float)
        return [x.detach().float().numpy()]
    return [np.asarray(x)]


def compare(ref: Any, out: Any) -> tuple[float, float]:
    """(max |ref - out| / max |ref|, cosine) of the worst output against the reference; one
    array or tensor, or a list of them in the same order (``out``'s first ``len(ref)``)."""
    refs, outs = _arrays(ref), _arrays(out)
    if len(outs) < len(refs):
        return math.inf, 0.0
    worst = (0.0, 1.0)
    for a, b in zip(refs, outs[:len(refs)], strict=True):
        r, o = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
        if r.shape != o.shape:
            return math.inf, 0.0
        norms = float(np.linalg.norm(r) * np.linalg.norm(o))
        cosine = float(r @ o) / norms if norms > 0 else float(np.array_equal(r, o))
        rel = float(np.abs(r - o).max() / max(np.abs(r).max(), 1e-30)) if r.size else 0.0
        worst = (max(worst[0], rel), min(worst[1], cosine))
    return worst


def within(err: tuple[float, float], rel_to_scale: float, min_cosine: float) -> bool:
    return err[0] <= rel_to_scale and (err[1] >= min_cosine or err[0] == 0.0)


def budget(precision: str) -> tuple[float, float]:
    """(max error / scale, min cosine) graphopt allows an artifact at ``precision``; fp32 at the
    deploy check's reordering floor."""
    from graphopt.decisions.tolerance import tolerance_for

    tol = tolerance_for(precision)
    if precision == "fp32":
        return max(tol.rel_to_scale, REORDER[0]), min(tol.min_cosine, REORDER[1])
    return tol.rel_to_scale, tol.min_cosine


def checked(ref: Any, out: Any, precision: str) -> tuple[bool, str]:
    """(within ``precision``'s budget, the note saying the error and the budget)."""
    err = compare(ref, out)
    tol = budget(precision)
    ok = within(err, *tol)
    return ok, (f"err {err[0]:.3g} cos {err[1]:.6f} ({precision} tolerance {tol[0]:g} / "
                f"{tol[1]:g}{'' if ok else ': OUT, not counted'})")


# ------------------------------------------------------------------------------ options
@dataclass
class Option:
    name: str
    fn: Callable[[], Any] | None  # None: not timed (its note says why)
    note: str = ""
    peer: bool = True  # counted among the peers graphopt is compared with
    times: list[float] = field(default_factory=list)  # best seconds per round
    #: entered around the option's calls in each round (graphopt's runtime settings)
    context: Callable[[], AbstractContextManager[Any]] | None = None


def session(model: onnx.ModelProto | str | Path, threads: int) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    src = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


def ort_fp32(path: Path, feeds: dict[str, np.ndarray], ref: Any, threads: int,
             prefix: str = "") -> tuple[Option, list[np.ndarray]]:
    """ONNX Runtime on the fp32 file (``ref`` None: its output is the reference), and its
    outputs."""
    sess = session(path, threads)
    out = sess.run(None, feeds)
    ok, note = (True, "the reference") if ref is None else checked(ref, out, "fp32")
    return Option("ORT fp32", lambda: sess.run(None, feeds), prefix + note, peer=ok), out


def ort_int8(src: Path, dst: Path, feeds: dict[str, np.ndarray], ref: Any,
             threads: int) -> Option:
    """``quantize_dynamic`` of ``src`` (per-channel QInt8 weights, ORT's default op types)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    try:
        start = time.perf_counter()
        quantize_dynamic(str(src), str(dst), per_channel=True, weight_type=QuantType.QInt8)
        seconds = time.perf_counter() - start
        sess = session(dst, threads)
        ok, note = checked(ref, sess.run(None, feeds), "int8")
    except Exception as e:
        return Option("ORT int8 dyn", None, f"quantize failed: {first_line(e)}", peer=False)
    return Option("ORT int8 dyn", lambda: sess.run(None, feeds),
                  f"quantize {seconds:.1f} s; {note}", peer=ok)


# ------------------------------------------------------------------------------ OpenVINO
def _ov_option(name: str, model: Any, feeds: dict[str, np.ndarray], ref: Any, threads: int,
               precision: str | None, prefix: str) -> Option:
    """``model`` (an ``openvino.Model``) compiled for the CPU with ``threads`` inference threads
    and nothing else set; checked at ``precision``'s budget, else at the one the compiled model
    reports (bf16 or fp32)."""
    import openvino as ov

    start = time.perf_counter()
    compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": threads})
    seconds = time.perf_counter() - start
    hint = compiled.get_property("INFERENCE_PRECISION_HINT")
    hint = hint.to_string() if hasattr(hint, "to_string") else str(hint)
    runs = "bf16" if "bf16" in hint else "fp16" if "f16" in hint else "fp32"
    request = compiled.create_infer_request()
    fn = lambda: request.infer(feeds, share_inputs=True)  # noqa: E731
    out = [np.asarray(o) for o in fn().to_tuple()]
    ok, note = checked(ref, out, precision or runs)
    props = ", ".join(f"{p.lower()} {compiled.get_property(p)}" for p in
                      ("PERFORMANCE_HINT", "NUM_STREAMS", "INFERENCE_NUM_THREADS"))
    return Option(name, fn, f"{prefix}compile {seconds:.1f} s; runs {hint} ({props}); {note}",
                  peer=ok)


def _weight_like(op: Any) -> bool:
    """An 8-bit constant holding more than one value per output channel: a weight, not a zero
    point."""
    shape = list(op.get_output_shape(0))
    return len(shape) >= 2 and math.prod(shape) > shape[0]


def openvino_peers(path: Path, feeds: dict[str, np.ndarray], ref: Any,
                   threads: int) -> list[Option]:
    """OpenVINO on the fp32 ONNX file at its default inference precision (bf16 where the CPU
    has it natively, else f32), and with ``nncf.compress_weights`` (INT8 weights, NNCF's
    default INT8_ASYM mode; checked at graphopt's int8 budget)."""
    try:
        import openvino as ov
    except ImportError as e:
        why = f"cannot run: {first_line(e)}"
        return [Option("OpenVINO", None, why, peer=False),
                Option("OpenVINO int8w", None, why, peer=False)]
    out = []
    try:
        out.append(_ov_option("OpenVINO", ov.Core().read_model(str(path)), feeds, ref,
                              threads, None, ""))
    except Exception as e:
        out.append(Option("OpenVINO", None, f"failed: {first_line(e)}", peer=False))
    try:
        import nncf
    except ImportError as e:
        return out + [Option("OpenVINO int8w", None, f"cannot run: {first_line(e)}", peer=False)]
    try:
        nncf.set_log_level(logging.ERROR)  # its bit-width table
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):  # and its progress bar
            model = nncf.compress_weights(ov.Core().read_model(str(path)),
                                          mode=nncf.CompressWeightsMode.INT8_ASYM)
        n = sum(1 for op in model.get_ops() if op.get_type_name() == "Constant"
                and op.get_element_type() in (ov.Type.u8, ov.Type.i8) and _weight_like(op))
        prefix = f"compress_weights {time.perf_counter() - start:.1f} s ({n} weights INT8); "
        out.append(_ov_option("OpenVINO int8w", model, feeds, ref, threads, "int8", prefix))
    except Exception as e:
        out.append(Option("OpenVINO int8w", None, f"failed: {first_line(e)}", peer=False))
    return out


# ------------------------------------------------------------------------------ timing
#: a warm-up call slower than this: the option is out of contention, one timed call a round
SLOW_CALL_S = 2.0


def best_of(fn: Callable[[], Any], budget_s: float, min_calls: int = 3) -> float:
    """Fastest of repeated calls after one warm-up: at least ``min_calls`` (one where the
    warm-up took over :data:`SLOW_CALL_S`: a bf16 model on a CPU without bf16), for
    ``budget_s``."""
    start = time.perf_counter()
    fn()
    if time.perf_counter() - start > SLOW_CALL_S:
        min_calls = 1
    gc.collect()
    gc.disable()
    try:
        best, calls, start = math.inf, 0, time.perf_counter()
        while calls < min_calls or time.perf_counter() - start < budget_s:
            t = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t)
            calls += 1
    finally:
        gc.enable()
    return best


def interleaved(options: list[Option], rounds: int, budget_s: float) -> None:
    """One best-of sample per option per round into ``option.times``, order rotated."""
    import torch

    timed = [o for o in options if o.fn is not None]
    with torch.inference_mode():
        for r in range(rounds):
            k = r % len(timed)
            for o in timed[k:] + timed[:k]:
                with o.context() if o.context is not None else nullcontext():
                    o.times.append(best_of(o.fn, budget_s))  # type: ignore[arg-type]


def ratio(base: Sequence[float], other: Sequence[float]) -> tuple[float, float]:
    """(best base / best other, median of the paired per-round ratios); > 1: other faster."""
    return min(base) / min(other), statistics.median(
        b / o for b, o in zip(base, other, strict=True))


def fmt(r: tuple[float, float] | None) -> str:
    return "-" if r is None else f"{r[0]:.2f}x ({r[1]:.2f}x)"


def print_notes(options: list[Option]) -> None:
    for o in options:
        if o.note:
            print(f"  {o.name}: {o.note}", flush=True)


def print_table(options: list[Option], first: str) -> None:
    """The per-option table: best ms, speed-ups over ``first`` (and ORT fp32), rounds."""
    by = {o.name: o for o in options}
    bases = [by[n] for n in dict.fromkeys((first, "ORT fp32")) if n in by]
    print(f"\n| option | best ms | {' | '.join(f'vs {b.name}' for b in bases)} | rounds ms |\n"
          f"|---|---:|{'---:|' * len(bases)}---|")
    for o in options:
        if not o.times:
            print(f"| {o.name} (not run) | - | {' | '.join('-' for _ in bases)} | - |")
            continue
        tag = "" if o.peer or o.name == "graphopt" else " (not counted)"
        vs = " | ".join(fmt(ratio(b.times, o.times) if b.times else None) for b in bases)
        print(f"| {o.name}{tag} | {min(o.times) * 1e3:.1f} | {vs} | "
              f"{' '.join(f'{t * 1e3:.1f}' for t in o.times)} |")
    print(flush=True)


def against_peers(options: list[Option], rounds: int) -> dict[str, Any]:
    """graphopt's speed-ups over the best counted peer (per round: the fastest peer of that
    round) and over ORT fp32, with the best peer's name; None where either is missing."""
    by = {o.name: o for o in options}
    row: dict[str, Any] = {"peers": None, "ort": None, "best_peer": "-"}
    peers = [o for o in options if o.peer and o.times]
    go, ort32 = by.get("graphopt"), by.get("ORT fp32")
    if go is None or not go.times or not peers:
        return row
    row["best_peer"] = min(peers, key=lambda o: min(o.times)).name
    per_round = [min(o.times[r] for o in peers) for r in range(rounds)]
    row["peers"] = ratio(per_round, go.times)
    if ort32 is not None and ort32.times:
        row["ort"] = ratio(ort32.times, go.times)
    return row


def bench_args(doc: str, models: Sequence[str],
               more: Callable[[argparse.ArgumentParser], None]) -> tuple[Any, list[str], float]:
    """The peer benchmarks' shared command line (``more`` adds a script's own flags): the
    parsed arguments, the models asked for (checked), and the per-round time budget."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--models", default=",".join(models),
                    help=f"comma-separated, from {','.join(models)}")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 5)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--quick", action="store_true", help="2 rounds of 0.2 s: a smoke run")
    ap.add_argument("--skip-graphopt", action="store_true",
                    help="time the peers only (no graphopt.optimize)")
    ap.add_argument("--no-openvino", action="store_true", help="leave out the OpenVINO peers")
    more(ap)
    args = ap.parse_args()
    args.rounds = args.rounds or (2 if args.quick else 5)
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in names:
        if m not in models:
            raise SystemExit(f"unknown model {m!r}; choose from {', '.join(models)}")
    return args, names, 0.2 if args.quick else 0.5


def quiet_and_say_how(args: Any, budget_s: float) -> None:
    """Library warnings off (the quantizer's, ORT's serialization), then the machine and the
    timing method, the header of every run."""
    ort.set_default_logger_severity(3)
    logging.getLogger().setLevel(logging.ERROR)
    warnings.simplefilter("ignore")
    print(f"machine: {machine(args.threads)}")
    print(f"timing: {args.rounds} interleaved rounds, best-of {budget_s} s (>= 3 calls) per "
          "option per round; ms of the best round; ratios: best rounds (median of paired "
          "rounds)", flush=True)


def artifact_verdict(info: Any, session: Any, ref: Any, out: Any
                     ) -> tuple[tuple[float, float], tuple[float, float], str]:
    """(error, tolerance, verdict) of graphopt's artifact against the reference, at the budget
    its own report states (``info``: ``opt.info`` or ``opt.onnx_info``; an OpenVINO session at
    bf16 gets bf16's), and at the deploy check's reorder floor when only that holds."""
    tol = (float(info.tolerance.rel_to_scale), float(info.tolerance.min_cosine))
    if getattr(session, "precision", None) == "bf16":  # OpenVINO at bf16: that budget
        tol = max(tol, budget("bf16"))
    err = compare(ref, out)
    verdict = "within"
    if not within(err, *tol):
        # graphopt's deploy check allows a compiler's or exporter's reordering on top
        floor = (max(tol[0], REORDER[0]), min(tol[1], REORDER[1]))
        verdict = (f"within only at the deploy check's reorder floor {floor[0]:g} / "
                   f"{floor[1]:g}" if within(err, *floor) else "OUT OF TOLERANCE")
    return err, tol, verdict
