"""What a padded output costs after its GEMM: carried bytes and slices, found by a dry run of
case 4 (the cases are numbered in :mod:`graphopt.decisions.padding`).

Cases 1-3 and 5 add these to a padded variant's time, so a pad that saves 5% in the GEMM but
forces a slice copy before a LayerNorm is not made.
"""

from __future__ import annotations

from graphopt.decisions.padding.carry import Carry, carry_rule
from graphopt.decisions.padding.channel_map import ChannelMap
from graphopt.decisions.padding.cost import copy_time, elem_bytes, stream_time
from graphopt.decisions.padding.sites import GemmSite, absorbs, numel, shape_of
from graphopt.decisions.padding.state import SweepState

__all__ = ["downstream_cost", "partner_cut_time"]


def downstream_cost(sw: SweepState, tensor: str, cmap: ChannelMap) -> tuple[float, int]:
    """(seconds, slices) a padded ``tensor`` would add downstream.

    Carried ops move ``size/real`` times the bytes; each padded tensor some reader cannot take
    is sliced once (one copy shared by its readers). A graph output counts as a copy on every
    backend: ONNX Runtime's Slice copies, and a torch view handed to the caller is strided
    memory the caller's next kernel pays for; one number keeps both backends' decisions equal.
    Operands of binary ops not produced yet
    (``pending``) are assumed to be padded the same way.
    """
    graph, backend = sw.graph, sw.backend
    hypo: dict[str, ChannelMap] = {tensor: cmap}
    outputs = set(graph.outputs)

    def look(t: str) -> ChannelMap | None:
        m = hypo.get(t) or sw.lookup(t)
        shape = shape_of(graph, t)
        if m is None and sw.pending(t) and shape is not None:
            for cand in reversed(list(hypo.values())):
                if len(shape) > cand.axis and shape[cand.axis] == cand.real:
                    return cand
        return m

    seconds, slices = 0.0, 0
    stack = [tensor]
    while stack:
        src = stack.pop()
        m = hypo[src]
        cuts = int(src in outputs)
        for user in graph.consumers.get(src, []):
            site = sw.site(user)
            rule = None
            if isinstance(site, GemmSite) and user.inputs[0] == src:
                if absorbs(site, m):
                    continue
                if site.depthwise and site.c_out == site.c_in and m.axis == site.in_axis:
                    rule = Carry(m.moved(m.axis, True), "depthwise")
            elif site is None and user.op_type != "Attention":
                rule = carry_rule(graph, user, look, sw.value)
            if isinstance(rule, Carry):
                a = backend.analysis(user.name)
                if a is not None:
                    ratio = elem_bytes(backend.compute_dtype) / elem_bytes(a.dtype or "fp32")
                    seconds += stream_time(backend, a.bytes_total * ratio * (m.size / m.real - 1))
                out = user.outputs[0]
                if out not in hypo:
                    hypo[out] = rule.out
                    stack.append(out)
                continue
            cuts += 1
        if cuts:
            n = numel(shape_of(graph, src))
            slices += cuts
            seconds += copy_time(backend, n * m.size // m.real, n)
    return seconds, slices


def partner_cut_time(sw: SweepState, tensor: str) -> float:
    """Left unpadded, ``tensor`` forces a slice on padded partners of its Add/Sub/Mul users."""
    seconds = 0.0
    for user in sw.graph.consumers.get(tensor, []):
        if user.op_type in ("Add", "Sub", "Mul", "Div"):
            for other in user.inputs:
                if other and other != tensor and other in sw.maps:
                    n = numel(shape_of(sw.graph, other))
                    seconds += copy_time(sw.backend, n, n)
    return seconds
