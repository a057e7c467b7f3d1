"""``graphopt calibrate``: measure this machine's CPU and write a profile ``--target`` accepts.

The detected host profile (``detect``) is built from facts the OS states: cores, clock, ISA.
Three numbers it has to guess, and they decide most of a CPU plan:

1. **Per-op fixed cost.** In eager torch every op pays dispatch and allocation, 1-30 us
   depending on the op, before it does any work; a view pays it too. For small models this
   is most of the time. Each common op type is called on a small input (8-32 KB, the
   activations of a small model) and that time becomes the op's fixed cost. The ops run one call
   at a time in a mixed stream, all op types in a fresh random order each round, as in a
   model: an op repeated in a tight loop runs 2-3x faster than in a graph (its code, branch
   history and allocator blocks stay hot), so loop timings would understate every node.
   Each call is measured the way ``graphopt profile`` measures a node (torch.profiler's CPU
   time of the ATen ops it runs), so predictions and measurements share one clock; the
   profiler's own bookkeeping (about a microsecond per nested ATen call) is in both.
2. **Achievable compute.** One large fp32 matmul (bf16 too where the CPU has native bf16; the
   dynamic INT8 linear graphopt emits) and one conv give the FLOP/s GEMM and conv nodes
   reach: oneDNN/MKL/FBGEMM, the threads, the clock the machine really runs at.
3. **ONNX Runtime's per-node cost** per op type (``calibrate_ort``), for plans of ``.onnx``
   models: ORT pays a few microseconds per node where eager torch pays tens.
4. **Memory bandwidth.** ``a + b`` over arrays far larger than the last-level cache gives the
   DRAM bytes per second an elementwise kernel moves (read two, write one), replacing the
   ``6 GB/s per core`` estimate.

Each is the median of several timed loops. The profile is the detected one with these
measurements added (``HardwareProfile.op_overhead_s`` and ``measured_rates``), so
``cost.roofline`` uses them in place of its guesses. Measure on an idle machine, with the
threads the model will run with: both change every number here.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from graphopt.errors import GraphoptError
from graphopt.files.progress import progress
from graphopt.files.quiet import library_quiet
from graphopt.hardware.detect import host_cpu_profile
from graphopt.hardware.profile import HardwareProfile
from graphopt.hardware.profile_file import is_profile_path, save_profile
from graphopt.measure.calibrate_openvino import with_openvino_costs
from graphopt.measure.calibrate_ort import ort_fixed_costs
from graphopt.measure.calibrate_rates import achievable_rates, time_call
from graphopt.measure.calibrate_reference import (
    in_graph_factors,
    measure_blocks,
    reference_blocks,
)

__all__ = ["CALIBRATION_VERSION", "OP_BENCHES", "calibrate", "calibrate_host", "time_call"]

logger = logging.getLogger(__name__)

#: what a calibration measures and how; a change that moves its numbers bumps it, which
#: remakes every cached host calibration (``measure.host_cache``)
CALIBRATION_VERSION = 3

Bench = Callable[[], Callable[[], Any]]


class _Operands:
    """The inputs of the bench calls, made once, outside the timed loop, from one seeded
    generator. Shapes are small-model activations: 2 x 16 x 64 for sequence ops,
    2 x 16 x 16 x 16 for image ops (a tinier conv runs on one thread and misses the cost of
    waking the others, which every real conv pays). torch is imported only here."""

    def __init__(self) -> None:
        import torch
        import torch.nn.functional as F

        g = torch.Generator().manual_seed(0)

        def x(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=g)

        self.torch, self.F, self.aten = torch, F, torch.ops.aten
        self.a, self.b = x(2, 16, 64), x(2, 16, 64)
        self.img = x(2, 16, 16, 16)
        self.w, self.bias = x(64, 64), x(64)
        self.ids = torch.randint(0, 64, (2, 16), generator=g)
        self.q = x(2, 4, 16, 16)
        self.mask = self.a > 0
        self.causal = torch.ones(16, 16, dtype=torch.bool).tril()
        # the masks transformers passes: per batch, broadcast over heads; bool or additive
        self.batch_causal = self.causal.expand(2, 1, 16, 16).contiguous()
        self.additive = torch.zeros(2, 1, 16, 16).masked_fill(~self.batch_causal, -1e9)
        self.rows, self.cols = torch.arange(2)[:, None], torch.arange(16)[None, :]
        self.norm_w = x(64)
        self.conv_w, self.pointwise_w, self.depthwise_w = (x(16, 16, 3, 3), x(32, 16, 1, 1),
                                                           x(16, 1, 3, 3))
        self.bn = (x(16), x(16).abs() + 1, x(16), x(16))
        self.at = self.a.transpose(1, 2)
        self.strided = x(2, 64, 16).transpose(1, 2)


#: one bench: given the operands, the call to time
_Make = Callable[[_Operands], Callable[[], Any]]


def _binary(fn: str, tensor_scalar: bool = False) -> _Make:
    """``torch.<fn>`` on the operand layouts models give it, in turn: same shape, a broadcast
    row, a Python scalar (wrapped into a tensor on every call; ``tensor_scalar``: a 0-d
    tensor) and a strided view. Their costs differ up to 2.5x; the median over the four is the
    op's."""
    def make(o: _Operands) -> Callable[[], Any]:
        scalar = o.torch.tensor(0.5) if tensor_scalar else 0.5
        other = (o.a.flip(0), o.a[0, 0], scalar, o.strided)
        return _rotating([functools.partial(getattr(o.torch, fn), o.a, x) for x in other])
    return make


#: canonical op type -> its bench call on :class:`_Operands`
_BENCHES: dict[str, _Make] = {
    # views and aliases: dispatch only, no kernel
    "Reshape": lambda o: lambda: o.a.view(2, 16, 4, 16),
    "Reshape:copy": lambda o: lambda: o.at.reshape(2, 1024),  # strides allow no view
    "Transpose": lambda o: lambda: o.a.transpose(1, 2),
    "Unsqueeze": lambda o: lambda: o.a.unsqueeze(1),
    "Squeeze": lambda o: lambda: o.a[:1].squeeze(0),
    "Expand": lambda o: lambda: o.a[:, :1].expand(2, 16, 64),
    "Slice": lambda o: lambda: o.a[:, 2:10],
    "Flatten": lambda o: lambda: o.a.flatten(1),
    "Identity": lambda o: lambda: o.aten.to.dtype(o.a, o.torch.float32),  # a no-op cast
    "Dropout": lambda o: lambda: o.F.dropout(o.a, 0.1, training=False),
    "Split": lambda o: lambda: o.a.split(32, dim=-1),
    # elementwise
    "Cast": lambda o: lambda: o.a.to(o.torch.float64),
    "Add": _binary("add"),
    "Sub": _binary("sub"),
    "Mul": _binary("mul"),
    "Div": _binary("div"),
    "Pow": lambda o: lambda: o.a.pow(2),
    "Neg": lambda o: lambda: -o.a,
    "Abs": lambda o: lambda: o.a.abs(),
    "Rsqrt": lambda o: lambda: o.a.rsqrt(),
    "Sqrt": lambda o: lambda: o.a.sqrt(),
    "Exp": lambda o: lambda: o.a.exp(),
    "Log": lambda o: lambda: o.a.log(),
    "Erf": lambda o: lambda: o.a.erf(),
    "Sin": lambda o: lambda: o.a.sin(),
    "Cos": lambda o: lambda: o.a.cos(),
    "Tanh": lambda o: lambda: o.a.tanh(),
    "Sigmoid": lambda o: lambda: o.a.sigmoid(),
    "Relu": lambda o: lambda: o.a.relu(),
    "Gelu": lambda o: lambda: o.F.gelu(o.a),
    "Silu": lambda o: lambda: o.F.silu(o.a),
    "Clip": lambda o: lambda: o.a.clamp(-1, 1),
    "Equal": _binary("eq"),
    "Less": _binary("lt"),
    "LessOrEqual": _binary("le"),
    "Greater": _binary("gt"),
    "GreaterOrEqual": _binary("ge"),
    "And": lambda o: lambda: o.mask & o.mask,
    "Not": lambda o: lambda: ~o.mask,
    "Where": lambda o: lambda: o.torch.where(o.mask, o.a, o.b),
    "Min": _binary("minimum", tensor_scalar=True),
    "Max": _binary("maximum", tensor_scalar=True),
    # reductions and norms
    "ReduceMean": lambda o: lambda: o.a.mean(-1, keepdim=True),
    "ReduceSum": lambda o: lambda: o.a.sum(-1),
    "ReduceMax": lambda o: lambda: o.a.amax(-1),
    "CumSum": lambda o: lambda: o.mask.cumsum(-1),
    "Softmax": lambda o: lambda: o.a.softmax(-1),
    "LogSoftmax": lambda o: lambda: o.a.log_softmax(-1),
    "LayerNormalization": lambda o: lambda: o.F.layer_norm(o.a, (64,), o.norm_w, o.norm_w),
    "RMSNormalization": lambda o: lambda: o.F.rms_norm(o.a, (64,), o.norm_w),
    "BatchNormalization": lambda o: lambda: o.F.batch_norm(o.img, *o.bn, training=False),
    "GroupNormalization": lambda o: lambda: o.F.group_norm(o.img, 2),
    "MaxPool": lambda o: lambda: o.F.max_pool2d(o.img, 2),
    "AveragePool": lambda o: lambda: o.F.avg_pool2d(o.img, 2),
    "GlobalAveragePool": lambda o: lambda: o.F.adaptive_avg_pool2d(o.img, 1),
    "TopK": lambda o: lambda: o.a.topk(4, dim=-1),
    # GEMM-like
    "Linear": lambda o: lambda: o.F.linear(o.a, o.w, o.bias),
    "Gemm": lambda o: lambda: o.torch.addmm(o.bias, o.a[0], o.w),
    "MatMul": lambda o: lambda: o.torch.matmul(o.q, o.q.transpose(-1, -2)),
    "Conv": lambda o: lambda: o.F.conv2d(o.img, o.conv_w, padding=1),
    "Conv:1x1": lambda o: lambda: o.F.conv2d(o.img, o.pointwise_w),
    "Conv:depthwise": lambda o: lambda: o.F.conv2d(o.img, o.depthwise_w, padding=1, groups=16),
    # the mask forms models pass, in turn: 2-D bool, per-batch bool with a scale (transformers),
    # additive float, is_causal; 25-42 us here, the median is the op's
    "Attention": lambda o: _rotating([
        functools.partial(o.F.scaled_dot_product_attention, o.q, o.q, o.q, **kw)
        for kw in ({"attn_mask": o.causal}, {"attn_mask": o.batch_causal, "scale": 0.25},
                   {"attn_mask": o.additive}, {"is_causal": True})]),
    # data movement
    "Concat": lambda o: lambda: o.torch.cat([o.a, o.b], -1),
    "Gather": lambda o: _rotating([  # an embedding, advanced indexing, index_select
        lambda: o.F.embedding(o.ids, o.w), lambda: o.ids[o.rows, o.cols],
        lambda: o.w.index_select(0, o.ids[0])]),
    "GatherElements": lambda o: lambda: o.a.gather(-1, o.ids[..., None].expand(2, 16, 4)),
    "Pad": lambda o: lambda: o.F.pad(o.a, (0, 8)),
    "Range": lambda o: lambda: o.torch.arange(16),
    "ConstantOfShape": lambda o: lambda: o.a.new_ones(2, 16),
    "Copy": lambda o: lambda: o.at.contiguous(),
    "Tile": lambda o: lambda: o.a.repeat(1, 2, 1),
}


def _ops() -> dict[str, Bench]:
    """Canonical op type -> a builder of one small call of it (:data:`_BENCHES` on one set of
    :class:`_Operands`)."""
    o = _Operands()
    return {op: functools.partial(make, o) for op, make in _BENCHES.items()}


def _rotating(calls: list[Callable[[], Any]]) -> Callable[[], Any]:
    """One call that runs ``calls`` in turn, one per call."""
    turn = itertools.cycle(calls)
    return lambda: next(turn)()


#: the op types calibration times (``_ops`` builds them; torch is imported only then)
OP_BENCHES = tuple(_BENCHES)
#: op types that are views (no kernel): their in-model factor is fitted apart
VIEW_OPS = frozenset({"Reshape", "Transpose", "Unsqueeze", "Squeeze", "Expand", "Slice",
                      "Flatten", "Split"})
#: FLOPs of the GEMM-like bench calls (``_ops``), taken off their time at the measured rate
_BENCH_FLOPS = {"Linear": 2 * 32 * 64 * 64, "Gemm": 2 * 16 * 64 * 64,
                "MatMul": 2 * 8 * 16 * 16 * 16, "Attention": 4 * 8 * 16 * 16 * 16 // 2,
                "Conv": 2 * 2 * 16 * 16 * 16 * 16 * 9, "Conv:1x1": 2 * 2 * 16 * 16 * 32 * 16,
                "Conv:depthwise": 2 * 2 * 16 * 16 * 16 * 9}
#: op types whose median fixed cost stands in for an op type calibration did not time
_KERNEL_OPS = ("Add", "Sub", "Mul", "Div", "Neg", "Exp", "Tanh", "Sigmoid", "Relu", "Where")



#: the mixed stream and the reference blocks are measured in this many alternating chunks;
#: each op type keeps its fastest chunk's median (on a shared host a neighbour's burst of a
#: second or two otherwise lifts every number it overlaps)
_CHUNKS = 3

#: outputs kept alive in the mixed stream: a graph's intermediates live until their last
#: reader, so the allocator does not hand the same hot block back to every op
_LIVE = 16


def _fixed_costs(rounds: int, warmup: int = 5) -> dict[str, float]:
    """Op type -> median seconds of one call, timed in a mixed stream (module doc, item 1)
    and measured as ``graphopt profile`` measures a node: the CPU time torch.profiler gives
    the ATen ops under the call's range."""
    from torch.profiler import ProfilerActivity, profile, record_function

    from graphopt.measure.torch_runs import NODE_RANGE, node_times

    builders = _ops()
    calls = [(op, builders[op]()) for op in OP_BENCHES]
    order = random.Random(0)
    alive: list[Any] = [None] * _LIVE  # outputs stay alive a while, as a graph's do
    for _ in range(warmup):
        for _, call in calls:
            call()
    with library_quiet(), profile(activities=[ProfilerActivity.CPU]) as prof:
        for r in range(rounds):
            order.shuffle(calls)
            for i, (op, call) in enumerate(calls):
                with record_function(NODE_RANGE + op):
                    alive[(r + i) % _LIVE] = call()
    return {op: statistics.median(ts) for op, ts in node_times(prof).items()}


def calibrate(base: HardwareProfile | None = None, *, quick: bool = False,
              threads: int | None = None) -> HardwareProfile:
    """The host profile with measured per-op fixed costs, compute rates and bandwidth.

    Args:
        base: the profile to extend (default: the detected host, ``--target cpu``).
        quick: about half the time (smaller matmul and arrays; fewer op samples).
        threads: intra-op threads to measure with (default: torch's); use the number the
            model will be deployed with.
    """
    import torch

    from graphopt.measure.torch_runs import intra_op_threads

    base = base or host_cpu_profile()
    started = time.perf_counter()
    with intra_op_threads(threads) as used, progress("calibrating this CPU"):
        blocks, chunks, rounds = reference_blocks(), [], []
        for _ in range(_CHUNKS):  # spread over the calibration: a burst must cover them all
            with torch.inference_mode():
                chunks.append(_fixed_costs(rounds=(40 if quick else 120) // _CHUNKS))
            rounds.append(measure_blocks(blocks))
        with torch.inference_mode():
            rates = achievable_rates(base, quick)
    overhead = {op: min(c[op] for c in chunks) for op in chunks[0]}
    for op, flops in _BENCH_FLOPS.items():  # the bench call's own work is not fixed cost
        rate = rates["conv:fp32" if op in ("Conv", "Conv:depthwise") else "matrix:fp32"]
        overhead[op] = max(overhead[op] - flops / rate, overhead[op] / 4)
    rates = {k: float(f"{v:.4g}") for k, v in rates.items()}
    launch = statistics.median(overhead[op] for op in _KERNEL_OPS)
    model = base.display_name.split(" (host")[0]
    benched = replace(
        base, display_name=f"{model} (host, calibrated)",
        bandwidth_bytes_per_s=rates["memory"], launch_overhead_s=launch,
        host_link=replace(base.host_link, bandwidth_bytes_per_s=rates["memory"]),
        op_overhead_s=overhead, measured_rates=dict(sorted(rates.items())))
    kernel, view, how = in_graph_factors(benched, blocks, rounds)
    ort = ort_fixed_costs(rounds=30 if quick else 60, threads=used)
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    logger.info("calibrated %d op types in %.1f s", len(overhead), time.perf_counter() - started)
    return replace(
        benched, launch_overhead_s=float(f"{launch * kernel:.4g}"),
        op_overhead_s={**{k: float(f"{v * (view if k in VIEW_OPS else kernel):.4g}")
                          for k, v in sorted(overhead.items())}, **ort},
        source=f"measured by graphopt calibrate on {when} with torch {torch.__version__}, "
               f"{used} intra-op thread(s): each op type's fixed cost on a small input "
               f"(torch.profiler, mixed stream) x the {how}; ONNX Runtime's per-node cost "
               "of each op type (ort:*, its profiler, optimizations off); fp32 matmul/conv "
               "FLOP/s; add bandwidth over arrays far larger than the LLC. ISA, cores, "
               f"clock: {base.source}",
    )


def calibrate_host(path: str | os.PathLike[str] | None = None, *, quick: bool = False,
                   threads: int | None = None) -> HardwareProfile:
    """``graphopt.calibrate``: measure this CPU (:func:`calibrate`) and, given ``path``,
    write the profile there (whole or not at all) for ``target=path`` / ``--target path``.

    Args:
        path: a ``.json`` file to write, or None to only return the profile.
        quick: about half the time, noisier numbers.
        threads: intra-op threads to measure with (default: torch's); use the number the
            model will run with.
    """
    if threads is not None and not (isinstance(threads, int) and threads >= 1):
        raise GraphoptError(f"threads={threads!r} is not a positive integer",
                            "pass threads=None (torch's default) or a count >= 1")
    if path is not None and not is_profile_path(os.fspath(path)):
        raise GraphoptError(f"{os.fspath(path)!r} does not end in .json",
                            "name the profile file FILE.json: --target reads a .json path "
                            "as a profile")
    # OpenVINO's fixed costs too where it is installed, as the host calibration has them:
    # a profile file predicts the same deploy choice as target "cpu"
    profile = with_openvino_costs(calibrate(quick=quick, threads=threads), threads,
                                  rounds=30 if quick else 60)
    if path is not None:
        save_profile(profile, path)
    return profile
