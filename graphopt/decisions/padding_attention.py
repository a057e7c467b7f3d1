"""Case 5 of the padding decision: attention with an unaligned head_dim.

q, k, v are padded per call with zero columns: ``q k^T`` is unchanged, so with the softmax
scale fixed at the original ``1/sqrt(d)`` the scores are the same, and zero columns of v give
zero output columns, carried or sliced away. An input already padded as a clean zero tail of
the right size is read as it is.
"""

from __future__ import annotations

import math

from graphopt.decisions.channel_map import ChannelMap, round_up
from graphopt.decisions.padding_cost import attention_time, copy_time
from graphopt.decisions.padding_downstream import downstream_cost
from graphopt.decisions.padding_sites import shape_of
from graphopt.decisions.padding_steps import AttentionStep
from graphopt.decisions.padding_sweep import Sweep
from graphopt.ir.graph import Node

__all__ = ["plan_attention"]


def _shapes(sw: Sweep, node: Node) -> list[tuple[int, ...]] | str:
    shapes = [shape_of(sw.graph, t) for t in node.inputs[:3]]
    if len(shapes) < 3 or any(s is None or len(s) < 2 or not all(isinstance(d, int) for d in s)
                              for s in shapes) or len(set(map(len, shapes))) != 1:  # type: ignore
        return "dynamic shapes"
    if any(0 in s for s in shapes):  # type: ignore[operator]
        return "a zero-size tensor: no work to speed up"
    if node.attrs.get("layout", "BHSD") != "BHSD" or len(node.inputs) > 4:
        return "an attention kernel with its own layout"
    return shapes  # type: ignore[return-value]


def plan_attention(sw: Sweep, node: Node) -> None:
    """Decide case 5 for one Attention node; records the decision and, if applied, a step."""
    backend, mode = sw.backend, sw.options.pad
    shapes = _shapes(sw, node)
    illegal = shapes if isinstance(shapes, str) else backend.cannot_edit(node)
    if illegal is not None:
        if any(t in sw.maps for t in node.inputs):
            sw.cut(node, f"attention with {illegal}" if isinstance(shapes, str) else illegal)
        backend.decide(node.name, "padding", f"not applied: {illegal}", applied=False)
        return
    assert not isinstance(shapes, str)
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
    if mode == "never":
        reason = "not applied: pad='never'"
    elif m is None:
        reason = f"not applied: {why}"
    elif dp == d and dvp == dv:
        reason = f"not applied: head_dim already a multiple of {m}"
    elif mode == "always":
        reason = f"pad='always': {why}; scale kept at 1/sqrt({d})"
    elif gain >= sw.options.pad_margin:
        reason = f"predicted {gain:.2f}x >= {sw.options.pad_margin}x margin; scale kept"
    else:
        reason = f"not applied: predicted {gain:.2f}x < {sw.options.pad_margin}x margin"
    applied = not reason.startswith("not applied")
    cut = [t for t in padded if not (applied and t in ready)]
    if cut:
        sw.cut(node, "attention reads head_dim as a whole", cut)
    if applied:
        pads = tuple((t, real[t], want[t]) for t in dict.fromkeys(qkv)
                     if t not in ready and want[t] != real[t])
        scale = 1.0 / math.sqrt(d) if node.attrs.get("scale") is None else None
        sw.plan.steps.append(AttentionStep(node, pads, tuple(sorted(ready)), scale,
                                           out_map if dvp != dv else None))
        sw.plan.pads.extend({"node": node.name, "source": t, "from": r, "to": w}
                            for t, r, w in pads)
        if dvp != dv:
            sw.maps[node.outputs[0]] = out_map
        sw.plan.padded.append(node.name)
    backend.decide(node.name, "padding", reason, applied=applied,
                   old={"head_dim": d, **({"head_dim_v": dv} if dv != d else {})},
                   new={"head_dim": dp if applied else d,
                        **({"head_dim_v": dvp if applied else dv} if dv != d else {})},
                   multiple=m, waste_pct=round(100 * (1 - f_keep / f_pad), 2) if applied else 0.0,
                   predicted_gain=round(gain, 3) if (dp, dvp) != (d, dv) else 1.0)
