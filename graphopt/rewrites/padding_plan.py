"""Profitability of channel padding: roofline time of a GEMM-like node before and after.

The padded variant of a node is its :class:`NodeAnalysis` with the padded dims, FLOPs scaled by
the padded work and bytes recomputed from the padded shapes at the compute dtype's width; the
roofline model (``graphopt.cost.roofline``) supplies the tensor-core alignment penalty padding
removes. Added to the padded side: per-call pad/slice copies (a memory-bound kernel each, with
launch overhead) and the extra bytes channel-local ops downstream move over padded channels.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

from torch import fx

from graphopt.analysis.kernel_class import KernelClass
from graphopt.analysis.record import NodeAnalysis
from graphopt.cost.roofline import efficiency, estimate, peak_key, tc_alignment
from graphopt.hardware.profile import HardwareProfile
from graphopt.rewrites.channel_map import ChannelMap
from graphopt.rewrites.context import RewriteContext
from graphopt.rewrites.fx_utils import aten_name
from graphopt.rewrites.padding_rules import (
    Carry,
    GemmSite,
    absorbs,
    carry_rule,
    gemm_site,
    static_shape,
)

__all__ = ["CostContext", "attention_time", "copy_time", "downstream_cost", "elem_bytes",
           "gemm_time", "padded_gemm_time", "required_multiple", "stream_time"]

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


def _base(ctx: RewriteContext, node: fx.Node, kernel_class: KernelClass) -> NodeAnalysis:
    a = ctx.analysis(node)
    return a if a is not None else NodeAnalysis(kernel_class, {}, 0, 0, 0, 0, "fp32")


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


def gemm_time(ctx: RewriteContext, site: GemmSite, c_in: int, c_out: int) -> tuple[float, int]:
    """(roofline seconds, FLOPs) of ``site`` run with ``c_in``/``c_out`` (padded) channels."""
    kc = KernelClass.GEMM if site.op == "linear" else KernelClass.CONV
    in_per = math.prod(site.in_shape) // site.c_in
    out_per = math.prod(site.out_shape) // site.c_out
    return padded_gemm_time(
        ctx, _base(ctx, site.node, kc), kc, linear=site.op == "linear",
        rows=in_per if site.op == "conv_transpose" else out_per, in_per=in_per,
        out_per=out_per, c_in=c_in, c_out=c_out, groups=site.groups,
        kernel=math.prod(static_shape(site.weight)[2:]),  # type: ignore[index]
        bias=bool(site.bias))


def attention_time(ctx: RewriteContext, node: fx.Node, d: int, dv: int, dp: int, dvp: int
                   ) -> tuple[float, int]:
    """(roofline seconds, FLOPs) of SDPA with head dims padded ``d -> dp``, ``dv -> dvp``."""
    a = _base(ctx, node, KernelClass.ATTENTION)
    q, k, v = (static_shape(x) for x in node.args[:3])
    assert q is not None and k is not None and v is not None
    e = elem_bytes(ctx.compute_dtype)
    qk_rows, v_rows = (math.prod(q[:-1]) + math.prod(k[:-1])), math.prod(v[:-1])
    out_rows = math.prod(q[:-1])
    flops = int(a.flops * (dp + dvp) / (d + dv)) if a.flops else 2 * out_rows * k[-2] * (dp + dvp)
    variant = replace(a, kernel_class=KernelClass.ATTENTION, dims={**a.dims, "head_dim": dp},
                      flops=flops, bytes_read=e * (qk_rows * dp + v_rows * dvp),
                      bytes_written=e * out_rows * dvp)
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


def downstream_cost(ctx: RewriteContext, node: fx.Node, cmap: ChannelMap,
                    lookup: Callable[[fx.Node], ChannelMap | None],
                    pending: Callable[[fx.Node], bool]) -> tuple[float, int]:
    """(seconds, slices) a padded output of ``node`` would add downstream, by a dry run.

    Carried ops move ``size/real`` times the bytes; each cut is a slice copy. Operands of
    binary ops not decided yet (``pending``) are assumed to be padded the same way.
    """
    hypo: dict[fx.Node, ChannelMap] = {node: cmap}

    def look(n: fx.Node) -> ChannelMap | None:
        m = hypo.get(n) or lookup(n)
        shape = static_shape(n)
        if m is None and pending(n) and shape is not None:
            for cand in reversed(list(hypo.values())):
                if len(shape) > cand.axis and shape[cand.axis] == cand.real:
                    return cand
        return m

    seconds, slices = 0.0, 0
    stack, seen = [node], {node}
    while stack:
        src = stack.pop()
        m = hypo[src]
        for user in src.users:
            site = gemm_site(user)
            rule = None
            if isinstance(site, GemmSite) and user.args[0] is src:
                if absorbs(site, m):
                    continue
                if site.depthwise and site.c_out == site.c_in and m.axis == site.in_axis:
                    rule = Carry(m.moved(m.axis, True), "depthwise")
            elif site is None and aten_name(user) != "scaled_dot_product_attention":
                rule = carry_rule(user, look)
            if isinstance(rule, Carry):
                a = ctx.analysis(user)
                if a is not None:
                    ratio = elem_bytes(ctx.compute_dtype) / elem_bytes(a.dtype or "fp32")
                    seconds += stream_time(ctx, a.bytes_total * ratio * (m.size / m.real - 1))
                if user not in seen:
                    seen.add(user)
                    hypo[user] = rule.out
                    stack.append(user)
                continue
            slices += 1
            if user.op == "output" and m.is_prefix:
                continue  # a prefix slice is a view: the caller gets it without a copy
            shape = static_shape(src)
            numel = math.prod(shape) if shape else 0
            seconds += copy_time(ctx, numel, numel)
    return seconds, slices
