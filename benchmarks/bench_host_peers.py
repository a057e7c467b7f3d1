"""graphopt's deployed artifact against the ways one would otherwise run a model on this CPU.

Six models with random weights (seeded; batch 1; transformers configs, nothing downloaded):
BERT-base and GPT-2 with 4 layers at 128 tokens, a Llama (hidden 1024, 4 layers, 16 heads / 4
KV heads, vocab 32000) at 128 tokens, ViT-base with 4 layers, ConvNeXt-T and ResNet-50 at
224x224. Attention is transformers' default (SDPA). Per model, on the same inputs and with
the same thread count for every runtime:

* ``eager``: the model as is, under ``torch.inference_mode()``;
* ``torch.compile``: ``torch.compile(model)`` (inductor), compiled before timing (its compile
  seconds are shown: seconds when inductor's on-disk cache is warm from an earlier run, tens
  of seconds cold); a failure is printed and the column left empty;
* ``ORT fp32``: an ONNX Runtime CPU session (``ORT_ENABLE_ALL``) on the model's ONNX export
  (graphopt's exporter: the TorchScript one at opset 17, checked against torch; the exporter
  used is printed);
* ``ORT int8 dyn``: ``quantize_dynamic`` of that export (int8 per-channel weights, ORT's default
  op types), same session settings. A peer only where its output stays within graphopt's INT8
  tolerance against eager fp32 (``tolerance_for("int8")``: max |ref - out| <= 5% of max |ref|,
  cosine >= 0.999); its error is printed either way;
* ``graphopt``: the artifact ``graphopt.optimize(model, inputs, target="cpu").deployed()``
  recommends (torch, torch.compile or onnxruntime), timed as the peers are (an ONNX Runtime
  session on numpy feeds built once) and checked against eager at the tolerance graphopt
  reports; the seconds ``optimize`` took are shown. A torch artifact runs under
  ``opt.runtime()`` (the settings graphopt measured it under, printed); a session keeps
  graphopt's own session config (its intra-op threads printed).

Why: graphopt's CPU recommendation is only worth taking if it is at least as fast as what a
user gets from the obvious alternatives. Done-when targets, marked in the summary: graphopt
>= 0.97x the best peer and >= 1.0x ORT fp32 on every model, >= 1.5x ORT fp32 on BERT and Llama.

Timing: interleaved rounds, the order of the options rotated every round; in a round each
option runs once to warm up, then best-of-n for a time budget (0.5 s, at least 3 calls), with
a full garbage collection before and the collector off during it. Per option the best round
(the least disturbed, on a shared machine the steadier statistic); ratios are speed-ups (> 1:
faster than the reference) of best rounds, the median of the paired per-round ratios in
brackets. The machine (CPU model, ISA flags, threads, versions) heads the output.

Run: ``python benchmarks/bench_host_peers.py [--models bert,gpt2,llama,vit,convnext,resnet]
[--rounds 5] [--threads T] [--quick] [--skip-graphopt]`` (``--quick``: 2 rounds of 0.2 s, a
smoke run). The full run is ~10-20 minutes on 2 cores, most of it compiling and optimizing.
"""

from __future__ import annotations

import argparse
import gc
import logging
import math
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.arch_zoo import LastHidden, MaskedEncoder  # noqa: E402 - the zoo's wrappers

MODELS = ("bert", "gpt2", "llama", "vit", "convnext", "resnet")
SEQ = 128
IMAGE = 224
_ISA = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8", "amx_bf16")
#: done-when targets: graphopt / ORT fp32 at least this on these models (1.0 on the others)
_ORT_TARGET = {"bert": 1.5, "llama": 1.5}
_PEER_TARGET = 0.97  # graphopt / best peer, every model
#: graphopt's deploy check (api/deploy.py) allows this much reordering whatever the budget
_REORDER_REL = 1e-4


# ------------------------------------------------------------------------------ machine
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
    import transformers

    return (f"{cpu}, {os.cpu_count()} logical CPUs, ISA: {isa}; {threads} threads; "
            f"torch {torch.__version__}, onnxruntime {ort.__version__}, "
            f"transformers {transformers.__version__}, "
            f"{platform.python_implementation()} {platform.python_version()}")


# ------------------------------------------------------------------------------ models
class Vision(nn.Module):
    """``model(pixel_values).<field>`` as a plain tensor, flattened to (batch, features) for
    pooled outputs."""

    def __init__(self, model: nn.Module, field: str = "last_hidden_state") -> None:
        super().__init__()
        self.model, self.field = model, field

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        out = getattr(self.model(pixel_values=pixel_values, return_dict=True), self.field)
        return out.flatten(1) if self.field == "pooler_output" else out


def build(name: str) -> tuple[nn.Module, tuple[torch.Tensor, ...], str]:
    """(model in eval mode, example inputs, description) for one of :data:`MODELS`."""
    import transformers as tf

    torch.manual_seed(0)  # the weights
    g = torch.Generator().manual_seed(1)  # the inputs
    ids = torch.randint(0, 30000, (1, SEQ), generator=g)
    image = torch.randn(1, 3, IMAGE, IMAGE, generator=g)
    sdpa = {"attn_implementation": "sdpa"}
    model: nn.Module
    if name == "bert":
        model = MaskedEncoder(tf.BertModel(tf.BertConfig(num_hidden_layers=4, **sdpa)))
        inputs: tuple[torch.Tensor, ...] = (ids, torch.ones_like(ids))
        what = f"BERT-base, 4 layers, seq {SEQ}"
    elif name == "gpt2":
        model = LastHidden(tf.GPT2Model(tf.GPT2Config(n_layer=4, use_cache=False, **sdpa)),
                           cache=True)
        inputs, what = (ids,), f"GPT-2, 4 layers, seq {SEQ}"
    elif name == "llama":
        config = tf.LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
                                num_attention_heads=16, num_key_value_heads=4, vocab_size=32000,
                                use_cache=False, **sdpa)
        model = LastHidden(tf.LlamaModel(config), cache=True)
        inputs, what = (ids,), f"Llama, hidden 1024, 4 layers, 16/4 heads, seq {SEQ}"
    elif name == "vit":
        model = Vision(tf.ViTModel(tf.ViTConfig(num_hidden_layers=4, **sdpa)))
        inputs, what = (image,), f"ViT-base, 4 layers, {IMAGE}x{IMAGE}"
    elif name == "convnext":
        model = Vision(tf.ConvNextModel(tf.ConvNextConfig()), "pooler_output")
        inputs, what = (image,), f"ConvNeXt-T, {IMAGE}x{IMAGE}"
    elif name == "resnet":
        model = Vision(tf.ResNetModel(tf.ResNetConfig()), "pooler_output")
        inputs, what = (image,), f"ResNet-50, {IMAGE}x{IMAGE}"
    else:
        raise SystemExit(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    return model.eval(), inputs, what


# ------------------------------------------------------------------------------ numerics
def compare(ref: np.ndarray, out: Any) -> tuple[float, float]:
    """(max |ref - out| / max |ref|, cosine) of one output against the eager fp32 one."""
    if isinstance(out, torch.Tensor):
        out = out.detach().float().numpy()
    r, o = ref.astype(np.float64).ravel(), np.asarray(out, dtype=np.float64).ravel()
    if r.shape != o.shape:
        return math.inf, 0.0
    norms = float(np.linalg.norm(r) * np.linalg.norm(o))
    cosine = float(r @ o) / norms if norms > 0 else float(np.array_equal(r, o))
    return float(np.abs(r - o).max() / max(np.abs(r).max(), 1e-30)), cosine


def within(err: tuple[float, float], rel_to_scale: float, min_cosine: float) -> bool:
    return err[0] <= rel_to_scale and (err[1] >= min_cosine or err[0] == 0.0)


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


def session(model: onnx.ModelProto | str, threads: int) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    src = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:200]


def compiled(model: nn.Module, inputs: tuple[torch.Tensor, ...], ref: np.ndarray) -> Option:
    try:
        fn = torch.compile(model)
        start = time.perf_counter()
        with torch.inference_mode():
            out = fn(*inputs)
        seconds = time.perf_counter() - start
        err = compare(ref, out)
    except Exception as e:  # any compile failure: the column stays empty
        return Option("torch.compile", None, f"failed: {first_line(e)}")
    return Option("torch.compile", lambda: fn(*inputs),
                  f"compile {seconds:.1f} s; err {err[0]:.2g} cos {err[1]:.6f}")


def ort_peers(model: nn.Module, inputs: tuple[torch.Tensor, ...], ref: np.ndarray,
              threads: int, tmp: Path) -> list[Option]:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from graphopt.decisions.tolerance import tolerance_for
    from graphopt.frontends.onnx_export import export_torch

    try:
        start = time.perf_counter()
        exported = export_torch(model, inputs, opset=17)
        export_s = time.perf_counter() - start
    except Exception as e:
        why = f"export failed: {first_line(e)}"
        return [Option("ORT fp32", None, why), Option("ORT int8 dyn", None, why, peer=False)]
    feeds = exported.feeds  # numpy, built once
    fp32 = session(exported.model, threads)
    err = compare(ref, fp32.run(None, feeds)[0])
    out = [Option("ORT fp32", lambda: fp32.run(None, feeds),
                  f"{exported.exporter} export {export_s:.1f} s; err {err[0]:.2g} "
                  f"cos {err[1]:.6f}")]
    src, dst = tmp / "fp32.onnx", tmp / "int8.onnx"
    onnx.save(exported.model, str(src))
    del exported
    try:
        start = time.perf_counter()
        quantize_dynamic(str(src), str(dst), per_channel=True, weight_type=QuantType.QInt8)
        quant_s = time.perf_counter() - start
        int8 = session(str(dst), threads)
    except Exception as e:
        return out + [Option("ORT int8 dyn", None, f"quantize failed: {first_line(e)}",
                             peer=False)]
    tol = tolerance_for("int8")
    err = compare(ref, int8.run(None, feeds)[0])
    ok = within(err, tol.rel_to_scale, tol.min_cosine)
    note = (f"quantize {quant_s:.1f} s; err {err[0]:.3f} cos {err[1]:.6f} (tolerance "
            f"{tol.rel_to_scale:g} / {tol.min_cosine:g})"
            + ("" if ok else " (out of tolerance, not counted)"))
    return out + [Option("ORT int8 dyn", lambda: int8.run(None, feeds), note, peer=ok)]


def graphopt_option(model: nn.Module, inputs: tuple[torch.Tensor, ...],
                    ref: np.ndarray) -> tuple[Option, str | None]:
    """graphopt's recommended artifact, and its name (None when optimize failed). A torch
    artifact runs under ``opt.runtime()``, the settings graphopt runs and measures it under."""
    import graphopt

    try:
        start = time.perf_counter()
        opt = graphopt.optimize(model, inputs, target="cpu")
        seconds = time.perf_counter() - start
        run = opt.deployed()
        context = None
        if run.session is not None:
            sess, feeds = run.session, run.feeds(*inputs)  # numpy, built once
            fn: Callable[[], Any] = lambda: sess.run(None, feeds)  # noqa: E731
            threads = sess.get_session_options().intra_op_num_threads
            out = fn()[0]
            where = f"ORT intra-op threads {threads or 'default'}"
        else:
            module, context = run.module, opt.runtime
            fn = lambda: module(*inputs)  # noqa: E731
            with context() as applied, torch.inference_mode():
                out = fn()
                where = (f"torch threads {torch.get_num_threads()}, runtime settings "
                         f"{applied or 'none'}")
    except Exception as e:
        return Option("graphopt", None, f"failed: {first_line(e)}", peer=False), None
    # the artifact's own report: the ONNX model's (its passes, INT8 included) for a session,
    # the torch module's for torch and torch.compile
    info = opt.onnx_info if run.session is not None else opt.info
    section = "onnx_info" if run.session is not None else "info"
    tol = info.tolerance
    err = compare(ref, out)
    verdict = "within"
    if not within(err, tol.rel_to_scale, tol.min_cosine):
        # graphopt's deploy check allows a compiler's or exporter's reordering on top
        floor = (max(tol.rel_to_scale, _REORDER_REL), min(tol.min_cosine, 0.9999))
        verdict = (f"within only at the deploy check's reorder floor {floor[0]:g} / "
                   f"{floor[1]:g}" if within(err, *floor) else "OUT OF TOLERANCE")
    numerics = "; ".join(
        f"output {n.output}: max_abs {float(n.max_abs):.3g}, scale "
        f"{float(n.scale):.3g}, cosine {float(n.cosine):.6f}, within "
        f"{n.within}" for n in info.numerics)
    rows = ", ".join(f"{r.artifact} {r.seconds * 1e3:.1f} ms" if r.seconds else
                     f"{r.artifact} {r.error or 'not timed'}" for r in opt.deploy.candidates)
    passes = ", ".join(info.passes_applied) or "none"
    note = (f"artifact {run.artifact} (measured {opt.deploy.measured}: {rows}); optimize "
            f"{seconds:.1f} s; passes {passes}; {where}\n    vs eager: err {err[0]:.3g} cos "
            f"{err[1]:.6f}, {verdict} (its tolerance {tol.rel_to_scale:g} / "
            f"{tol.min_cosine:g}, opt.{section}); graphopt's numerics: {numerics}")
    return Option("graphopt", fn, note, peer=False, context=context), run.artifact


# ------------------------------------------------------------------------------ timing
def best_of(fn: Callable[[], Any], budget_s: float, min_calls: int = 3) -> float:
    """Fastest of repeated calls after one warm-up: at least ``min_calls``, for ``budget_s``."""
    fn()
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
    timed = [o for o in options if o.fn is not None]
    with torch.inference_mode():
        for r in range(rounds):
            k = r % len(timed)
            for o in timed[k:] + timed[:k]:
                with o.context() if o.context is not None else nullcontext():
                    o.times.append(best_of(o.fn, budget_s))  # type: ignore[arg-type]


def ratio(base: list[float], other: list[float]) -> tuple[float, float]:
    """(best base / best other, median of the paired per-round ratios); > 1: other faster."""
    return min(base) / min(other), statistics.median(
        b / o for b, o in zip(base, other, strict=True))


def _fmt(r: tuple[float, float] | None) -> str:
    return "-" if r is None else f"{r[0]:.2f}x ({r[1]:.2f}x)"


# ------------------------------------------------------------------------------ one model
def bench_model(name: str, args: argparse.Namespace, budget_s: float) -> dict[str, Any]:
    model, inputs, what = build(name)
    print(f"## {name}: {what} (load average {os.getloadavg()[0]:.1f})", flush=True)
    with torch.inference_mode():
        ref = model(*inputs).float().numpy()
    options = [Option("eager", lambda: model(*inputs))]
    options.append(compiled(model, inputs, ref))
    with tempfile.TemporaryDirectory(prefix="peers_") as d:
        options += ort_peers(model, inputs, ref, args.threads, Path(d))
    artifact = None
    if not args.skip_graphopt:
        go, artifact = graphopt_option(model, inputs, ref)
        options.append(go)
    for o in options:
        if o.note:
            print(f"  {o.name}: {o.note}", flush=True)
    interleaved(options, args.rounds, budget_s)

    by = {o.name: o for o in options}
    eager, ort32 = by["eager"], by["ORT fp32"]
    print("\n| option | best ms | vs eager | vs ORT fp32 | rounds ms |\n|---|---:|---:|---:|---|")
    for o in options:
        if not o.times:
            print(f"| {o.name} | - | - | - | - |")
            continue
        tag = "" if o.peer or o.name == "graphopt" else " (not counted)"
        print(f"| {o.name}{tag} | {min(o.times) * 1e3:.1f} | {_fmt(ratio(eager.times, o.times))}"
              f" | {_fmt(ratio(ort32.times, o.times) if ort32.times else None)} | "
              f"{' '.join(f'{t * 1e3:.1f}' for t in o.times)} |")
    print(flush=True)

    row: dict[str, Any] = {"model": name, "artifact": artifact, "peers": None, "ort": None}
    peers = [o for o in options if o.peer and o.times]
    go_opt = by.get("graphopt")
    if go_opt is not None and go_opt.times and peers:
        best_peer = min(peers, key=lambda o: min(o.times))
        per_round = [min(o.times[r] for o in peers) for r in range(args.rounds)]
        row["peers"] = ratio(per_round, go_opt.times)
        row["best_peer"] = best_peer.name
        if ort32.times:
            row["ort"] = ratio(ort32.times, go_opt.times)
    return row


def summary(rows: list[dict[str, Any]]) -> None:
    print("## summary: graphopt against its peers (speed-ups, > 1: graphopt faster)\n")
    print("| model | graphopt's artifact | best peer | graphopt / best peer (>= "
          f"{_PEER_TARGET}) | graphopt / ORT fp32 (target) |\n|---|---|---|---:|---:|")
    missed = []
    for r in rows:
        target = _ORT_TARGET.get(r["model"], 1.0)
        peer_ok = r["peers"] is not None and r["peers"][0] >= _PEER_TARGET
        ort_ok = r["ort"] is not None and r["ort"][0] >= target
        if not (peer_ok and ort_ok):
            missed.append(r["model"])
        print(f"| {r['model']} | {r['artifact'] or '-'} | {r.get('best_peer', '-')} | "
              f"{_fmt(r['peers'])} {'ok' if peer_ok else 'MISS'} | "
              f"{_fmt(r['ort'])} (>= {target}) {'ok' if ort_ok else 'MISS'} |")
    print(f"\ndone-when targets: {'missed on ' + ', '.join(missed) if missed else 'all met'} "
          f"({len(rows) - len(missed)} of {len(rows)} models met both)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS),
                    help=f"comma-separated, from {','.join(MODELS)}")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 5)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--quick", action="store_true", help="2 rounds of 0.2 s: a smoke run")
    ap.add_argument("--skip-graphopt", action="store_true",
                    help="time the peers only (no graphopt.optimize)")
    args = ap.parse_args()
    args.rounds = args.rounds or (2 if args.quick else 5)
    budget_s = 0.2 if args.quick else 0.5
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in names:
        if m not in MODELS:
            raise SystemExit(f"unknown model {m!r}; choose from {', '.join(MODELS)}")
    torch.set_num_threads(args.threads)
    ort.set_default_logger_severity(3)  # the quantizer's and ORT's serialization warnings
    logging.getLogger().setLevel(logging.ERROR)
    warnings.simplefilter("ignore")
    print(f"machine: {machine(args.threads)}")
    print(f"timing: {args.rounds} interleaved rounds, best-of {budget_s} s (>= 3 calls) per "
          "option per round; ms of the best round; ratios: best rounds (median of paired "
          "rounds)\n", flush=True)
    rows = []
    for m in names:
        rows.append(bench_model(m, args, budget_s))
        torch._dynamo.reset()  # the model's sessions and compiled code go before the next
        gc.collect()
    if not args.skip_graphopt:
        summary(rows)


if __name__ == "__main__":
    main()
