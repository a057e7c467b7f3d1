"""Tensor-core padding: pad conv/linear channels and attention head_dim to aligned multiples.

Identity: zero padding does not change a GEMM's real outputs. With ``W'`` the weight placed at
the real channel positions and zero elsewhere (``channel_map.scatter_weight``),
``y'[real] = W' x' = W x`` whatever ``x'`` holds at padded input positions, and ``y'[padded]
= 0 + bias 0 = 0``. For attention, zero columns appended to q and k leave ``q k^T`` unchanged,
so with the softmax scale fixed at the original ``1/sqrt(d)`` the scores are the same, and zero
columns of v give zero output columns, sliced away.

Cases (numbered as the code refers to them):

1. Conv (groups 1), linear, transposed conv (groups 1): pad C_in/K and C_out/N to the multiple
   tensor cores want for ``ctx.compute_dtype`` (``padding_plan.required_multiple``). Weights are
   padded once, ahead of time; an input arriving unpadded is padded per call (costed).
2. Grouped conv: padded per group (each group's block rounded up), or not at all.
3. Depthwise conv is never padded itself (per-group padding multiplies its work); it carries an
   already padded input (groups C -> P, zero weights on padded channels).
4. Padded outputs are carried through channel-local ops (``padding_rules``) and sliced to the
   real channels only where an op would see the padding, and at graph outputs. A GEMM consumer
   absorbs padding with zero weights (identity above), wherever the real channels sit.
5. SDPA with an unaligned head_dim: q, k, v padded per call with zeros, scale kept explicit.

Legality (``_can_pad``: does the identity hold, can we rewrite it) is decided apart from
profitability (``_should_pad``: the roofline model, ``padding_plan``): with ``pad="auto"`` a
node is padded only when predicted at least ``pad_margin`` times faster (Inductor's pad_mm uses
1.1x), counting extra FLOPs, per-call pad/slice copies and the extra bytes of carried ops.

Decisions: ``padding`` on every GEMM-like node (old -> new dims, waste_pct, predicted_gain,
reason, applied or not); ``padding_carry`` on each op a padded tensor passes through;
``padding_slice`` where it is sliced back; ``ctx.notes["padding"]`` sums them up.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import fx

from graphopt.cost.roofline import peak_key, tc_alignment
from graphopt.decisions.channel_map import ChannelMap, round_up
from graphopt.decisions.padding_cost import copy_time, required_multiple
from graphopt.rewrites.channel_scatter import scatter_vector, scatter_weight
from graphopt.rewrites.context import RewriteContext
from graphopt.rewrites.fx_utils import aten_name, get_tensor, new_param
from graphopt.rewrites.padding_edits import (
    PadState,
    cut_inputs,
    pad_per_call,
    refresh_meta,
    slice_real,
)
from graphopt.rewrites.padding_plan import attention_time, downstream_cost, gemm_time
from graphopt.rewrites.padding_rules import (
    Carry,
    GemmSite,
    absorbs,
    carry_rule,
    gemm_site,
    static_shape,
)

__all__ = ["pad_channels"]

logger = logging.getLogger(__name__)


# --- GEMM-like nodes (cases 1-3) ---------------------------------------------------------------

def _dims(site: GemmSite, c_in: int, c_out: int) -> dict[str, int]:
    if site.op == "linear":
        return {"K": c_in, "N": c_out}
    return {"C_in": c_in, "C_out": c_out, **({"groups": site.groups} if site.groups > 1 else {})}


def _can_pad(site: GemmSite) -> str | None:
    if site.depthwise:
        return "depthwise conv (groups == C_in): per-group padding would multiply the work"
    if site.op == "conv_transpose" and site.groups > 1:
        return "grouped transposed conv: its per-group weight layout is not handled"
    return None


@dataclass(frozen=True)
class _Input:
    """How a GEMM reads its input: unchanged, sliced to real channels, or padded per call."""

    action: str  # "none" | "slice" | "pad"
    reads: ChannelMap  # the layout the GEMM sees
    src: ChannelMap | None = None  # the layout a per-call pad starts from
    seconds: float = 0.0


def _input_choices(st: PadState, site: GemmSite, m: int | None) -> dict[bool, _Input]:
    """The input as the GEMM reads it when it does not (False) or does (True) pad K."""
    g, in_map = site.groups, st.maps.get(site.x)
    per = math.prod(site.in_shape) // site.c_in
    ident = ChannelMap.identity(site.in_axis, site.c_in)
    if in_map is not None and absorbs(site, in_map):
        keep = _Input("none", in_map)
    elif in_map is not None:  # padded, but not the way this GEMM can absorb: slice
        keep = _Input("slice", ident, seconds=copy_time(st.ctx, per * in_map.size,
                                                         per * site.c_in))
    else:
        keep = _Input("none", ident)
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
    seconds = copies * copy_time(st.ctx, per * src.size, per * dst.size)
    if in_map is not None and src is ident:
        seconds += keep.seconds
    return {False: keep, True: _Input("pad", dst, src, seconds)}


@dataclass(frozen=True)
class _Variant:
    """One way to run a GEMM: how it reads its input and the output map it writes."""

    inp: _Input
    out: ChannelMap

    def changes(self, keep: _Variant) -> bool:
        return self.inp is not keep.inp or self.out is not keep.out


def _variant_time(st: PadState, site: GemmSite, v: _Variant) -> float:
    """Roofline time of the GEMM run as ``v``, with the copies and downstream bytes it adds."""
    t = gemm_time(st.ctx, site, v.inp.reads.size, v.out.size)[0] + v.inp.seconds
    if v.out.is_padded:
        return t + downstream_cost(st.ctx, site.node, v.out, st.lookup, st.pending)[0]
    return t + _partner_cut_time(st, site.node)


def _should_pad(st: PadState, site: GemmSite, keep: _Variant, variants: list[_Variant],
                m: int | None, why: str) -> tuple[_Variant, str, float, dict[str, Any]]:
    """Profitability: (chosen variant, reason, predicted gain over ``keep``, extra fields)."""
    mode, margin, g = st.ctx.options.pad, st.ctx.options.pad_margin, site.groups
    t_keep = _variant_time(st, site, keep)
    if mode == "never":
        return keep, "not applied: pad='never'", 1.0, {}
    if m is None:
        return keep, f"not applied: {why}", 1.0, {}
    if (keep.inp.reads.size // g) % m == 0 and (site.c_out // g) % m == 0:
        names = "K and N" if site.op == "linear" else "C_in and C_out" + (
            " per group" if g > 1 else "")
        return keep, f"not applied: {names} already multiples of {m}", 1.0, {}
    if mode == "always":
        full = variants[-1]
        return full, f"pad='always': {why}", t_keep / _variant_time(st, site, full), {}
    times = {id(v): _variant_time(st, site, v) for v in variants if v.changes(keep)}
    best = min((v for v in variants if id(v) in times), key=lambda v: times[id(v)])
    gain = t_keep / times[id(best)]
    if gain >= margin:
        return best, f"predicted {gain:.2f}x >= {margin}x margin", gain, {}
    return keep, f"not applied: predicted {gain:.2f}x < {margin}x margin", gain, {
        "candidate": _dims(site, best.inp.reads.size, best.out.size)}


def _gemm(st: PadState, node: fx.Node, site: GemmSite | str) -> None:
    """Cases 1-3: legality, then profitability, then the rewrite; one decision per node."""
    ctx = st.ctx
    if isinstance(site, str):
        if any(n in st.maps for n in node.all_input_nodes):
            cut_inputs(st, node, site)
        ctx.decide(node, "padding", f"not applied: {site}", applied=False)
        return
    in_map = st.maps.get(site.x)
    if site.depthwise and in_map is not None and site.op == "conv" and \
            site.c_out == site.c_in and in_map.axis == site.in_axis:
        return _carry_depthwise(st, site, in_map)
    m, why = required_multiple("gemm" if site.op == "linear" else "conv", ctx.target,
                               ctx.compute_dtype)
    if m is None and ctx.options.pad == "always":
        m = tc_alignment(peak_key(ctx.compute_dtype))
        why = f"padded to multiples of {m} although the {why}"
    illegal = _can_pad(site)
    ins = _input_choices(st, site, None if illegal else m)
    out_keep = ChannelMap.identity(site.out_axis, site.c_out)
    out_pad, g = out_keep, site.groups
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
        chosen, reason, gain, extra = _should_pad(st, site, keep, variants, m, why)
    _apply_gemm(st, site, chosen.inp, chosen.out, reason, gain, m, extra)


def _partner_cut_time(st: PadState, node: fx.Node) -> float:
    """Left unpadded, ``node`` forces a slice on padded partners of its add/sub/mul users."""
    seconds = 0.0
    for user in node.users:
        if aten_name(user) in ("add", "sub", "mul", "div"):
            for other in user.all_input_nodes:
                if other is not node and other in st.maps:
                    numel = math.prod(static_shape(other) or (0,))
                    seconds += copy_time(st.ctx, numel, numel)
    return seconds


def _apply_gemm(st: PadState, site: GemmSite, inp: _Input, out: ChannelMap, reason: str,
                gain: float, m: int | None, extra: dict[str, Any]) -> None:
    node, gm, in_map = site.node, st.gm, inp.reads
    x = site.x
    if x in st.maps and (inp.action == "slice" or (inp.action == "pad" and inp.src is not
                                                     st.maps[x])):
        x = slice_real(st, x, node, "padded input this GEMM cannot absorb")
    if inp.action == "pad":
        assert inp.src is not None
        x = pad_per_call(st, x, inp.src, in_map, node)
    if x is not site.x:
        node.update_arg(0, x)
    if in_map.is_padded or out.is_padded:
        w = get_tensor(gm, site.weight)
        assert w is not None
        if site.op == "conv_transpose":
            new_w = scatter_weight(w.transpose(0, 1), 1, in_map, out).transpose(0, 1)
        else:
            new_w = scatter_weight(w, site.groups, in_map, out)
        node.update_arg(1, new_param(gm, f"{node.name}_weight", new_w.contiguous(), node))
        b = get_tensor(gm, site.bias)
        if b is not None and out.is_padded:
            node.update_arg(2, new_param(gm, f"{node.name}_bias",
                                         scatter_vector(b, out.positions, out.size), node))
        st.changed = True
    applied = out.is_padded or inp.action == "pad"
    if out.is_padded:
        st.maps[node] = out
    if applied:
        st.padded.append(node.name)
    old_f = gemm_time(st.ctx, site, site.c_in, site.c_out)[1]
    new_f = gemm_time(st.ctx, site, in_map.size, out.size)[1]
    st.ctx.decide(node, "padding", reason, applied=applied, old=_dims(site, site.c_in, site.c_out),
                  new=_dims(site, in_map.size, out.size), multiple=m,
                  waste_pct=round(100 * (1 - old_f / new_f), 2), predicted_gain=round(gain, 3),
                  **extra)
    logger.debug("%s: %s -> %s (%s)", node.name, _dims(site, site.c_in, site.c_out),
                 _dims(site, in_map.size, out.size), reason)


def _carry_depthwise(st: PadState, site: GemmSite, in_map: ChannelMap) -> None:
    """Case 3: the depthwise conv runs on all padded channels, zero filters on padding."""
    node, gm = site.node, st.gm
    w = get_tensor(gm, site.weight)
    assert w is not None
    new_w = w.new_zeros((in_map.size, *w.shape[1:]))
    new_w[torch.tensor(in_map.positions, dtype=torch.long)] = w.detach()
    args = list(node.args) + [None] * (7 - len(node.args))
    args[1] = new_param(gm, f"{node.name}_weight", new_w, node)
    b = get_tensor(gm, site.bias)
    if b is not None:
        args[2] = new_param(gm, f"{node.name}_bias",
                            scatter_vector(b, in_map.positions, in_map.size), node)
    for i, default in ((3, 1), (4, 0), (5, 1)):
        args[i] = default if args[i] is None else args[i]
    args[6] = in_map.size
    node.args = tuple(args)
    st.maps[node] = in_map.moved(in_map.axis, clean=True)
    st.carried += 1
    st.changed = True
    st.ctx.decide(node, "padding", f"not applied: {_can_pad(site)}", applied=False,
                  old=_dims(site, site.c_in, site.c_out), new=_dims(site, site.c_in, site.c_out))
    st.ctx.decide(node, "padding_carry", f"carried: depthwise conv runs on the padded channels "
                  f"(groups {site.groups} -> {in_map.size}, zero filters on padding)",
                  old={"groups": site.groups}, new={"groups": in_map.size})


# --- attention (case 5) ------------------------------------------------------------------------

def _attention(st: PadState, node: fx.Node) -> None:
    """Case 5. An input already padded as a clean zero tail of the right size is used as is."""
    ctx, mode = st.ctx, st.ctx.options.pad
    qkv = node.args[:3]
    shapes = [static_shape(t) for t in qkv]
    if any(s is None or len(s) < 2 for s in shapes) or len(set(map(len, shapes))) != 1:
        cut_inputs(st, node, "SDPA with dynamic shapes")
        ctx.decide(node, "padding", "not applied: dynamic shapes", applied=False)
        return
    if any(0 in s for s in shapes):  # type: ignore[operator]
        cut_inputs(st, node, "SDPA of a zero-size tensor")
        ctx.decide(node, "padding", "not applied: a zero-size tensor: no work to speed up",
                   applied=False)
        return
    d, dv, nd = shapes[0][-1], shapes[2][-1], len(shapes[0])  # type: ignore[index]
    m, why = required_multiple("attention", ctx.target, ctx.compute_dtype)
    if m is None and mode == "always":
        m = tc_alignment(peak_key(ctx.compute_dtype))
        why = f"padded to multiples of {m} although the {why}"
    dp, dvp = (round_up(d, m), round_up(dv, m)) if m else (d, dv)
    want = {t: (dvp if i == 2 else dp) for i, t in enumerate(qkv)}  # q is k: same size
    numel = {t: math.prod(s) for t, s in zip(qkv, shapes, strict=True)}  # type: ignore[arg-type]
    padded = {t: st.maps[t] for t in want if t in st.maps}
    ready = {t for t, cm in padded.items() if cm.axis == nd - 1 and cm.is_prefix and cm.clean
             and cm.size == want[t]}
    t_keep, f_keep = attention_time(ctx, node, d, dv, d, dv)
    t_pad, f_pad = attention_time(ctx, node, d, dv, dp, dvp)
    for t, cm in padded.items():  # slices: always when kept, when not ready if padded
        copy = copy_time(ctx, numel[t] * cm.size // cm.real, numel[t])
        t_keep += copy
        t_pad += copy if t not in ready else 0.0
    for t in want:
        if t not in ready and want[t] != shapes[qkv.index(t)][-1]:  # type: ignore[index]
            t_pad += copy_time(ctx, numel[t], numel[t] * want[t] // shapes[qkv.index(t)][-1])
    out_map = ChannelMap(nd - 1, dvp, tuple(range(dv)))
    if dvp != dv:
        t_pad += downstream_cost(ctx, node, out_map, st.lookup, st.pending)[0]
    gain = t_keep / t_pad
    if mode == "never":
        reason = "not applied: pad='never'"
    elif m is None:
        reason = f"not applied: {why}"
    elif dp == d and dvp == dv:
        reason = f"not applied: head_dim already a multiple of {m}"
    elif mode == "always":
        reason = f"pad='always': {why}; scale kept at 1/sqrt({d})"
    elif gain >= ctx.options.pad_margin:
        reason = f"predicted {gain:.2f}x >= {ctx.options.pad_margin}x margin; scale kept"
    else:
        reason = f"not applied: predicted {gain:.2f}x < {ctx.options.pad_margin}x margin"
    applied = not reason.startswith("not applied")
    for t in want:
        x = t
        if t in padded and not (applied and t in ready):
            x = slice_real(st, t, node, "SDPA reads head_dim as a whole")
        if applied and t not in ready and want[t] != shapes[qkv.index(t)][-1]:  # type: ignore
            src = ChannelMap.identity(nd - 1, shapes[qkv.index(t)][-1])  # type: ignore[index]
            x = pad_per_call(st, x, src, replace(src, size=want[t]), node)
        if x is not t:
            node.replace_input_with(t, x)
    if applied:
        if node.kwargs.get("scale") is None:
            node.kwargs = {**node.kwargs, "scale": 1.0 / math.sqrt(d)}
        if dvp != dv:
            st.maps[node] = out_map
        st.padded.append(node.name)
        st.changed = True
    ctx.decide(node, "padding", reason, applied=applied,
               old={"head_dim": d, **({"head_dim_v": dv} if dv != d else {})},
               new={"head_dim": dp if applied else d,
                    **({"head_dim_v": dvp if applied else dv} if dv != d else {})},
               multiple=m, waste_pct=round(100 * (1 - f_keep / f_pad), 2) if applied else 0.0,
               predicted_gain=round(gain, 3) if (dp, dvp) != (d, dv) else 1.0)


# --- everything else (case 4) ------------------------------------------------------------------

def _propagate(st: PadState, node: fx.Node) -> None:
    if node.op == "output":
        return cut_inputs(st, node, "graph output")
    if aten_name(node) == "_assert_tensor_metadata" and node.kwargs.get("size") is None \
            and node.kwargs.get("stride") is None:
        return None  # checks dtype/device only (from .to()): padding changes neither
    rule = carry_rule(node, st.lookup)
    if not isinstance(rule, Carry):
        return cut_inputs(st, node, rule.reason)
    if rule.edit is not None:
        rule.edit(st.gm)
        st.changed = True
    st.maps[node] = rule.out
    st.carried += 1
    st.ctx.decide(node, "padding_carry", f"carried: {rule.reason} ({rule.out.real} real of "
                  f"{rule.out.size})", real=rule.out.real, padded=rule.out.size)


def pad_channels(gm: fx.GraphModule, ctx: RewriteContext) -> bool:
    """Pad GEMM-like channels to tensor-core multiples where legal and predicted faster."""
    st = PadState(gm, ctx)
    for node in list(gm.graph.nodes):
        site = gemm_site(node)
        if site is not None:
            _gemm(st, node, site)
        elif aten_name(node) == "scaled_dot_product_attention":
            _attention(st, node)
        elif any(n in st.maps for n in node.all_input_nodes):
            _propagate(st, node)
        st.done.add(node)
    ctx.notes["padding"] = {"mode": ctx.options.pad, "compute_dtype": ctx.compute_dtype,
                            "padded_nodes": list(st.padded), "carried": st.carried,
                            "slices": list(st.slices), "per_call_pads": list(st.pads)}
    if st.changed:
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
        refresh_meta(gm, ctx.example_inputs)
    logger.info("padding: %d nodes padded, %d carried, %d slices, %d per-call pads",
                len(st.padded), st.carried, len(st.slices), len(st.pads))
    return st.changed
