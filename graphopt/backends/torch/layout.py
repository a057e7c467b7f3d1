"""Run conv regions in channels_last (NHWC) as the plan's layout decision says.

The decision (cases 1-5: keep, legality, known slow cases, profitability per region, forced) is
made once per run on the plan, before any pass
(:func:`graphopt.decisions.rewrites.decide_run_layout`, the call the ONNX backend and
``graphopt.plan``'s dry run make too), and handed over as ``ctx.layout``; this pass only finds
the fx regions
(:mod:`~graphopt.backends.torch.layout_regions`) and edits them.

Identity: memory format changes strides, never values. Every op of a region
(:data:`~graphopt.backends.torch.layout_regions.AGNOSTIC`) is defined on logical indices, so with
``x' = x.contiguous(memory_format=channels_last)`` at each region entry, conv weights
``W' = W.contiguous(memory_format=channels_last)`` and ``y = y'.contiguous()`` at each exit,
every value outside the region is unchanged; only the summation order inside a conv kernel may
differ (fp32 tolerance). ``y'.contiguous()`` also gives graph outputs the strides the user got.

Where the fx graph differs from the plan (the reason says so, in a ``backend`` field):

a. A conv the plan does not know, or whose weight is not a ``get_attr`` here: kept NCHW.
b. An fx region whose convs the plan decided differently (regions joined by earlier passes):
   kept NCHW, since one region has one layout.
c. Idempotence: a region whose conversions are already in place stays channels_last and reuses
   them ("already channels_last").

``ctx.notes["layout"]`` counts conversions per fx region and overall and holds the plan's
model-level decision; each conv gets the plan's ``"layout"`` decision (``format``, ``region``,
``predicted_gain_s``).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import fx

from graphopt.backends.torch.context import RewriteContext
from graphopt.backends.torch.fx_utils import aten_name, get_tensor, new_param, val
from graphopt.backends.torch.layout_regions import (
    ConvInfo,
    Region,
    conv_info,
    find_regions,
    is_entry_conversion,
    is_exit_conversion,
    memory_format_for,
    weight_needs_conversion,
)
from graphopt.decisions.layout.channels_last import (
    ConvLayout,
    LayoutEstimate,
    LayoutPlan,
    cpu_class,
)
from graphopt.ir.legality import Legality

__all__ = ["can_rewrite_channels_last", "channels_last"]

logger = logging.getLogger(__name__)

_cpu_class = cpu_class  # benchmarks/bench_layout_cpu.py reads the CPU rule's classes here
_CONV_NAMES = frozenset({"conv2d", "conv3d", "convolution", "conv_transpose2d",
                         "conv_transpose3d"})
_ALREADY = "already channels_last (its conversions are in place)"


def can_rewrite_channels_last(info: ConvInfo | None) -> Legality:
    """Can the fx graph convert this conv (case a): what the rewrite needs of it."""
    if info is None:
        return Legality.no("not a 2-D/3-D conv with traced shapes (transposed convs stay NCHW)")
    if info.transposed:
        return Legality.no("transposed conv (left in NCHW)")
    if info.weight is None:
        return Legality.no("its weight is computed at run time and would be converted on every "
                           "call")
    return Legality.OK


def _convert(gm: fx.GraphModule, node: fx.Node, fmt: torch.memory_format, tag: str,
             before: fx.Node) -> fx.Node:
    with gm.graph.inserting_before(before):
        kwargs = {} if fmt == torch.contiguous_format else {"memory_format": fmt}
        new = gm.graph.call_function(torch.ops.aten.contiguous.default, (node,), kwargs)
    v = val(node)
    if v is not None:
        new.meta["val"] = v.contiguous(memory_format=fmt)
    new.meta["graphopt_layout"] = tag
    return new


def _drop_if_unused(gm: fx.GraphModule, node: fx.Node) -> None:
    target = str(node.target)
    if node.users:
        return
    gm.graph.erase_node(node)
    if any(n.op == "get_attr" and n.target == target for n in gm.graph.nodes):
        return
    owner_path, _, leaf = target.rpartition(".")
    owner = gm.get_submodule(owner_path) if owner_path else gm
    delattr(owner, leaf)


def _apply(gm: fx.GraphModule, region: Region) -> tuple[int, int, int]:
    """Convert one region in place; returns (entries, exits, weights) newly converted."""
    fmt = memory_format_for(region.rank)
    inside = set(region.nodes)
    weights = 0
    for conv in region.convs:
        info = conv_info(conv)
        if info is None or info.weight is None or not weight_needs_conversion(gm, info):
            continue
        old = info.weight
        w = get_tensor(gm, old)
        assert w is not None  # weight_needs_conversion checked it
        new = new_param(gm, f"{old.target}_cl", w.contiguous(memory_format=fmt), conv)
        conv.replace_input_with(old, new)
        _drop_if_unused(gm, old)
        weights += 1
    entries = exits = 0
    for e in region.new_entries():
        readers = [u for u in e.users if u in inside]
        done = [u for u in e.users if is_entry_conversion(u)]  # another region converted it
        if done:
            node = done[0]
        else:
            node = _convert(gm, e, fmt, f"entry:{region.id}", min(readers, key=region.nodes.index))
            entries += 1
        for u in readers:
            u.replace_input_with(e, node)
    for m, readers in region.new_exits().items():
        done = [u for u in m.users if is_exit_conversion(u)]
        if done:
            node = done[0]
        else:
            node = _convert(gm, m, torch.contiguous_format, f"exit:{region.id}", m.next)
            exits += 1
        for r in readers:
            r.replace_input_with(m, node)
    for n in region.nodes:
        n.meta["graphopt_layout"] = f"channels_last:{region.id}"
    return entries, exits, weights


def _record(ctx: RewriteContext, conv: fx.Node, d: ConvLayout, applied: bool,
            backend: str | None = None, reason: str | None = None) -> None:
    ctx.decide(conv, d.detail(backend), reason or d.reason, applied=applied)


def _estimate(decided: LayoutPlan, layouts: list[ConvLayout]) -> LayoutEstimate:
    """The plan's estimate of the region(s) an fx region's convs belong to."""
    ids = {d.region for d in layouts}
    ests = [e for r, e in decided.regions if r.id in ids]
    if len(ests) == 1:
        return ests[0]
    return LayoutEstimate(sum(e.gain_s for e in ests), sum(e.cost_s for e in ests),
                          all(e.apply for e in ests), "; ".join(e.reason for e in ests))


def channels_last(gm: fx.GraphModule, ctx: RewriteContext) -> bool:
    """The layout pass: read the plan's decision, find the fx regions, convert the chosen ones."""
    mode, decided = ctx.options.layout, ctx.layout
    if decided is None:
        raise RuntimeError("the run's layout is decided before any pass "
                           "(backends.torch.pipeline.decide_run); this context has none")
    convs = {n: conv_info(n) for n in gm.graph.nodes if aten_name(n) in _CONV_NAMES}
    seen = {c.name for c in convs}
    for name, d in decided.convs.items():  # plan convs this pass has no edit for (conv1d)
        if name not in seen:
            ctx.decide(name, d.detail(), d.reason, applied=False)
    excluded: dict[fx.Node, str] = {}
    for conv, info in convs.items():
        d = decided.convs.get(conv.name)
        if d is None:  # case a
            d = ConvLayout(conv.name, "nchw", None, "kept NCHW: not a conv of the plan")
            excluded[conv] = d.reason
            _record(ctx, conv, d, False)
            continue
        legal = can_rewrite_channels_last(info)
        if d.region is None or not legal:
            excluded[conv] = d.reason
            _record(ctx, conv, d, False, None if legal or not d.channels_last else legal.reason)
    summaries: list[dict[str, Any]] = []
    changed = False
    regions = [] if mode == "keep" else find_regions(gm, excluded)
    for region in regions:
        layouts = [decided.convs[c.name] for c in region.convs]
        est = _estimate(decided, layouts)
        already = bool(region.entries) and not region.new_entries() and not region.new_exits()
        apply = already or all(d.channels_last for d in layouts)
        entries, exits = len(region.entries), len(region.exits)
        inserted = weights = 0
        if apply:
            new_in, new_out, weights = _apply(gm, region)
            inserted = new_in + new_out
            changed |= inserted + weights > 0
        mixed = None if apply or not any(d.channels_last for d in layouts) else (
            "kept NCHW: its fx region also holds convs the plan keeps NCHW")  # case b
        for conv, d in zip(region.convs, layouts, strict=True):
            if already:  # case c
                _record(ctx, conv, d, True, reason=f"channels_last: region {d.region} {_ALREADY}")
            else:
                _record(ctx, conv, d, apply, mixed if d.channels_last else None)
        summaries.append({"id": region.id, "ops": len(region.nodes),
                          "convs": [c.name for c in region.convs], "applied": apply,
                          "entries": entries if apply else 0, "exits": exits if apply else 0,
                          "conversions": entries + exits if apply else 0,
                          "inserted": inserted, "weights_converted": weights,
                          **est.to_dict(), "apply": apply,
                          "reason": _ALREADY if already else est.reason})
        logger.debug("layout fx region %d: %s", region.id, summaries[-1]["reason"])
    total = sum(s["conversions"] for s in summaries)
    inserted = sum(s["inserted"] for s in summaries)
    ctx.notes["layout"] = {"mode": mode, "regions": summaries, "conversions": total,
                           "inserted": inserted, "decision": {"nhwc": decided.nhwc,
                                                              "reason": decided.reason}}
    logger.info("layout: %d of %d region(s) channels_last, %d conversion(s) (%d new)",
                sum(s["applied"] for s in summaries), len(summaries), total, inserted)
    return changed
