"""Case 5 of :mod:`graphopt.decisions.padding`: attention with an unaligned head_dim.

q, k, v are padded per call with zero columns: ``q k^T`` is unchanged, so with the softmax
scale fixed at the original ``1/sqrt(d)`` the scores are the same, and zero columns of v give
zero output columns, carried or sliced away. An input already padded as a clean zero tail of
the right size is read as it is.
"""

from __future__ import annotations

import math

from graphopt.decisions.padding.channel_map import ChannelMap, round_up
from graphopt.decisions.padding.cost import attention_time, copy_time
from graphopt.decisions.padding.downstream import downstream_cost
from graphopt.decisions.padding.sites import shape_of
from graphopt.decisions.padding.state import Decided, Outcome, SweepState, cut
from graphopt.decisions.padding.steps import AttentionStep
from graphopt.ir.decision_details import PaddingDetail, PaddingSkip
from graphopt.ir.graph import Node
from graphopt.ir.plan_sections import PerCallPad

__all__ = ["plan_attention"]


def _shapes(sw: SweepState, node: Node) -> list[tuple[int, ...]] | str:
    shapes = [shape_of(sw.graph, t) for t in node.inputs[:3]]
    if len(shapes) < 3 or any(s is None or len(s) < 2 or not all(isinstance(d, int) for d in s)
                              for s in shapes) or len(set(map(len, shapes))) != 1:  # type: ignore
        return "dynamic shapes"
    if any(0 in s for s in shapes):  # type: ignore[operator]
        return "a zero-size tensor: no work to speed up"
    if node.attrs.get("layout", "BHSD") != "BHSD" or len(node.inputs) > 4:
        return "an attention kernel with its own layout"
    return shapes  # type: ignore[return-value]


def _verdict(sw: SweepState, m: int | None, why: str, d: int, dp: int, dv: int, dvp: int,
             gain: float) -> tuple[bool, str]:
    """Profitability: (applied, reason)."""
    mode, margin = sw.options.pad, sw.options.pad_margin
    if mode == "never":
        return False, "not applied: pad='never'"
    if m is None:
        return False, f"not applied: {why}"
    if dp == d and dvp == dv:
        return False, f"not applied: head_dim already a multiple of {m}"
    if mode == "always":
        return True, f"pad='always': {why}; scale kept at 1/sqrt({d})"
    if gain >= margin:
        return True, f"predicted {gain:.2f}x >= {margin}x margin; scale kept"
    return False, f"not applied: predicted {gain:.2f}x < {margin}x margin"


def _illegal(sw: SweepState, node: Node, cut_reason: str, why: str) -> Outcome:
    """Not legal here: cut what reaches the node padded, and say why."""
    cuts = cut(sw, node, cut_reason) if any(t in sw.maps for t in node.inputs) else Outcome()
    return cuts + Outcome(decided=(Decided(node.name, PaddingSkip(), f"not applied: {why}",
                                           applied=False),))


def plan_attention(sw: SweepState, node: Node) -> Outcome:
    """Decide case 5 for one Attention node: its decision and, if applied, a step."""
    backend = sw.backend
    shapes = _shapes(sw, node)
    if isinstance(shapes, str):
        return _illegal(sw, node, f"attention with {shapes}", shapes)
    if not (editable := backend.can_edit(node)):
        return _illegal(sw, node, editable.reason, editable.reason)
    qkv = node.inputs[:3]
    d, dv, nd = shapes[0][-1], shapes[2][-1], len(shapes[0])
    m, why = sw.multiple("attention")
    dp, dvp = (round_up(d, m), round_up(dv, m)) if m else (d, dv)
    want = {t: (dvp if i == 2 else dp) for i, t in enumerate(qkv)}  # q is k: same size
    real = {t: s[-1] for t, s in zip(qkv, shapes, strict=False)}
    count = {t: math.prod(s) for t, s in zip(qkv, shapes, strict=False)}
    padded = {t: sw.maps[t] for t in want if t in sw.maps}
    ready = {t for t, cm in padded.items() if cm.axis == nd - 1 and cm.is_prefix and cm.clean
             and cm.size == want[t]}
    a = backend.analysis(node.name)
    t_keep, f_keep = attention_time(backend, a, shapes, d, dv)
    t_pad, f_pad = attention_time(backend, a, shapes, dp, dvp)
    for t, cm in padded.items():  # slices: always when kept, when not ready if padded
        copy = copy_time(backend, count[t] * cm.size // cm.real, count[t])
        t_keep += copy
        t_pad += copy if t not in ready else 0.0
    for t in want:
        if t not in ready and want[t] != real[t]:
            t_pad += copy_time(backend, count[t], count[t] * want[t] // real[t])
    out_map = ChannelMap(nd - 1, dvp, tuple(range(dv)))
    if dvp != dv:
        t_pad += downstream_cost(sw, node.outputs[0], out_map)[0]
    gain = t_keep / t_pad
    applied, reason = _verdict(sw, m, why, d, dp, dv, dvp, gain)
    cuts = [t for t in padded if not (applied and t in ready)]
    out = cut(sw, node, "attention reads head_dim as a whole", cuts) if cuts else Outcome()
    if applied:
        pads = tuple((t, real[t], want[t]) for t in dict.fromkeys(qkv)
                     if t not in ready and want[t] != real[t])
        scale = 1.0 / math.sqrt(d) if node.attrs.get("scale") is None else None
        out += Outcome(
            steps=(AttentionStep(node, pads, tuple(sorted(ready)), scale,
                                 out_map if dvp != dv else None),),
            pads=tuple(PerCallPad(node.name, t, r, w) for t, r, w in pads),
            maps=((node.outputs[0], out_map),) if dvp != dv else (), padded=(node.name,))
    detail = PaddingDetail(
        old={"head_dim": d, **({"head_dim_v": dv} if dv != d else {})},
        new={"head_dim": dp if applied else d,
             **({"head_dim_v": dvp if applied else dv} if dv != d else {})},
        multiple=m, waste_pct=round(100 * (1 - f_keep / f_pad), 2) if applied else 0.0,
        predicted_gain=round(gain, 3) if (dp, dvp) != (d, dv) else 1.0)
    return out + Outcome(decided=(Decided(node.name, detail, reason, applied),))
