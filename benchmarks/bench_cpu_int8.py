"""CPU INT8 against fp32 on this machine, at real sizes (issue 21, item 1).

Two parts, each timed interleaved (ABC rounds, the order rotated every round, same inputs): the
ratio reported is fp32's best round / INT8's best round (the least disturbed round of each: on
a machine shared with other jobs the steadier statistic), with the median of the paired
per-round ratios in brackets; ``A/A`` is the same for fp32 against a second fp32 session, the
noise floor of the run. Depthwise convs (ConvNeXt's 7x7, MobileNetV2's 3x3) follow the dense
ones.

1. ``conv``: ONNX Runtime's two INT8 convolutions against its fp32 ``Conv``, on ResNet-50's
   convolutions (3x3 C->C and 1x1 C->4C at 56x56/64, 28x28/128, 14x14/256, 7x7/512) and on its
   bottleneck blocks (1x1 -> 3x3 -> 1x1 with ReLUs and the residual add), batch 1 and 8:
   * dynamic: ``quantize_dynamic(op_types=["Conv"])`` -> DynamicQuantizeLinear + ConvInteger;
   * static: ``quantize_static`` QDQ (per-channel int8 weights, uint8 activations calibrated on
     the input), which ORT fuses into ``QLinearConv`` (the kernel column counts them in the
     optimized graph). In a block, the activations between convs stay uint8.
2. ``gemm``: ``y = x W^T + b`` at transformer sizes and below, in torch (fp32 ``linear``, bf16
   where the CPU has it natively, and ``quantized::linear_dynamic``, the kernel graphopt's
   torch INT8 pass emits) and ORT (fp32 MatMul+Add, dynamic INT8 as graphopt's ONNX pass
   writes it), beside graphopt's predicted ratio (``cost.cpu_int8_cost``) on the host profile.

The machine (CPU model, ISA flags that decide the int8 path, threads, versions) heads the
output. Run: ``python benchmarks/bench_cpu_int8.py [--part conv|gemm|all] [--rounds N]
[--threads T] [--quick]``.
"""

from __future__ import annotations

import argparse
import logging
import platform
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
import torch
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from graphopt.hardware.detect import detect_cpu  # noqa: E402

_ISA = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8",
        "amx_bf16", "asimddp", "i8mm")
_STAGES = ((56, 64), (28, 128), (14, 256), (7, 512))  # ResNet-50: (H=W, bottleneck width)


def machine(threads: int) -> str:
    cpu = detect_cpu()
    isa = " ".join(f for f in _ISA if f in cpu.flags) or "none of " + " ".join(_ISA)
    return (f"{cpu.model} ({cpu.vendor}), {cpu.physical_cores} cores, ISA: {isa}; "
            f"{threads} threads; torch {torch.__version__}, onnxruntime {ort.__version__}, "
            f"{platform.python_implementation()} {platform.python_version()}")


# ------------------------------------------------------------------------------ timing
def _per_call(fn: Callable[[], Any], calls: int) -> float:
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t) / calls


def interleaved(fns: list[Callable[[], Any]], rounds: int, budget_s: float = 0.01
                ) -> list[list[float]]:
    """Per-call seconds of each function, one sample per round, rotating who goes first."""
    for fn in fns:  # warm up: allocator, thread pool, first-call kernel selection
        fn()
    one = max(_per_call(fn, 1) for fn in fns)
    calls = max(1, min(200, int(budget_s / max(one, 1e-7))))
    out: list[list[float]] = [[] for _ in fns]
    for r in range(rounds):
        order = list(range(len(fns)))
        order = order[r % len(fns):] + order[:r % len(fns)]
        for i in order:
            out[i].append(_per_call(fns[i], calls))
    return out


def ratio(base: list[float], other: list[float]) -> tuple[float, float]:
    """(best base / best other, median of the paired per-round ratios); > 1: other faster.

    The best (fastest) round of each is the one least disturbed by other jobs; on a shared
    machine it is the steadier of the two statistics, the paired median the check on it."""
    return min(base) / min(other), statistics.median(
        b / o for b, o in zip(base, other, strict=True))


# ------------------------------------------------------------------------------ ONNX models
def _session(model: onnx.ModelProto, threads: int, tmp: Path, name: str
             ) -> tuple[ort.InferenceSession, dict[str, int]]:
    """A CPU session at ORT's default optimization level, and the op types it runs."""
    path, optimized = tmp / f"{name}.onnx", tmp / f"{name}.opt.onnx"
    onnx.save(model, str(path))
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.optimized_model_filepath = str(optimized)
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    ops: dict[str, int] = {}
    for n in onnx.load(str(optimized)).graph.node:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    return sess, ops


def _conv(name: str, x: str, c_in: int, c_out: int, k: int, rng: np.random.Generator,
          inits: list[onnx.TensorProto], groups: int = 1) -> onnx.NodeProto:
    fan_in = c_in // groups * k * k
    w = rng.standard_normal((c_out, c_in // groups, k, k)) * (2 / fan_in) ** 0.5
    inits += [numpy_helper.from_array(w.astype(np.float32), f"{name}.w"),
              numpy_helper.from_array((rng.standard_normal(c_out) * 0.1).astype(np.float32),
                                      f"{name}.b")]
    return helper.make_node("Conv", [x, f"{name}.w", f"{name}.b"], [name], name=name,
                            pads=[k // 2] * 4, kernel_shape=[k, k], group=groups)


def conv_model(c_in: int, c_out: int, k: int, hw: int, batch: int, block: bool,
               seed: int = 0, groups: int = 1) -> onnx.ModelProto:
    """One conv, or a ResNet-50 bottleneck (``block``: 4C -> C 1x1, C 3x3, C -> 4C 1x1, ReLUs,
    residual add) with ``c_in`` = C."""
    rng = np.random.default_rng(seed)
    inits: list[onnx.TensorProto] = []
    if not block:
        nodes = [_conv("conv", "x", c_in, c_out, k, rng, inits, groups)]
        c_x, out = c_in, "conv"
    else:
        c, c_x = c_in, 4 * c_in
        nodes = [_conv("c1", "x", c_x, c, 1, rng, inits),
                 helper.make_node("Relu", ["c1"], ["r1"], name="r1"),
                 _conv("c2", "r1", c, c, 3, rng, inits),
                 helper.make_node("Relu", ["c2"], ["r2"], name="r2"),
                 _conv("c3", "r2", c, c_x, 1, rng, inits),
                 helper.make_node("Add", ["c3", "x"], ["sum"], name="add"),
                 helper.make_node("Relu", ["sum"], ["y"], name="r3")]
        c_out, out = c_x, "y"
    graph = helper.make_graph(
        nodes, "bench", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                       [batch, c_x, hw, hw])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, [batch, c_out, hw, hw])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _quantized(model: onnx.ModelProto, mode: str, feeds: list[dict[str, np.ndarray]],
               tmp: Path) -> onnx.ModelProto:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    src, dst = tmp / f"{mode}.src.onnx", tmp / f"{mode}.q.onnx"
    onnx.save(model, str(src))
    if mode == "dynamic":
        quantize_dynamic(str(src), str(dst), op_types_to_quantize=["Conv"], per_channel=True,
                         weight_type=QuantType.QInt8)
    else:
        class Reader(CalibrationDataReader):
            def __init__(self) -> None:
                self._it = iter(feeds)

            def get_next(self) -> dict[str, np.ndarray] | None:
                return next(self._it, None)

        quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ,
                        op_types_to_quantize=["Conv"], per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return onnx.load(str(dst))


def predicted_conv(model: onnx.ModelProto, profile: Any) -> float:
    """graphopt's fp32 / static-INT8 time ratio of the model's convs on ``profile``."""
    from graphopt.cost.cpu_int8_cost import cpu_int8_cost
    from graphopt.cost.roofline import estimate
    from graphopt.decisions.planner import build_plan
    from graphopt.frontends.onnx_frontend import load_onnx

    fp32 = int8 = 0.0
    for n in build_plan(load_onnx(model), profile).nodes:
        if n.op_type == "Conv":
            w = n.inputs[1].nbytes  # type: ignore[union-attr]
            fp32 += estimate(n.analysis, profile, "fp32").est_time_s
            int8 += cpu_int8_cost(n.analysis, profile, weight_bytes=w, weight_bits=32,
                                  act_bits=32, carrier_bits=32, method="static").total_s
    return fp32 / int8


def host_profile(threads: int) -> Any:
    """The datasheet host (int8 peak from its int8 path) with as many cores as threads."""
    from dataclasses import replace

    from graphopt.hardware.detect import build_host_profile, host_cpu_info

    return build_host_profile(replace(host_cpu_info(), physical_cores=threads))


def bench_conv(c: int, k: int, hw: int, batch: int, block: bool, rounds: int, threads: int,
               tmp: Path, depthwise: bool = False) -> dict[str, Any]:
    c_out = c if k != 1 or depthwise else 4 * c
    model = conv_model(c, c_out, k, hw, batch, block, groups=c if depthwise else 1)
    rng = np.random.default_rng(1)
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    feeds = [{"x": np.maximum(rng.standard_normal(shape), 0).astype(np.float32)}
             for _ in range(3)]  # post-ReLU activations, as every ResNet conv after the stem
    fp32, _ = _session(model, threads, tmp, "fp32")
    control, _ = _session(model, threads, tmp, "control")
    dyn, dyn_ops = _session(_quantized(model, "dynamic", feeds, tmp), threads, tmp, "dyn")
    sta, sta_ops = _session(_quantized(model, "static", feeds, tmp), threads, tmp, "static")
    x = feeds[0]
    ref = fp32.run(None, x)[0]
    errs = {name: float(np.abs(s.run(None, x)[0] - ref).max() / np.abs(ref).max())
            for name, s in (("dynamic", dyn), ("static", sta))}
    times = interleaved([lambda s=s: s.run(None, x) for s in (fp32, dyn, sta, control)], rounds)
    flops = 2 * batch * hw * hw * (c * c * 9 + 2 * c * 4 * c if block else
                                   c_out * k * k * (1 if depthwise else c))
    name = f"bottleneck {4 * c}-{c}-{c}-{4 * c}" if block else \
        f"{'depthwise ' if depthwise else ''}{k}x{k} {c}->{c_out}"
    return {"case": f"{name} @{hw}x{hw}", "batch": batch,
            "fp32_ms": min(times[0]) * 1e3, "fp32_gflops": flops / min(times[0]) / 1e9,
            "dynamic": ratio(times[0], times[1]), "static": ratio(times[0], times[2]),
            "aa": ratio(times[0], times[3]), "err": errs,
            "pred": predicted_conv(model, host_profile(threads)),
            "kernels": (f"{dyn_ops.get('ConvInteger', 0)} ConvInteger / "
                        f"{sta_ops.get('QLinearConv', 0)} QLinearConv")}


def run_conv(rounds: int, threads: int, quick: bool) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-int8-") as d:
        for hw, c in _STAGES[::2] if quick else _STAGES:
            for batch in (1,) if quick else (1, 8):
                for k, block in ((3, False), (1, False), (1, True)):
                    rows.append(bench_conv(c, k, hw, batch, block, rounds, threads, Path(d)))
                    print(_conv_row(rows[-1]), flush=True)
        # depthwise convs (ConvNeXt's 7x7, MobileNetV2's 3x3): no reduction over channels
        for c, k, hw in () if quick else ((96, 7, 56), (384, 7, 14), (144, 3, 56)):
            for batch in (1, 8):
                rows.append(bench_conv(c, k, hw, batch, False, rounds, threads, Path(d),
                                       depthwise=True))
                print(_conv_row(rows[-1]), flush=True)
    return rows


def _fmt(r: tuple[float, float]) -> str:
    return f"{r[0]:.2f}x ({r[1]:.2f}x)"


def _conv_row(r: dict[str, Any]) -> str:
    return (f"| {r['case']} | {r['batch']} | {r['fp32_ms']:.2f} ({r['fp32_gflops']:.0f} GFLOP/s)"
            f" | {_fmt(r['dynamic'])} | {_fmt(r['static'])} | {r['pred']:.2f}x | {_fmt(r['aa'])} | "
            f"{r['err']['dynamic']:.3f} / {r['err']['static']:.3f} | {r['kernels']} |")


CONV_HEADER = ("| conv (ONNX, NCHW) | batch | fp32 ms | fp32 / dynamic (ConvInteger) | "
               "fp32 / static (QLinearConv) | predicted static | A/A | max err / scale dyn / "
               "static | kernels |\n|---|---:|---:|---:|---:|---:|---:|---:|---|")


# ------------------------------------------------------------------------------ GEMMs
_GEMMS = ((8, 64, 64), (32, 512, 512), (128, 768, 768), (128, 768, 3072), (128, 3072, 768),
          (128, 1024, 4096), (512, 1024, 1024), (16, 2048, 2048), (1, 4096, 4096))


def predicted(m: int, k: int, n: int, profile: Any) -> dict[str, float]:
    """graphopt's times for ``y = x W^T + b`` (M x K x N) on ``profile``: fp32, bf16 (where
    native), INT8 against an fp32 carrier and against a bf16 one (with the casts)."""
    from dataclasses import replace

    import graphopt
    from graphopt.cost.cpu_int8_cost import cpu_int8_cost
    from graphopt.cost.roofline import estimate

    plan = graphopt.plan(torch.nn.Linear(k, n), (torch.randn(m, k),), target=profile)
    a = next(nd for nd in plan.nodes if nd.op_type == "Linear").analysis
    w = 4 * k * n
    out = {"fp32": estimate(a, profile, "fp32").est_time_s}
    out["int8"] = cpu_int8_cost(a, profile, weight_bytes=w, weight_bits=32, act_bits=32,
                                carrier_bits=32).total_s
    if "bf16" in profile.peak_flops:
        half = replace(a, bytes_read=a.bytes_read // 2, bytes_written=a.bytes_written // 2)
        out["bf16"] = estimate(half, profile, "bf16").est_time_s
        out["int8_bf16"] = cpu_int8_cost(a, profile, weight_bytes=w, weight_bits=32,
                                         act_bits=32, carrier_bits=16).total_s
    return out


def _ort_linear(m: int, k: int, n: int, threads: int, tmp: Path, w: np.ndarray,
                b: np.ndarray) -> tuple[ort.InferenceSession, ort.InferenceSession]:
    """ORT fp32 MatMul + Add, and the dynamic INT8 graphopt's ONNX pass writes for it."""
    from graphopt.backends.onnx.quantize_ort import ort_dynamic_int8
    from graphopt.decisions.quantization.choice import int8_scheme
    from graphopt.hardware.detect import host_cpu_profile

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["mm"], name="mm"),
         helper.make_node("Add", ["mm", "b"], ["y"], name="add")], "gemm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
        [numpy_helper.from_array(np.ascontiguousarray(w.T), "w"),
         numpy_helper.from_array(b, "b")])
    fp32 = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    scheme = int8_scheme(host_cpu_profile(), "int8_dynamic")
    int8 = ort_dynamic_int8(fp32, ["mm"], reduce_range=scheme.reduce_range)
    return _session(fp32, threads, tmp, "g32")[0], _session(int8, threads, tmp, "g8")[0]


def bench_gemm(m: int, k: int, n: int, rounds: int, threads: int, tmp: Path,
               profile: Any) -> dict[str, Any]:
    from graphopt.backends.torch.quantize import pack_int8_weight

    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(m, k, generator=g), torch.randn(n, k, generator=g) / k ** 0.5,
               torch.randn(n, generator=g))
    packed = pack_int8_weight(w, b)
    fns: dict[str, Callable[[], Any]] = {
        "fp32": lambda: torch.nn.functional.linear(x, w, b),
        "int8": lambda: torch.ops.quantized.linear_dynamic(x, packed, True)}
    pred = predicted(m, k, n, profile)
    if "bf16" in pred:
        xb, wb, bb = x.bfloat16(), w.bfloat16(), b.bfloat16()
        fns["bf16"] = lambda: torch.nn.functional.linear(xb, wb, bb)
        fns["int8_bf16"] = lambda: torch.ops.quantized.linear_dynamic(
            xb.float(), packed, True).bfloat16()
    s32, s8 = _ort_linear(m, k, n, threads, tmp, w.numpy(), b.numpy())
    feed = {"x": x.numpy()}
    fns["ort_fp32"] = lambda: s32.run(None, feed)
    fns["ort_int8"] = lambda: s8.run(None, feed)
    with torch.inference_mode():
        times = dict(zip(fns, interleaved(list(fns.values()), rounds), strict=True))
    row: dict[str, Any] = {"gemm": f"{m}x{k}x{n}", "fp32_us": min(times["fp32"]) * 1e6,
                           "torch": ratio(times["fp32"], times["int8"]),
                           "ort": ratio(times["ort_fp32"], times["ort_int8"]),
                           "pred": pred["fp32"] / pred["int8"]}
    if "bf16" in pred:
        row["bf16"] = ratio(times["bf16"], times["int8_bf16"])
        row["pred_bf16"] = pred["bf16"] / pred["int8_bf16"]
    return row


def _gemm_row(r: dict[str, Any]) -> str:
    bf16 = (f" | {_fmt(r['bf16'])} | {r['pred_bf16']:.2f}x" if "bf16" in r else " | - | -")
    return (f"| {r['gemm']} | {r['fp32_us']:.1f} | {_fmt(r['torch'])} | {_fmt(r['ort'])} | "
            f"{r['pred']:.2f}x{bf16} |")


GEMM_HEADER = ("| M x K x N | torch fp32 us | torch fp32 / INT8 | ORT fp32 / INT8 | predicted | "
               "torch bf16 / INT8 with casts | predicted |\n|---|---:|---:|---:|---:|---:|---:|")


def run_gemm(rounds: int, threads: int, quick: bool) -> list[dict[str, Any]]:
    profile = host_profile(threads)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-int8-") as d:
        for m, k, n in _GEMMS[::3] if quick else _GEMMS:
            rows.append(bench_gemm(m, k, n, rounds, threads, Path(d), profile))
            print(_gemm_row(rows[-1]), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("conv", "gemm", "all"), default="all")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--quick", action="store_true", help="fewer sizes (a smoke run)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ort.set_default_logger_severity(3)  # the quantizers' and NCHWc serialization warnings
    logging.getLogger().setLevel(logging.ERROR)
    print(f"machine: {machine(args.threads)}\n")
    if args.part in ("conv", "all"):
        print(CONV_HEADER)
        run_conv(args.rounds, args.threads, args.quick)
        print()
    if args.part in ("gemm", "all"):
        print(GEMM_HEADER)
        run_gemm(args.rounds, args.threads, args.quick)


if __name__ == "__main__":
    main()
