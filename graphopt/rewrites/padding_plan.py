"""Profitability of channel padding: roofline time of a GEMM-like node before and after.

The padded variant of a node is its :class:`NodeAnalysis` with the padded dims, FLOPs scaled by
the padded work and bytes recomputed from the padded shapes at the compute dtype's width; the
roofline model (``graphopt.cost.roofline``) supplies the tensor-core alignment penalty padding
removes. Added to the padded side: per-call pad/slice copies (a memory-bound kernel each, with
launch overhead) and the extra bytes channel-local ops downstream move over padded channels.

The IR-level pieces (the padded-GEMM roofline variant, copy and stream times, the tensor-core
multiple) live in :mod:`graphopt.decisions.padding_cost`; this module reads fx nodes for them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from torch import fx

from graphopt.analysis.kernel_class import KernelClass
from graphopt.analysis.record import NodeAnalysis
from graphopt.cost.roofline import estimate
from graphopt.decisions.channel_map import ChannelMap
from graphopt.decisions.padding_cost import copy_time, elem_bytes, padded_gemm_time, stream_time
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

__all__ = ["attention_time", "downstream_cost", "gemm_time"]


def _base(ctx: RewriteContext, node: fx.Node, kernel_class: KernelClass) -> NodeAnalysis:
    a = ctx.analysis(node)
    return a if a is not None else NodeAnalysis(kernel_class, {}, 0, 0, 0, 0, "fp32")


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
