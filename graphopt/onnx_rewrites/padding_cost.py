"""Profitability of ONNX channel padding: roofline time of a GEMM-like node before and after.

As in the torch pass (:mod:`graphopt.rewrites.padding_plan`): the padded variant of a node is
its plan :class:`NodeAnalysis` with padded dims, FLOPs scaled by the padded work and bytes
recomputed at the compute dtype's width; the roofline (``graphopt.cost.roofline``) supplies the
tensor-core alignment penalty padding removes. Added to the padded side: per-call Pad/Slice
copies (a memory-bound kernel each, with launch overhead) and the extra bytes channel-local ops
downstream move over padded channels. Unknown (symbolic) dims count as 1, as in the planner.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from graphopt.analysis.kernel_class import KernelClass
from graphopt.analysis.record import NodeAnalysis
from graphopt.decisions.channel_map import ChannelMap
from graphopt.decisions.padding_cost import copy_time, elem_bytes, padded_gemm_time, stream_time
from graphopt.onnx_rewrites.context import OnnxContext
from graphopt.onnx_rewrites.padding_carry import carry_rule
from graphopt.onnx_rewrites.padding_rules import (
    Carry,
    Dims,
    Lookup,
    ModelInfo,
    Site,
    absorbs,
    gemm_site,
)

__all__ = ["copy_time", "downstream_cost", "gemm_time", "numel"]


def numel(shape: Dims | None) -> int:
    return math.prod(d if isinstance(d, int) else 1 for d in shape or ())


def gemm_time(ctx: OnnxContext, site: Site, c_in: int, c_out: int) -> tuple[float, int]:
    """(roofline seconds, FLOPs) of ``site`` run with ``c_in``/``c_out`` (padded) channels."""
    kc = KernelClass.CONV if site.op == "conv" else KernelClass.GEMM
    pn = ctx.plan_node(site.node.name)
    a = pn.analysis if pn is not None else NodeAnalysis(kc, {}, 0, 0, 0, 0, "fp32")
    rows = numel(site.out_shape) // site.c_out
    return padded_gemm_time(
        ctx, a, kc, linear=site.op != "conv", rows=rows,
        in_per=numel(site.in_shape) // site.c_in, out_per=rows, c_in=c_in, c_out=c_out,
        groups=site.groups,
        kernel=math.prod(site.weight.shape[2:]) if site.op == "conv" else 1,
        bias=site.bias is not None)


def downstream_cost(ctx: OnnxContext, info: ModelInfo, tensor: str, cmap: ChannelMap,
                    lookup: Lookup, pending: Callable[[str], bool]) -> tuple[float, int]:
    """(seconds, slices) a padded ``tensor`` would add downstream, by a dry run of the rules.

    Carried ops move ``size/real`` times the bytes; each cut is a Slice copy (in ONNX Runtime
    every Slice copies, graph outputs included). Operands of binary ops not produced yet
    (``pending``) are assumed to be padded the same way.
    """
    hypo: dict[str, ChannelMap] = {tensor: cmap}

    def look(t: str) -> ChannelMap | None:
        m = hypo.get(t) or lookup(t)
        shape = info.shape(t)
        if m is None and pending(t) and shape is not None:
            for cand in reversed(list(hypo.values())):
                if len(shape) > cand.axis and shape[cand.axis] == cand.real:
                    return cand
        return m

    seconds, slices = 0.0, 0
    stack = [tensor]
    while stack:
        src = stack.pop()
        m = hypo[src]
        cut = int(src in info.outputs or src in info.implicit)
        for user in info.users.get(src, []):
            site = gemm_site(user, info)
            rule = None
            if isinstance(site, Site) and user.input[0] == src:
                if absorbs(site, m):
                    continue
                if site.depthwise and site.c_out == site.c_in and m.axis == 1:
                    rule = Carry(m.moved(1, True), "depthwise")
            elif site is None:
                rule = carry_rule(user, look, info)
            if isinstance(rule, Carry):
                pn = ctx.plan_node(user.name)
                if pn is not None:
                    a = pn.analysis
                    ratio = elem_bytes(ctx.compute_dtype) / elem_bytes(a.dtype or "fp32")
                    seconds += stream_time(ctx, a.bytes_total * ratio * (m.size / m.real - 1))
                out = user.output[0]
                if out not in hypo:
                    hypo[out] = rule.out
                    stack.append(out)
                continue
            cut += 1
        if cut:
            n = numel(info.shape(src))
            slices += cut
            seconds += copy_time(ctx, n * m.size // m.real, n)  # one Slice, shared by its users
    return seconds, slices
