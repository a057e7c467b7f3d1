"""Cases 1-3 of :mod:`graphopt.decisions.padding`: a GEMM-like site, legality then profitability.

Legality: :func:`.sites.can_pad` (case 2's grouped transposed conv, case 3's depthwise conv) and
the backend's ``can_edit``. Profitability (:func:`should_pad`): each legal variant (pad K, pad N,
both) is timed by the roofline with the copies it adds and what it costs downstream
(:mod:`.downstream`); with ``pad="auto"`` the fastest is taken when at least ``pad_margin``
times faster than leaving the node as it is (Inductor's pad_mm uses 1.1x).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from graphopt.decisions.padding.carry import PadConst, SetGroups
from graphopt.decisions.padding.channel_map import ChannelMap, round_up
from graphopt.decisions.padding.cost import copy_time, site_flops, site_time
from graphopt.decisions.padding.downstream import downstream_cost, partner_cut_time
from graphopt.decisions.padding.sites import GemmSite, absorbs, can_pad, numel
from graphopt.decisions.padding.state import Decided, Outcome, SweepState, cut
from graphopt.decisions.padding.steps import CarryStep, GemmStep, InputPlan
from graphopt.ir.decision_details import GroupsCarryDetail, PaddingDetail, PaddingSkip
from graphopt.ir.graph import Node
from graphopt.ir.legality import Legality
from graphopt.ir.plan_sections import PerCallPad

__all__ = ["decide_gemm", "should_pad"]


def _dims(site: GemmSite, c_in: int, c_out: int) -> dict[str, int]:
    if site.op == "linear":
        return {"K": c_in, "N": c_out}
    return {"C_in": c_in, "C_out": c_out, **({"groups": site.groups} if site.groups > 1 else {})}


def _input_choices(sw: SweepState, site: GemmSite, m: int | None) -> dict[bool, InputPlan]:
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


def _variant_time(sw: SweepState, site: GemmSite, v: _Variant) -> float:
    """Roofline time of the GEMM run as ``v``, with the copies and downstream bytes it adds."""
    t = site_time(sw.backend, sw.backend.analysis(site.node.name), site, v.inp.reads.size,
                  v.out.size)[0] + v.inp.seconds
    if v.out.is_padded:
        return t + downstream_cost(sw, site.node.outputs[0], v.out)[0]
    return t + partner_cut_time(sw, site.node.outputs[0])


def should_pad(sw: SweepState, site: GemmSite, keep: _Variant, variants: list[_Variant],
               m: int | None, why: str) -> tuple[_Variant, str, float, dict[str, int] | None]:
    """Profitability: (chosen variant, reason, predicted gain over ``keep``, the dims a
    declined pad would have had)."""
    mode, margin, g = sw.options.pad, sw.options.pad_margin, site.groups
    if mode == "never":
        return keep, "not applied: pad='never'", 1.0, None
    if m is None:
        return keep, f"not applied: {why}", 1.0, None
    if (keep.inp.reads.size // g) % m == 0 and (site.c_out // g) % m == 0:
        names = "K and N" if site.op == "linear" else "C_in and C_out" + (
            " per group" if g > 1 else "")
        return keep, f"not applied: {names} already multiples of {m}", 1.0, None
    t_keep = _variant_time(sw, site, keep)
    if mode == "always":
        full = variants[-1]
        return full, f"pad='always': {why}", t_keep / _variant_time(sw, site, full), None
    times = {id(v): _variant_time(sw, site, v) for v in variants if v.changes(keep)}
    if not times:
        return keep, "not applied: no legal padded variant", 1.0, None
    best = min((v for v in variants if id(v) in times), key=lambda v: times[id(v)])
    gain = t_keep / times[id(best)]
    if gain >= margin:
        return best, f"predicted {gain:.2f}x >= {margin}x margin", gain, None
    return keep, f"not applied: predicted {gain:.2f}x < {margin}x margin", gain, \
        _dims(site, best.inp.reads.size, best.out.size)


def decide_gemm(sw: SweepState, node: Node, site: GemmSite | str) -> Outcome:
    """Cases 1-3: legality, then profitability; one ``padding`` decision per node."""
    if isinstance(site, str):
        cuts = cut(sw, node, site) if any(t in sw.maps for t in node.inputs) else Outcome()
        return cuts + Outcome(decided=(Decided(node.name, PaddingSkip(), f"not applied: {site}",
                                               applied=False),))
    in_map, g = sw.maps.get(site.x), site.groups
    m, why = sw.multiple("gemm" if site.op == "linear" else "conv")
    editable = sw.backend.can_edit(node)
    legal = can_pad(site) and editable  # the first "no" says why
    if not legal and (sw.options.pad == "never" or m is None or (
            in_map is None and (site.c_in // g) % m == 0 and (site.c_out // g) % m == 0)):
        legal = Legality.OK  # nothing to pad: say why not, the same on every backend
    if site.depthwise and in_map is not None and site.op == "conv" and \
            site.c_out == site.c_in and in_map.axis == site.in_axis and editable:
        return _carry_depthwise(site, in_map)
    ins = _input_choices(sw, site, m if legal else None)
    out_keep = out_pad = ChannelMap.identity(site.out_axis, site.c_out)
    if m is not None and (site.c_out // g) % m and legal:
        per = round_up(site.c_out // g, m)
        out_pad = ChannelMap.grouped(site.out_axis, site.c_out, g, per) if g > 1 else \
            replace(out_keep, size=per)
    keep = _Variant(ins[False], out_keep)
    variants = [_Variant(ins[True], out_keep), _Variant(ins[False], out_pad),
                _Variant(ins[True], out_pad)]
    if not legal:
        chosen, reason, gain, candidate = keep, f"not applied: {legal.reason}", 1.0, None
    else:
        chosen, reason, gain, candidate = should_pad(sw, site, keep, variants, m, why)
    return _record_gemm(sw, site, chosen, reason, gain, m, candidate)


def _record_gemm(sw: SweepState, site: GemmSite, v: _Variant, reason: str, gain: float,
                 m: int | None, candidate: dict[str, int] | None) -> Outcome:
    node, inp, out = site.node, v.inp, v.out
    done = Outcome()
    if site.x in sw.maps and not inp.from_padded:
        done = cut(sw, node, "padded input this GEMM cannot absorb", [site.x])
    if out.is_padded and not site.bias_per_channel:
        out = out.moved(out.axis, False)  # a Gemm C broadcast over N writes beta*C there
    applied = out.is_padded or inp.action == "pad"
    steps = (GemmStep(site, inp, out),) if (
        applied or inp.action != "none" or inp.reads.is_padded) else ()
    pads = (PerCallPad(node.name, site.x, site.c_in if inp.src is None else inp.src.size,
                       inp.reads.size),) if inp.action == "pad" else ()
    old_f, new_f = site_flops(site, site.c_in, site.c_out), site_flops(site, inp.reads.size,
                                                                         out.size)
    detail = PaddingDetail(old=_dims(site, site.c_in, site.c_out),
                           new=_dims(site, inp.reads.size, out.size), multiple=m,
                           waste_pct=round(100 * (1 - old_f / new_f), 2),
                           predicted_gain=round(gain, 3), candidate=candidate)
    return done + Outcome(
        steps=steps, pads=pads, maps=((node.outputs[0], out),) if out.is_padded else (),
        padded=(node.name,) if applied else (),
        decided=(Decided(node.name, detail, reason, applied),))


def _carry_depthwise(site: GemmSite, in_map: ChannelMap) -> Outcome:
    """Case 3: the depthwise conv runs on all padded channels, zero filters on padding."""
    node = site.node
    edits = [PadConst(site.weight, 0, 0.0, in_map.positions, in_map.size),
             SetGroups(in_map.size)]
    if site.bias is not None:
        edits.append(PadConst(site.bias, 0, 0.0, in_map.positions, in_map.size))
    out = in_map.moved(in_map.axis, clean=True)
    return Outcome(
        steps=(CarryStep(node, out, tuple(edits)),), maps=((node.outputs[0], out),), carried=1,
        decided=(Decided(node.name, PaddingSkip(_dims(site, site.c_in, site.c_out),
                                                _dims(site, site.c_in, site.c_out)),
                         f"not applied: {can_pad(site).reason}", False),
                 Decided(node.name, GroupsCarryDetail({"groups": site.groups},
                                                      {"groups": in_map.size}),
                         "carried: depthwise conv runs on the padded channels (groups "
                         f"{site.groups} -> {in_map.size}, zero filters on padding)", True)))
