"""Tensor-core padding, decided once on graphopt's IR: which channels to pad, carry and cut.

Identity: zero padding does not change a GEMM's real outputs. With ``W'`` the weight placed at
the real channel positions and zero elsewhere, ``y'[real] = W' x' = W x`` whatever ``x'`` holds
at padded input positions, and ``y'[padded] = 0 + bias 0 = 0``. For attention, zero columns
appended to q and k leave ``q k^T`` unchanged, so with the softmax scale fixed at the original
``1/sqrt(d)`` the scores are the same, and zero columns of v give zero output columns.

Cases (numbered as the code refers to them):

1. Conv, ConvTranspose (groups 1), Linear/Gemm/MatMul with a constant weight: pad C_in/K and
   C_out/N to the multiple tensor cores want for the compute dtype
   (``padding_cost.required_multiple``). Weights are padded once, ahead of time; an input
   arriving unpadded is padded per call (costed).
2. Grouped conv: padded per group (each group's block rounded up), or not at all.
3. Depthwise conv is never padded itself (per-group padding multiplies its work); it carries an
   already padded input (groups C -> P, zero weights on padded channels).
4. Padded outputs are carried through channel-local ops (:mod:`.padding_carry`) and sliced to
   the real channels where an op would see the padding, and at graph outputs. A GEMM consumer
   absorbs padding with zero weights (identity above), wherever the real channels sit.
5. Attention with an unaligned head_dim: q, k, v padded per call with zeros, scale kept.

Legality (``padding_sites.can_pad``, and the backend's ``cannot_edit``) is decided apart from
profitability (:func:`should_pad`: the roofline model): with ``pad="auto"`` a node is padded
only when predicted at least ``pad_margin`` times faster (Inductor's pad_mm uses 1.1x),
counting extra FLOPs, per-call pad/slice copies and the extra bytes of carried ops.

Decisions: ``padding`` on every GEMM-like node (old -> new dims, waste_pct, predicted_gain,
reason, applied or not); ``padding_carry`` on each op a padded tensor passes through;
``padding_slice`` where it is sliced back. Both backends apply the returned
:class:`~.padding_steps.PaddingPlan` and decide nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from graphopt.decisions.channel_map import ChannelMap, round_up
from graphopt.decisions.padding_attention import plan_attention
from graphopt.decisions.padding_carry import Carry, PadConst, SetGroups, carry_rule
from graphopt.decisions.padding_cost import copy_time, site_flops, site_time
from graphopt.decisions.padding_downstream import downstream_cost, partner_cut_time
from graphopt.decisions.padding_sites import (
    GemmSite,
    Values,
    absorbs,
    can_pad,
    numel,
)
from graphopt.decisions.padding_steps import (
    CarryStep,
    GemmStep,
    InputPlan,
    PadBackend,
    PaddingPlan,
)
from graphopt.decisions.padding_sweep import Sweep
from graphopt.ir.graph import Graph, Node
from graphopt.ir.options import Options

__all__ = ["plan_padding", "should_pad"]

logger = logging.getLogger(__name__)


def _dims(site: GemmSite, c_in: int, c_out: int) -> dict[str, int]:
    if site.op == "linear":
        return {"K": c_in, "N": c_out}
    return {"C_in": c_in, "C_out": c_out, **({"groups": site.groups} if site.groups > 1 else {})}


def _input_choices(sw: Sweep, site: GemmSite, m: int | None) -> dict[bool, InputPlan]:
    """The input as the GEMM reads it when it does not (False) or does (True) pad K."""
    g, in_map = site.groups, sw.maps.get(site.x)
    per = numel(site.in_shape) // site.c_in
    ident = ChannelMap.identity(site.in_axis, site.c_in)
    if in_map is not None and absorbs(site, in_map):
        keep = InputPlan("none", in_map)
    elif in_map is not None:  # padded, but not the way this GEMM can absorb: slice
        keep = InputPlan("slice", ident, seconds=copy_time(sw.backend, per * in_map.size,
                                                           per * site.c_in))
    else:
        keep = InputPlan("none", ident)
    block = keep.reads.size // g
    if m is None or block % m == 0:
        return {False: keep, True: keep}
    new_block = round_up(block, m)
    if g == 1:
        dst = replace(keep.reads, size=new_block)
    else:
        dst = ChannelMap(site.in_axis, g * new_block, tuple(
            (p // block) * new_block + p % block for p in keep.reads.positions), keep.reads.clean)
    src = in_map if in_map is not None and in_map.axis == site.in_axis else ident
    copies = 1 if src.positions == dst.positions or src.zero_slot() is not None else 2
    seconds = copies * copy_time(sw.backend, per * src.size, per * dst.size)
    if in_map is not None and src is ident:
        seconds += keep.seconds
    return {False: keep, True: InputPlan("pad", dst, src, seconds)}


@dataclass(frozen=True)
class _Variant:
    """One way to run a GEMM: how it reads its input and the output map it writes."""

    inp: InputPlan
    out: ChannelMap

    def changes(self, keep: _Variant) -> bool:
        return self.inp is not keep.inp or self.out is not keep.out


def _variant_time(sw: Sweep, site: GemmSite, v: _Variant) -> float:
    """Roofline time of the GEMM run as ``v``, with the copies and downstream bytes it adds."""
    t = site_time(sw.backend, sw.backend.analysis(site.node.name), site, v.inp.reads.size,
                  v.out.size)[0] + v.inp.seconds
    if v.out.is_padded:
        return t + downstream_cost(sw, site.node.outputs[0], v.out)[0]
    return t + partner_cut_time(sw, site.node.outputs[0])


def should_pad(sw: Sweep, site: GemmSite, keep: _Variant, variants: list[_Variant],
               m: int | None, why: str) -> tuple[_Variant, str, float, dict[str, Any]]:
    """Profitability: (chosen variant, reason, predicted gain over ``keep``, extra fields)."""
    mode, margin, g = sw.options.pad, sw.options.pad_margin, site.groups
    if mode == "never":
        return keep, "not applied: pad='never'", 1.0, {}
    if m is None:
        return keep, f"not applied: {why}", 1.0, {}
    if (keep.inp.reads.size // g) % m == 0 and (site.c_out // g) % m == 0:
        names = "K and N" if site.op == "linear" else "C_in and C_out" + (
            " per group" if g > 1 else "")
        return keep, f"not applied: {names} already multiples of {m}", 1.0, {}
    t_keep = _variant_time(sw, site, keep)
    if mode == "always":
        full = variants[-1]
        return full, f"pad='always': {why}", t_keep / _variant_time(sw, site, full), {}
    times = {id(v): _variant_time(sw, site, v) for v in variants if v.changes(keep)}
    if not times:
        return keep, "not applied: no legal padded variant", 1.0, {}
    best = min((v for v in variants if id(v) in times), key=lambda v: times[id(v)])
    gain = t_keep / times[id(best)]
    if gain >= margin:
        return best, f"predicted {gain:.2f}x >= {margin}x margin", gain, {}
    return keep, f"not applied: predicted {gain:.2f}x < {margin}x margin", gain, {
        "candidate": _dims(site, best.inp.reads.size, best.out.size)}


def _gemm(sw: Sweep, node: Node, site: GemmSite | str) -> None:
    """Cases 1-3: legality, then profitability; one decision per node."""
    if isinstance(site, str):
        if any(t in sw.maps for t in node.inputs):
            sw.cut(node, site)
        sw.backend.decide(node.name, "padding", f"not applied: {site}", applied=False)
        return
    in_map, g = sw.maps.get(site.x), site.groups
    m, why = sw.multiple("gemm" if site.op == "linear" else "conv")
    no_edit = sw.backend.cannot_edit(node)
    illegal = can_pad(site) or no_edit
    if illegal and (sw.options.pad == "never" or m is None or (
            in_map is None and (site.c_in // g) % m == 0 and (site.c_out // g) % m == 0)):
        illegal = None  # nothing to pad: say why not, the same on every backend
    if site.depthwise and in_map is not None and site.op == "conv" and \
            site.c_out == site.c_in and in_map.axis == site.in_axis and no_edit is None:
        return _carry_depthwise(sw, site, in_map)
    ins = _input_choices(sw, site, None if illegal else m)
    out_keep = out_pad = ChannelMap.identity(site.out_axis, site.c_out)
    if m is not None and (site.c_out // g) % m and not illegal:
        per = round_up(site.c_out // g, m)
        out_pad = ChannelMap.grouped(site.out_axis, site.c_out, g, per) if g > 1 else \
            replace(out_keep, size=per)
    keep = _Variant(ins[False], out_keep)
    variants = [_Variant(ins[True], out_keep), _Variant(ins[False], out_pad),
                _Variant(ins[True], out_pad)]
    if illegal:
        chosen, reason, gain, extra = keep, f"not applied: {illegal}", 1.0, {}
    else:
        chosen, reason, gain, extra = should_pad(sw, site, keep, variants, m, why)
    _record_gemm(sw, site, chosen, reason, gain, m, extra)


def _record_gemm(sw: Sweep, site: GemmSite, v: _Variant, reason: str, gain: float,
                 m: int | None, extra: dict[str, Any]) -> None:
    node, inp, out = site.node, v.inp, v.out
    if site.x in sw.maps and not inp.from_padded:
        sw.cut(node, "padded input this GEMM cannot absorb", [site.x])
    if out.is_padded and not site.bias_per_channel:
        out = out.moved(out.axis, False)  # a Gemm C broadcast over N writes beta*C there
    applied = out.is_padded or inp.action == "pad"
    if applied or inp.action != "none" or inp.reads.is_padded:
        sw.plan.steps.append(GemmStep(site, inp, out))
    if inp.action == "pad":
        sw.plan.pads.append({"node": node.name, "source": site.x, "from": site.c_in
                             if inp.src is None else inp.src.size, "to": inp.reads.size})
    if out.is_padded:
        sw.maps[node.outputs[0]] = out
    if applied:
        sw.plan.padded.append(node.name)
    old_f, new_f = site_flops(site, site.c_in, site.c_out), site_flops(site, inp.reads.size,
                                                                         out.size)
    sw.backend.decide(node.name, "padding", reason, applied=applied,
                      old=_dims(site, site.c_in, site.c_out),
                      new=_dims(site, inp.reads.size, out.size), multiple=m,
                      waste_pct=round(100 * (1 - old_f / new_f), 2),
                      predicted_gain=round(gain, 3), **extra)


def _carry_depthwise(sw: Sweep, site: GemmSite, in_map: ChannelMap) -> None:
    """Case 3: the depthwise conv runs on all padded channels, zero filters on padding."""
    node = site.node
    edits = [PadConst(site.weight, 0, 0.0, in_map.positions, in_map.size),
             SetGroups(in_map.size)]
    if site.bias is not None:
        edits.append(PadConst(site.bias, 0, 0.0, in_map.positions, in_map.size))
    out = in_map.moved(in_map.axis, clean=True)
    sw.plan.steps.append(CarryStep(node, out, tuple(edits)))
    sw.maps[node.outputs[0]] = out
    sw.plan.carried += 1
    sw.backend.decide(node.name, "padding", f"not applied: {can_pad(site)}", applied=False,
                      old=_dims(site, site.c_in, site.c_out),
                      new=_dims(site, site.c_in, site.c_out))
    sw.backend.decide(node.name, "padding_carry", "carried: depthwise conv runs on the padded "
                      f"channels (groups {site.groups} -> {in_map.size}, zero filters on "
                      "padding)", old={"groups": site.groups}, new={"groups": in_map.size})


def _propagate(sw: Sweep, node: Node) -> None:
    """Case 4."""
    why = sw.backend.cannot_edit(node)
    rule = carry_rule(sw.graph, node, sw.lookup, sw.value) if why is None else None
    if rule is None:
        return sw.cut(node, str(why))
    if not isinstance(rule, Carry):
        return sw.cut(node, rule.reason)
    sw.plan.steps.append(CarryStep(node, rule.out, rule.edits))
    sw.maps[node.outputs[0]] = rule.out
    sw.plan.carried += 1
    sw.backend.decide(node.name, "padding_carry", f"carried: {rule.reason} ({rule.out.real} "
                      f"real of {rule.out.size})", real=rule.out.real, padded=rule.out.size,
                      clean=rule.out.clean)


def plan_padding(graph: Graph, value: Values, backend: PadBackend, options: Options
                 ) -> PaddingPlan:
    """Decide padding for every node of ``graph`` (in its topological order)."""
    sw = Sweep(graph, value, backend, options, PaddingPlan(), set(graph.inputs) | {
        t for t, info in graph.tensors.items() if info.kind != "activation"})
    for node in graph.nodes:
        site = sw.site(node)
        if site is not None:
            _gemm(sw, node, site)
        elif node.op_type == "Attention":
            plan_attention(sw, node)
        elif any(t in sw.maps for t in node.inputs):
            _propagate(sw, node)
        sw.done.update(node.outputs)
    outs = [t for t in dict.fromkeys(graph.outputs) if t in sw.maps]
    if outs:
        sw.cut(None, "graph output", outs)
    logger.info("padding plan: %d nodes padded, %d carried, %d slices, %d per-call pads",
                len(sw.plan.padded), sw.plan.carried, len(sw.plan.slices), len(sw.plan.pads))
    return sw.plan
