"""Run conv regions in channels_last (NHWC) where the cost model says it pays.

Identity: memory format changes strides, never values. Every op of a region
(:data:`~graphopt.rewrites.layout_regions.AGNOSTIC`) is defined on logical indices, so with
``x' = x.contiguous(memory_format=channels_last)`` at each region entry, conv weights
``W' = W.contiguous(memory_format=channels_last)`` and ``y = y'.contiguous()`` at each exit,
every value outside the region is unchanged; only the summation order inside a conv kernel may
differ (fp32 tolerance). ``y'.contiguous()`` also gives graph outputs the strides the user got.

Cases (numbers refer to these in comments):

1. ``layout="keep"``: nothing changes; each conv says so.
2. Not legal, conv kept NCHW and acting as a region boundary: transposed convs; convs whose
   weight is computed at run time (it would be converted on every call).
3. Known slow cases, kept NCHW in ``auto`` (``layout="channels_last"`` overrides, and says so):
   grouped convs with more than one channel per group on GPUs (cuDNN's NHWC grouped kernels,
   pytorch/pytorch#70954, #34977) and fp32 convs on Volta (sm_70 has no NHWC fp32
   tensor-core path; no TF32 either).
4. Profitability per region (``should_channels_last``): the time NCHW costs the region's convs
   (GPU: cuDNN transposes each tensor-core conv's input and output, NVIDIA "Convolutional
   Layers User's Guide", NCHW vs NHWC; CPU: oneDNN reorders NCHW per call, measured, see
   ``_CPU_GAIN``) must beat the entry/exit conversions it adds by ``_MARGIN``.
5. ``layout="channels_last"``: every region of case 4 is converted, paying or not.
6. Idempotence: conversions and channels_last weights already in place are reused.

``ctx.notes["layout"]`` counts conversions per region and overall; each conv gets a
``"layout"`` decision with ``format`` and ``region``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from graphopt.cost.roofline import efficiency, tc_alignment
from graphopt.hardware.profile import HardwareProfile
from graphopt.rewrites.context import RewriteContext, torch_dtype
from graphopt.rewrites.fx_utils import aten_name, get_tensor, new_param, val
from graphopt.rewrites.layout_regions import (
    ConvInfo,
    Region,
    conv_info,
    find_regions,
    is_entry_conversion,
    is_exit_conversion,
    memory_format_for,
    weight_needs_conversion,
)

__all__ = ["LayoutEstimate", "can_channels_last", "channels_last", "conversion_time_s",
           "known_slow_case", "should_channels_last"]

logger = logging.getLogger(__name__)

#: a region must be predicted this much faster (the factor Inductor's pad_mm asks of padding)
_MARGIN = 1.1

# CPU rule, measured with benchmarks/bench_layout_cpu.py: torch 2.13 CPU, oneDNN 3.12, fp32,
# batch 8, 2 threads, on a 2-core "Intel Xeon @ 2.50GHz" KVM guest (Cascade Lake: AVX-512 +
# VNNI, ATen capability AVX512) shared with other jobs. First numbers: the quietest run (other
# load <= 0.1 core); ranges: 5 runs, the others under 1-4 cores of other load.
#
# Time a conv saves in channels_last, in units of converting that conv's own input to
# channels_last plus its output back to NCHW (the copies the pass would add around it alone):
# oneDNN reorders NCHW activations into its blocked layout and back on every call. Part 1
# "gain"; values at or below the quiet run's.
_CPU_GAIN = {
    "spatial": 0.75,    # dense kxk, k > 1, 64-512 ch at 56..14: median 0.78 (0.65-1.43)
    "pointwise": 0.5,   # dense 1x1, 64-256 ch at 56 and 14: 0.59-0.84 (0.48-1.7)
    "depthwise": 0.25,  # 1 channel per group, 128 at 56 / 512 at 14: 0.27, 0.53 (0.23-1.2)
    "grouped": 0.0,     # 4-16 channels per group: 0.01-0.08 (up to 0.6 in noisy runs)
    "thin_input": 0.1,  # <= 4 input channels, 7x7/2 image stem: 0.10 (0.05-1.05)
}
_CPU_THIN_INPUT = 4
# Boundary copies cost more inside a block than alone (cache and allocator state): part 3
# measured 0.5-1.5x their isolated time (2.5x at 7x7 where they take 0.3 ms), an ad-hoc run of
# the 64-channel basic block 1.7x. With 1.5 an isolated 2-conv basic block (measured 0.87-1.30x
# converted: not reliably faster) stays NCHW; 3+ conv regions and whole nets convert.
_CPU_BOUNDARY_FACTOR = 1.5
# Dense kxk convs on maps under 14x14 run slower in NHWC: 3x3 512->512 at 7x7 0.95x (0.78-0.99),
# while its activations are too small for the reorders to matter. Modelled as a loss of this
# fraction of the conv's roofline time (within ~1.5x of measured there). 1x1 at 7x7 measured
# 0.93x (0.93-1.5): neither gain nor loss.
# Check through the pass (part 2, quiet run): small ResNet, ResNet-18-like and MobileNet-like
# nets at 224 convert and run 1.25-1.71x; what the rule keeps NCHW ran 0.36-1.19x forced.
_CPU_SMALL_MAP = 14 * 14
_CPU_SMALL_MAP_LOSS = 0.15

# Achieved fraction of the streaming-copy rate (``efficiency(kind, "memory")`` x bandwidth) of an
# NCHW <-> NHWC transposing copy. CPU: measured by the benchmark (to channels_last ~0.2-0.4 ms
# per MB, to NCHW 0.25-1.1 ms/MB against 0.14 ms/MB streaming on this host's 20 GB/s profile).
# GPU: tiled transposes run near copy bandwidth (assumed; the same factor prices cuDNN's
# internal transposes and ours, so it cancels in the decision).
_TRANSPOSE_EFF = {"cpu": 0.3, "gpu": 1.0}
_TC_DTYPES = ("fp16", "bf16")
_CONV_NAMES = frozenset({"conv2d", "conv3d", "convolution", "conv_transpose2d",
                         "conv_transpose3d"})


@dataclass(frozen=True)
class LayoutEstimate:
    """Predicted effect of converting one region."""

    gain_s: float  # NCHW time the region's convs save in channels_last
    cost_s: float  # time of the entry/exit conversions it still needs
    apply: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"gain_s": self.gain_s, "cost_s": self.cost_s, "apply": self.apply,
                "reason": self.reason}


def conversion_time_s(t: torch.Tensor | None, target: HardwareProfile, itemsize: int) -> float:
    """One NCHW <-> NHWC copy of ``t``: free when spatial dims are all 1 (both layouts at once)."""
    if t is None or t.dim() < 4 or t.shape[2:].numel() == 1:
        return 0.0
    bw = target.bandwidth_bytes_per_s * efficiency(target.kind, "memory") \
        * _TRANSPOSE_EFF[target.kind]
    return target.launch_overhead_s + 2 * t.numel() * itemsize / bw  # read + write


def can_channels_last(info: ConvInfo | None) -> str | None:
    """Legality (case 2): None if the conv may join a region, else why not."""
    if info is None:
        return "not a 2-D/3-D conv with traced shapes (transposed convs stay NCHW)"
    if info.transposed:
        return "transposed conv (left in NCHW)"
    if info.weight is None:
        return "its weight is computed at run time and would be converted on every call"
    return None


def known_slow_case(info: ConvInfo, ctx: RewriteContext) -> str | None:
    """Case 3: a conv known to run slower in NHWC on the target, or None."""
    target = ctx.target
    if not target.is_gpu:
        return None
    if info.grouped:
        return (f"grouped conv with {info.channels_per_group} channels per group: cuDNN's NHWC "
                "grouped kernels are slow (pytorch/pytorch#70954, #34977)")
    if target.compute_capability == (7, 0) and ctx.compute_dtype in ("fp32", "tf32"):
        return ("fp32 conv on Volta (sm_70): no NHWC fp32 tensor-core path, cuDNN's NCHW fp32 "
                "kernels are the fast ones")
    return None


def _cpu_class(info: ConvInfo) -> str:
    if info.out_spatial < _CPU_SMALL_MAP:
        return "small_map"
    if info.depthwise:
        return "depthwise"
    if info.grouped:
        return "grouped"
    if info.channels_per_group <= _CPU_THIN_INPUT:
        return "thin_input"
    return "pointwise" if all(k == 1 for k in info.kernel) else "spatial"


def _conv_gain_s(node: fx.Node, info: ConvInfo, ctx: RewriteContext, itemsize: int
                 ) -> tuple[float, str]:
    """(time NCHW costs this conv over NHWC, why) on the target (case 4)."""
    target = ctx.target
    x = node.args[0]
    io = conversion_time_s(val(x) if isinstance(x, fx.Node) else None, target, itemsize) \
        + conversion_time_s(val(node), target, itemsize)
    if target.is_gpu:
        dtype = ctx.compute_dtype
        if dtype not in _TC_DTYPES:
            return 0.0, (f"compute dtype {dtype}: channels_last is modelled to pay only for "
                         "fp16/bf16 tensor-core convs")
        if dtype not in target.peak_flops:
            return 0.0, f"no {dtype} tensor cores on {target.generation}"
        align = tc_alignment(dtype)
        cc = target.compute_capability
        if cc is not None and cc < (8, 0) and (info.channels_per_group % align
                                               or (info.c_out // info.groups) % align):
            # roofline.py case 2: Volta/Turing run misaligned convs without tensor cores
            return 0.0, (f"channels not a multiple of {align}: no tensor cores on "
                         f"{target.generation}, so cuDNN's NCHW kernel needs no transposes")
        return io, "cuDNN transposes an NCHW tensor-core conv's input and output"
    if not torch.backends.mkldnn.is_available():
        return 0.0, "this torch has no oneDNN: CPU convs gain nothing from NHWC"
    kind = _cpu_class(info)
    if kind == "small_map":
        if all(k == 1 for k in info.kernel) or info.groups > 1:
            return 0.0, "no CPU gain modelled for 1x1 or grouped convs on maps under 14x14"
        return (-_CPU_SMALL_MAP_LOSS * ctx.est_time_s(node),
                "oneDNN's NHWC kernels are slower for dense convs on maps under 14x14")
    return _CPU_GAIN[kind] * io, f"oneDNN reorders NCHW activations per call ({kind} conv)"


def should_channels_last(region: Region, ctx: RewriteContext) -> LayoutEstimate:
    """Profitability of one region: conv gains against the conversions still needed."""
    itemsize = torch.finfo(torch_dtype(ctx.compute_dtype)).bits // 8
    gain = 0.0
    whys: set[str] = set()
    for conv in region.convs:
        info = conv_info(conv, itemsize)
        if info is not None:
            g, why = _conv_gain_s(conv, info, ctx, itemsize)
            gain += g
            whys.add(why)
    cost = sum(conversion_time_s(val(e), ctx.target, itemsize) for e in region.new_entries()) \
        + sum(conversion_time_s(val(m), ctx.target, itemsize) for m in region.new_exits())
    if not ctx.target.is_gpu:
        cost *= _CPU_BOUNDARY_FACTOR
    numbers = (f"{len(region.convs)} conv(s) save {gain * 1e6:.1f} us, conversions cost "
               f"{cost * 1e6:.1f} us")
    if region.entries and not region.new_entries() and not region.new_exits():
        return LayoutEstimate(gain, 0.0, True, "already channels_last (its conversions are in "
                              "place)")
    if ctx.options.layout == "channels_last":
        return LayoutEstimate(gain, cost, True, f"forced by layout=channels_last ({numbers})")
    if gain > 0 and gain > _MARGIN * cost:
        return LayoutEstimate(gain, cost, True, f"predicted to pay: {numbers}; "
                              + "; ".join(sorted(whys)))
    return LayoutEstimate(gain, cost, False, f"not applied because the gain does not beat "
                          f"{_MARGIN}x the conversions: {numbers}; " + "; ".join(sorted(whys)))


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


def channels_last(gm: fx.GraphModule, ctx: RewriteContext) -> bool:
    """The layout pass: find conv regions, decide each (cases 1-5), convert the chosen ones."""
    mode = ctx.options.layout
    convs = {n: conv_info(n) for n in gm.graph.nodes if aten_name(n) in _CONV_NAMES}
    if mode == "keep":
        for conv in convs:
            ctx.decide(conv, "layout", "kept: layout=keep", applied=False, format="nchw",
                       region=None)
        ctx.notes["layout"] = {"mode": mode, "regions": [], "conversions": 0, "inserted": 0}
        return False
    excluded: dict[fx.Node, str] = {}
    for conv, info in convs.items():
        reason = can_channels_last(info)
        if reason is None and info is not None:
            slow = known_slow_case(info, ctx)
            if slow is not None and mode == "auto":
                reason = slow
        if reason is not None:
            excluded[conv] = reason
            ctx.decide(conv, "layout", f"kept NCHW: {reason}", applied=False, format="nchw",
                       region=None)
    changed = False
    summaries: list[dict[str, Any]] = []
    for region in find_regions(gm, excluded):
        est = should_channels_last(region, ctx)
        entries, exits = len(region.entries), len(region.exits)
        inserted = weights = 0
        if est.apply:
            new_in, new_out, weights = _apply(gm, region)
            inserted = new_in + new_out
            changed |= inserted + weights > 0
        for conv in region.convs:
            info = convs.get(conv)
            slow = known_slow_case(info, ctx) if info is not None else None
            note = f" (known slow case: {slow})" if slow and est.apply else ""
            if est.apply:
                ctx.decide(conv, "layout", f"channels_last: region {region.id} {est.reason}"
                           f"{note}", format="channels_last", region=region.id)
            else:
                ctx.decide(conv, "layout", f"kept NCHW: region {region.id} {est.reason}",
                           applied=False, format="nchw", region=region.id)
        summaries.append({"id": region.id, "ops": len(region.nodes),
                          "convs": [c.name for c in region.convs], "applied": est.apply,
                          "entries": entries if est.apply else 0,
                          "exits": exits if est.apply else 0,
                          "conversions": entries + exits if est.apply else 0,
                          "inserted": inserted, "weights_converted": weights, **est.to_dict()})
        logger.debug("layout region %d: %s", region.id, est.reason)
    total = sum(s["conversions"] for s in summaries)
    inserted = sum(s["inserted"] for s in summaries)
    ctx.notes["layout"] = {"mode": mode, "regions": summaries, "conversions": total,
                           "inserted": inserted}
    logger.info("layout: %d of %d region(s) channels_last, %d conversion(s) (%d new)",
                sum(s["applied"] for s in summaries), len(summaries), total, inserted)
    return changed
