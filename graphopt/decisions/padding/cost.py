"""Profitability of channel padding (cases 1-3 and 5 of :mod:`graphopt.decisions.padding`):
roofline time of a GEMM-like or attention node before and after.

The padded variant of a node is its :class:`NodeAnalysis` with the padded dims, FLOPs scaled by
the padded work and bytes recomputed from the padded shapes at the compute dtype's width; the
roofline model (``graphopt.cost.roofline``) supplies the tensor-core alignment penalty padding
removes. Added to the padded side: per-call pad/slice copies (a memory-bound kernel each, with
launch overhead) and the extra bytes channel-local ops downstream move over padded channels.

These helpers read only graphopt's analysis records and a hardware profile, so the torch and
the ONNX padding passes ask the same cost model (and an ``.onnx`` file never imports torch).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Protocol

from graphopt.analysis.kernel_class import KernelClass
from graphopt.analysis.record import NodeAnalysis
from graphopt.cost.roofline import efficiency, estimate, peak_key, tc_alignment
from graphopt.decisions.padding.sites import GemmSite, numel
from graphopt.hardware.profile import HardwareProfile

__all__ = ["CostContext", "attention_time", "copy_time", "elem_bytes", "padded_gemm_time",
           "required_multiple", "site_flops", "site_time", "stream_time"]

# Dtypes the roofline runs on tensor cores (graphopt.cost.roofline rule 1).
_TC_KEYS = frozenset({"tf32", "fp16", "bf16", "fp8", "int8"})


def elem_bytes(dtype: str) -> int:
    return {"fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}.get(dtype, 4)


def required_multiple(kind: str, profile: HardwareProfile, dtype: str) -> tuple[int | None, str]:
    """The K/N multiple tensor cores want for a ``kind`` node ("conv", "gemm", "attention").

    ``None`` (with why) when the node does not run on tensor cores, so alignment gains nothing.
    """
    if not profile.is_gpu:
        return None, f"target {profile.name} has no tensor-core alignment requirement"
    key = peak_key(dtype)
    if key == "fp32" and kind == "conv" and "tf32" in profile.peak_flops:
        key = "tf32"  # cuDNN runs fp32 convs as TF32 by default (roofline rule 3)
    if key not in _TC_KEYS or key not in profile.peak_flops:
        return None, (f"{dtype} {kind} runs on CUDA cores on {profile.name}: no tensor-core "
                      "alignment requirement")
    return tc_alignment(key), f"tensor cores want multiples of {tc_alignment(key)} for {key}"


class CostContext(Protocol):
    """What the padding cost helpers read: the torch and the ONNX pass contexts both have it."""

    target: HardwareProfile
    compute_dtype: str


def padded_gemm_time(ctx: CostContext, a: NodeAnalysis, kc: KernelClass, *, linear: bool,
                     rows: int, in_per: int, out_per: int, c_in: int, c_out: int, groups: int,
                     kernel: int, bias: bool) -> tuple[float, int]:
    """(roofline seconds, FLOPs) of GEMM-like node ``a`` with ``c_in``/``c_out`` channels.

    The variant is ``a`` with padded dims, FLOPs of the padded work and bytes at the compute
    dtype's width; the roofline supplies the tensor-core alignment penalty padding removes.
    """
    flops = 2 * rows * c_out * (c_in // groups) * kernel
    e = elem_bytes(ctx.compute_dtype)
    read = e * (in_per * c_in + c_out * (c_in // groups) * kernel + (c_out if bias else 0))
    dims = ({"M": rows, "N": c_out, "K": c_in, "batch": 1} if linear else
            {**a.dims, "M": rows, "N": c_out, "K": c_in // groups * kernel, "groups": groups,
             "C_in": c_in, "C_out": c_out})
    if a.kernel_class not in (KernelClass.GEMM, KernelClass.GEMV, KernelClass.CONV):
        a = replace(a, kernel_class=kc)
    variant = replace(a, dims=dims, flops=flops, bytes_read=read,
                      bytes_written=e * out_per * c_out)
    return estimate(variant, ctx.target, ctx.compute_dtype).est_time_s, flops


def copy_time(ctx: CostContext, read_elems: int, write_elems: int) -> float:
    """One per-call pad/slice/gather kernel: memory-bound, plus its launch."""
    e = elem_bytes(ctx.compute_dtype)
    a = NodeAnalysis(KernelClass.DATA_MOVEMENT, {"numel": write_elems}, 0, e * read_elems,
                     e * write_elems, 0, ctx.compute_dtype)
    return estimate(a, ctx.target, ctx.compute_dtype).est_time_s


def stream_time(ctx: CostContext, nbytes: float) -> float:
    """Seconds to stream ``nbytes`` through DRAM at the achievable bandwidth."""
    bw = ctx.target.bandwidth_bytes_per_s * efficiency(ctx.target.kind, "memory")
    return nbytes / bw


def site_time(ctx: CostContext, a: NodeAnalysis | None, site: GemmSite, c_in: int,
              c_out: int) -> tuple[float, int]:
    """(roofline seconds, FLOPs) of ``site`` run with ``c_in``/``c_out`` (padded) channels."""
    kc = KernelClass.GEMM if site.op == "linear" else KernelClass.CONV
    base = a if a is not None else NodeAnalysis(kc, {}, 0, 0, 0, 0, "fp32")
    in_per, out_per = numel(site.in_shape) // site.c_in, numel(site.out_shape) // site.c_out
    return padded_gemm_time(
        ctx, base, kc, linear=site.op == "linear",
        rows=in_per if site.op == "conv_transpose" else out_per, in_per=in_per,
        out_per=out_per, c_in=c_in, c_out=c_out, groups=site.groups, kernel=site.kernel,
        bias=site.bias is not None)


def site_flops(site: GemmSite, c_in: int, c_out: int) -> int:
    """FLOPs of ``site`` with ``c_in``/``c_out`` channels (what padding wastes, no roofline)."""
    in_per, out_per = numel(site.in_shape) // site.c_in, numel(site.out_shape) // site.c_out
    rows = in_per if site.op == "conv_transpose" else out_per
    return 2 * rows * c_out * (c_in // site.groups) * site.kernel


def attention_time(ctx: CostContext, a: NodeAnalysis | None, shapes: list[tuple[int, ...]],
                   dp: int, dvp: int) -> tuple[float, int]:
    """(roofline seconds, FLOPs) of attention with head dims padded to ``dp``/``dvp``."""
    q, k, v = shapes[:3]
    d, dv = q[-1], v[-1]
    base = a if a is not None else NodeAnalysis(KernelClass.ATTENTION, {}, 0, 0, 0, 0, "fp32")
    e = elem_bytes(ctx.compute_dtype)
    qk_rows, v_rows = (math.prod(q[:-1]) + math.prod(k[:-1])), math.prod(v[:-1])
    out_rows = math.prod(q[:-1])
    flops = (int(base.flops * (dp + dvp) / (d + dv)) if base.flops
             else 2 * out_rows * k[-2] * (dp + dvp))
    variant = replace(base, kernel_class=KernelClass.ATTENTION,
                      dims={**base.dims, "head_dim": dp}, flops=flops,
                      bytes_read=e * (qk_rows * dp + v_rows * dvp),
                      bytes_written=e * out_rows * dvp)
    return estimate(variant, ctx.target, ctx.compute_dtype).est_time_s, flops
