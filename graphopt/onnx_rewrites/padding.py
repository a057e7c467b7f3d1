"""ONNX tensor-core padding: Conv/Gemm/MatMul channels padded to aligned multiples.

Identity: zero padding does not change a GEMM's real outputs. With ``W'`` the weight placed at
the real channel positions and zero elsewhere (``padding_rules.scatter_weight``),
``y'[real] = W' x' = W x`` whatever ``x'`` holds at padded input positions, and
``y'[padded] = 0 + bias 0 = 0``. Sliced back to the real channels, every graph output is
bit-for-bit the original computation (modulo summation order inside the GEMM kernel).

Cases (the same rules as the torch pass, :mod:`graphopt.rewrites.padding`):

1. Conv (NCHW, groups 1), Gemm and MatMul with a constant 2-D weight: K and N padded to the
   multiple tensor cores want for ``ctx.compute_dtype`` (fp16/bf16 -> 8, tf32 -> 4, int8/fp8 ->
   16; ``padding_plan.required_multiple``). Padded weights and biases are new initializers,
   computed once; an input arriving unpadded is padded per call with a ``Pad`` (costed).
2. Grouped conv: its output padded per group when that pays; its input is never padded per
   call (an already padded input is absorbed when each group's channels stay in its block).
3. Depthwise conv is never padded itself; it carries a padded input (group -> padded size, zero
   filters on the padding).
4. Padded tensors are carried through channel-local ops (:mod:`.padding_carry`) and a
   ``Slice`` (or ``Gather`` for scattered maps) restores the real channels, under the original
   tensor name, before anything that would see the padding: graph outputs, reductions/norms
   over channels, reshapes that split the axis, subgraphs, unknown ops. A GEMM consumer absorbs
   the padding with zero weights wherever the real channels sit.

Legality (``gemm_site``, ``_can_pad``) is apart from profitability (``_should_pad``, the
roofline model in :mod:`.padding_cost`): with ``pad="auto"`` a node is padded only when
predicted at least ``pad_margin`` times faster (Inductor's pad_mm uses 1.1x), counting extra
FLOPs, per-call copies and the extra bytes of carried ops; ``"always"``/``"never"`` override.

Decisions: ``padding`` on every GEMM-like node; ``padding_carry`` on each op a padded tensor
passes through; ``padding_slice`` where it is cut; ``ctx.notes["padding"]`` sums them up. The
graph edits (Pad, Slice, renaming) are :mod:`.padding_edits`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import onnx

from graphopt.cost.roofline import peak_key, tc_alignment
from graphopt.decisions.channel_map import ChannelMap, round_up
from graphopt.decisions.padding_cost import required_multiple
from graphopt.onnx_rewrites.context import OnnxContext
from graphopt.onnx_rewrites.padding_carry import carry_rule
from graphopt.onnx_rewrites.padding_cost import copy_time, downstream_cost, gemm_time, numel
from graphopt.onnx_rewrites.padding_edits import PadState, finish, topo_order
from graphopt.onnx_rewrites.padding_rules import (
    Carry,
    ModelInfo,
    Site,
    absorbs,
    gemm_site,
    scatter_axis,
    scatter_weight,
)

__all__ = ["pad_channels"]

logger = logging.getLogger(__name__)


# --- GEMM-like nodes (cases 1-3) ---------------------------------------------------------------

def _dims(site: Site, c_in: int, c_out: int) -> dict[str, int]:
    if site.op != "conv":
        return {"K": c_in, "N": c_out}
    return {"C_in": c_in, "C_out": c_out, **({"groups": site.groups} if site.groups > 1 else {})}


def _can_pad(site: Site) -> str | None:
    if site.depthwise:
        return "depthwise conv (group == C_in): per-group padding would multiply the work"
    if site.op == "conv" and len(site.in_shape) < 3:
        return "a Conv without spatial dims"
    return None


@dataclass(frozen=True)
class _Input:
    """How a GEMM reads its input: unchanged, sliced to real channels, or padded per call."""

    action: str  # "none" | "slice" | "pad"
    reads: ChannelMap  # the layout the GEMM sees
    from_padded: bool = False  # reads (or pads) the padded tensor rather than the real one
    seconds: float = 0.0


def _input_choices(st: PadState, site: Site, m: int | None) -> dict[bool, _Input]:
    """The input as the GEMM reads it when it does not (False) or does (True) pad K."""
    in_map, per = st.maps.get(site.x), numel(site.in_shape) // site.c_in
    ident = ChannelMap.identity(site.in_axis, site.c_in)
    if in_map is not None and absorbs(site, in_map):
        keep = _Input("none", in_map, True)
    elif in_map is not None:  # padded, but not in a way this GEMM can absorb: slice
        keep = _Input("slice", ident, seconds=copy_time(st.ctx, per * in_map.size,
                                                         per * site.c_in))
    else:
        keep = _Input("none", ident)
    if m is None or site.groups > 1 or keep.reads.size % m == 0:
        return {False: keep, True: keep}
    dst = replace(keep.reads, size=round_up(keep.reads.size, m))
    seconds = keep.seconds + copy_time(st.ctx, per * keep.reads.size, per * dst.size)
    return {False: keep, True: _Input("pad", dst, keep.from_padded, seconds)}


@dataclass(frozen=True)
class _Variant:
    inp: _Input
    out: ChannelMap

    def changes(self, keep: _Variant) -> bool:
        return self.inp is not keep.inp or self.out is not keep.out


def _partner_cut_time(st: PadState, site: Site) -> float:
    """Left unpadded, the node forces a slice on padded partners of its Add/Sub/Mul users."""
    seconds = 0.0
    for user in st.info.users.get(site.node.output[0], []):
        if user.op_type in ("Add", "Sub", "Mul", "Div"):
            for other in user.input:
                if other != site.node.output[0] and other in st.maps:
                    n = numel(st.info.shape(other))
                    seconds += copy_time(st.ctx, n, n)
    return seconds


def _variant_time(st: PadState, site: Site, v: _Variant) -> float:
    t = gemm_time(st.ctx, site, v.inp.reads.size, v.out.size)[0] + v.inp.seconds
    if v.out.is_padded:
        return t + downstream_cost(st.ctx, st.info, site.node.output[0], v.out, st.lookup,
                                   st.pending)[0]
    return t + _partner_cut_time(st, site)


def _should_pad(st: PadState, site: Site, keep: _Variant, variants: list[_Variant],
                m: int | None, why: str) -> tuple[_Variant, str, float, dict[str, Any]]:
    """Profitability: (chosen variant, reason, predicted gain over ``keep``, extra fields)."""
    mode, margin, g = st.ctx.options.pad, st.ctx.options.pad_margin, site.groups
    if mode == "never":
        return keep, "not applied: pad='never'", 1.0, {}
    if m is None:
        return keep, f"not applied: {why}", 1.0, {}
    if (keep.inp.reads.size // g) % m == 0 and (site.c_out // g) % m == 0:
        names = "K and N" if site.op != "conv" else "C_in and C_out" + (
            " per group" if g > 1 else "")
        return keep, f"not applied: {names} already multiples of {m}", 1.0, {}
    t_keep = _variant_time(st, site, keep)
    if mode == "always":
        full = variants[-1]
        return full, f"pad='always': {why}", t_keep / _variant_time(st, site, full), {}
    times = {id(v): _variant_time(st, site, v) for v in variants if v.changes(keep)}
    if not times:
        return keep, "not applied: no legal padded variant", 1.0, {}
    best = min((v for v in variants if id(v) in times), key=lambda v: times[id(v)])
    gain = t_keep / times[id(best)]
    if gain >= margin:
        return best, f"predicted {gain:.2f}x >= {margin}x margin", gain, {}
    return keep, f"not applied: predicted {gain:.2f}x < {margin}x margin", gain, {
        "candidate": _dims(site, best.inp.reads.size, best.out.size)}


def _gemm(st: PadState, idx: int, site: Site | str) -> None:
    """Cases 1-3: legality, then profitability, then the rewrite; one decision per node."""
    ctx, node = st.ctx, st.model.graph.node[idx]
    if isinstance(site, str):
        if any(i in st.maps for i in node.input):
            st.cut_inputs(node, site)
        ctx.decide(node.name, "padding", f"not applied: {site}", applied=False)
        return
    in_map = st.maps.get(site.x)
    if site.depthwise and in_map is not None and site.c_out == site.c_in and in_map.axis == 1:
        return _carry_depthwise(st, site, in_map)
    m, why = required_multiple("gemm" if site.op != "conv" else "conv", ctx.target,
                               ctx.compute_dtype)
    if m is None and ctx.options.pad == "always":
        m = tc_alignment(peak_key(ctx.compute_dtype))
        why = f"padded to multiples of {m} although the {why}"
    illegal = _can_pad(site)
    ins = _input_choices(st, site, None if illegal else m)
    out_keep, g = ChannelMap.identity(site.out_axis, site.c_out), site.groups
    out_pad = out_keep
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
    _apply_gemm(st, idx, site, chosen, reason, gain, m, extra)


def _bias(site: Site, out: ChannelMap) -> tuple[np.ndarray | None, bool]:
    """The padded bias, and whether the padded outputs stay exact zeros."""
    b = site.bias
    if b is None or not out.is_padded:
        return None, True
    if site.op == "conv" or (b.ndim >= 1 and b.shape[-1] == site.c_out):
        return scatter_axis(b, b.ndim - 1, out.positions, out.size), True
    return None, not bool(np.any(b))  # a Gemm C broadcast over N writes beta*C to the padding


def _apply_gemm(st: PadState, idx: int, site: Site, v: _Variant, reason: str, gain: float,
                m: int | None, extra: dict[str, Any]) -> None:
    node, inp, out = site.node, v.inp, v.out
    if inp.action == "slice" or (site.x in st.maps and not inp.from_padded):
        st.cut(site.x, node.name, "padded input this GEMM cannot absorb")
    elif inp.from_padded:
        node.input[0] = st.names[site.x]
    if inp.action == "pad":
        src = st.maps[site.x] if inp.from_padded else \
            ChannelMap.identity(site.in_axis, site.c_in)
        node.input[0] = st.pad_per_call(node.input[0], len(site.in_shape), src, inp.reads, idx,
                                        node)
    in_map = inp.reads
    if in_map.is_padded or out.is_padded:
        w = site.weight if site.op == "conv" else (site.weight if site.trans_b else site.weight.T)
        new_w = scatter_weight(w, site.groups, in_map, out)
        if site.op != "conv" and not site.trans_b:
            new_w = np.ascontiguousarray(new_w.T)
        st.replace_input(node, 1, f"{node.name}_weight", new_w)
        bias, clean = _bias(site, out)
        if bias is not None:
            st.replace_input(node, 2, f"{node.name}_bias", bias)
        out = out.moved(out.axis, clean)
    applied = out.is_padded or inp.action == "pad"
    if out.is_padded:
        st.set_padded(node, out)
    if applied:
        st.padded.append(node.name)
    old_f = gemm_time(st.ctx, site, site.c_in, site.c_out)[1]
    new_f = gemm_time(st.ctx, site, in_map.size, out.size)[1]
    st.ctx.decide(node.name, "padding", reason, applied=applied,
                  old=_dims(site, site.c_in, site.c_out), new=_dims(site, in_map.size, out.size),
                  multiple=m, waste_pct=round(100 * (1 - old_f / new_f), 2),
                  predicted_gain=round(gain, 3), **extra)
    logger.debug("%s: %s -> %s (%s)", node.name, _dims(site, site.c_in, site.c_out),
                 _dims(site, in_map.size, out.size), reason)


def _carry_depthwise(st: PadState, site: Site, in_map: ChannelMap) -> None:
    """Case 3: the depthwise conv runs on all padded channels, zero filters on padding."""
    node = site.node
    st.read_padded(node)
    st.replace_input(node, 1, f"{node.name}_weight",
                     scatter_axis(site.weight, 0, in_map.positions, in_map.size))
    if site.bias is not None:
        st.replace_input(node, 2, f"{node.name}_bias",
                         scatter_axis(site.bias, 0, in_map.positions, in_map.size))
    for a in node.attribute:
        if a.name == "group":
            a.i = in_map.size
    st.set_padded(node, in_map.moved(1, clean=True))
    st.carried += 1
    st.ctx.decide(node.name, "padding", "not applied: depthwise conv (group == C_in): per-group "
                  "padding would multiply the work", applied=False,
                  old=_dims(site, site.c_in, site.c_out), new=_dims(site, site.c_in, site.c_out))
    st.ctx.decide(node.name, "padding_carry", f"carried: depthwise conv runs on the padded "
                  f"channels (group {site.groups} -> {in_map.size}, zero filters on padding)",
                  old={"group": site.groups}, new={"group": in_map.size})


# --- everything else (case 4) ------------------------------------------------------------------

def _propagate(st: PadState, node: onnx.NodeProto) -> None:
    rule = carry_rule(node, st.lookup, st.info)
    if not isinstance(rule, Carry):
        return st.cut_inputs(node, rule.reason)
    if rule.edit is not None:
        rule.edit(st)
    st.read_padded(node)
    st.set_padded(node, rule.out)
    st.carried += 1
    st.ctx.decide(node.name, "padding_carry", f"carried: {rule.reason} ({rule.out.real} real of "
                  f"{rule.out.size})", real=rule.out.real, padded=rule.out.size,
                  clean=rule.out.clean)


def pad_channels(model: onnx.ModelProto, ctx: OnnxContext) -> onnx.ModelProto | None:
    """Pad GEMM-like channels to tensor-core multiples where legal and predicted faster.

    Returns a new model, or None when nothing was padded; ``model`` is never modified.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    available = {t.name for t in g.initializer} | {i.name for i in g.input}
    order = topo_order(list(g.node), available)
    del g.node[:]
    g.node.extend(order)  # indices below are positions in this order
    st = PadState(out, ModelInfo(out), ctx, produced=set(available))
    st.used_names = {o for n in g.node for o in (*n.output, n.name)} | available
    for idx, node in enumerate(g.node):
        site = gemm_site(node, st.info)
        if site is not None:
            _gemm(st, idx, site)
        elif any(i in st.maps for i in node.input):
            _propagate(st, node)
        st.produced.update(node.output)
    changed = bool(st.maps or st.pads)
    if changed:
        finish(st, list(g.node))
    ctx.notes["padding"] = {"mode": ctx.options.pad, "compute_dtype": ctx.compute_dtype,
                            "padded_nodes": list(st.padded), "carried": st.carried,
                            "slices": list(st.slices), "per_call_pads": list(st.pads)}
    logger.info("padding: %d nodes padded, %d carried, %d slices, %d per-call pads",
                len(st.padded), st.carried, len(st.need_slice), len(st.pads))
    return out if changed else None
