"""Which convs run channels_last (NHWC): decided once on the plan, applied by each backend.

The torch backend (:mod:`graphopt.backends.torch.layout`) converts fx regions; the ONNX backend
(:mod:`graphopt.backends.onnx.session`) sets ORT's ``prefer_nhwc``. Both read this module's
:class:`LayoutPlan`, so the same model gets the same answer and reason on both. No torch here.

Identity the backends rely on: memory format changes strides, never values; a region of
layout-agnostic ops (:mod:`graphopt.decisions.layout.regions`) gives the same values with NHWC
data between an entry conversion and an exit conversion.

Cases (numbers refer to these in comments and reasons):

1. ``layout="keep"``: nothing changes; each conv says so.
2. Not legal, conv kept NCHW and acting as a region boundary (``can_channels_last``):
   transposed convs; convs whose weight is computed at run time (converted on every call).
3. Known slow cases, kept NCHW in ``auto`` (``layout="channels_last"`` overrides, and says so):
   grouped convs with more than one channel per group on GPUs (cuDNN's NHWC grouped kernels,
   pytorch/pytorch#70954, #34977) and fp32 convs on Volta (sm_70 has no NHWC fp32
   tensor-core path; no TF32 either).
4. Profitability per region (``should_channels_last``): the time NCHW costs the region's convs
   (GPU: cuDNN transposes each tensor-core conv's input and output, NVIDIA "Convolutional
   Layers User's Guide", NCHW vs NHWC; CPU: oneDNN reorders NCHW per call, measured, see
   ``_CPU_GAIN``) must beat the entry/exit conversions it adds by ``MARGIN``.
5. ``layout="channels_last"``: every region of case 4 is converted, paying or not.

Model level (``LayoutPlan.nhwc``, for backends with one switch per model such as ORT's
``prefer_nhwc``): NHWC when the convs decided channels_last hold at least half the convs'
estimated time.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from graphopt.cost.roofline import efficiency, tc_alignment
from graphopt.decisions.layout.conv_facts import (
    CONVS,
    ConvFacts,
    ConvShape,
    conv_facts,
    static_dims,
)
from graphopt.decisions.layout.regions import PlanRegion, plan_regions
from graphopt.hardware.profile import HardwareProfile
from graphopt.ir.decision_details import LayoutDetail, LayoutFormat
from graphopt.ir.legality import Legality
from graphopt.ir.plan import Plan
from graphopt.ir.plan_sections import LayoutRegion, LayoutSummary

__all__ = ["MARGIN", "ConvLayout", "LayoutEstimate", "LayoutPlan", "can_channels_last",
           "conv_gain_s", "conversion_time_s", "cpu_class", "decide_layout", "known_slow_case",
           "should_channels_last"]

logger = logging.getLogger(__name__)

#: a region must be predicted this much faster (the factor Inductor's pad_mm asks of padding)
MARGIN = 1.1

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
_ITEMSIZE = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2}


def conversion_time_s(shape: tuple[int, ...] | None, target: HardwareProfile,
                      itemsize: int) -> float:
    """One NCHW <-> NHWC copy: free when spatial dims are all 1 (both layouts at once)."""
    if shape is None or len(shape) < 4 or math.prod(shape[2:]) == 1:
        return 0.0
    bw = target.bandwidth_bytes_per_s * efficiency(target.kind, "memory") \
        * _TRANSPOSE_EFF[target.kind]
    return target.launch_overhead_s + 2 * math.prod(shape) * itemsize / bw  # read + write


def can_channels_last(facts: ConvFacts | None) -> Legality:
    """Legality (case 2): may the conv join a channels_last region."""
    if facts is None:
        return Legality.no("not a 2-D/3-D conv with known shapes")
    if facts.transposed:
        return Legality.no("transposed conv (left in NCHW)")
    if not facts.weight_constant:
        return Legality.no("its weight is computed at run time and would be converted on every "
                           "call")
    return Legality.OK


def known_slow_case(facts: ConvFacts, target: HardwareProfile, dtype: str) -> str | None:
    """Case 3: a conv known to run slower in NHWC on the target, or None."""
    if not target.is_gpu:
        return None
    if facts.grouped:
        return (f"grouped conv with {facts.channels_per_group} channels per group: cuDNN's NHWC "
                "grouped kernels are slow (pytorch/pytorch#70954, #34977)")
    if target.compute_capability == (7, 0) and dtype in ("fp32", "tf32"):
        return ("fp32 conv on Volta (sm_70): no NHWC fp32 tensor-core path, cuDNN's NCHW fp32 "
                "kernels are the fast ones")
    return None


def cpu_class(info: ConvShape) -> str:
    """The CPU rule's conv class (a key of ``_CPU_GAIN``, or ``small_map``)."""
    if info.out_spatial < _CPU_SMALL_MAP:
        return "small_map"
    if info.depthwise:
        return "depthwise"
    if info.grouped:
        return "grouped"
    if info.channels_per_group <= _CPU_THIN_INPUT:
        return "thin_input"
    return "pointwise" if all(k == 1 for k in info.kernel) else "spatial"


def conv_gain_s(facts: ConvFacts, target: HardwareProfile, dtype: str, *,
                onednn: bool = True) -> tuple[float, str]:
    """(time NCHW costs this conv over NHWC, why) on the target (case 4)."""
    itemsize = _ITEMSIZE.get(dtype, 4)
    io = conversion_time_s(facts.in_shape, target, itemsize) \
        + conversion_time_s(facts.out_shape, target, itemsize)
    if target.is_gpu:
        if dtype not in _TC_DTYPES:
            return 0.0, (f"compute dtype {dtype}: channels_last is modelled to pay only for "
                         "fp16/bf16 tensor-core convs")
        if dtype not in target.peak_flops:
            return 0.0, f"no {dtype} tensor cores on {target.generation}"
        align = tc_alignment(dtype)
        cc = target.compute_capability
        if cc is not None and cc < (8, 0) and (facts.channels_per_group % align
                                               or (facts.c_out // facts.groups) % align):
            # roofline.py case 2: Volta/Turing run misaligned convs without tensor cores
            return 0.0, (f"channels not a multiple of {align}: no tensor cores on "
                         f"{target.generation}, so cuDNN's NCHW kernel needs no transposes")
        return io, "cuDNN transposes an NCHW tensor-core conv's input and output"
    if not onednn:
        return 0.0, "this torch has no oneDNN: CPU convs gain nothing from NHWC"
    kind = cpu_class(facts)
    if kind == "small_map":
        if all(k == 1 for k in facts.kernel) or facts.groups > 1:
            return 0.0, "no CPU gain modelled for 1x1 or grouped convs on maps under 14x14"
        return (-_CPU_SMALL_MAP_LOSS * facts.est_time_s,
                "oneDNN's NHWC kernels are slower for dense convs on maps under 14x14")
    return _CPU_GAIN[kind] * io, f"oneDNN reorders NCHW activations per call ({kind} conv)"


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


def should_channels_last(convs: Sequence[ConvFacts], boundary: Iterable[tuple[int, ...] | None],
                         target: HardwareProfile, dtype: str, mode: str, *,
                         onednn: bool = True) -> LayoutEstimate:
    """Profitability of one region (cases 4-5): conv gains against the boundary conversions."""
    itemsize = _ITEMSIZE.get(dtype, 4)
    gain = 0.0
    whys: set[str] = set()
    for facts in convs:
        g, why = conv_gain_s(facts, target, dtype, onednn=onednn)
        gain += g
        whys.add(why)
    cost = sum(conversion_time_s(s, target, itemsize) for s in boundary)
    if not target.is_gpu:
        cost *= _CPU_BOUNDARY_FACTOR
    numbers = (f"{len(convs)} conv(s) save {gain * 1e6:.1f} us, conversions cost "
               f"{cost * 1e6:.1f} us")
    if mode == "channels_last":
        return LayoutEstimate(gain, cost, True, f"forced by layout=channels_last ({numbers})")
    if gain > 0 and gain > MARGIN * cost:
        return LayoutEstimate(gain, cost, True, f"predicted to pay: {numbers}; "
                              + "; ".join(sorted(whys)))
    return LayoutEstimate(gain, cost, False, f"not applied because the gain does not beat "
                          f"{MARGIN}x the conversions: {numbers}; " + "; ".join(sorted(whys)))


@dataclass(frozen=True)
class ConvLayout:
    """The decision for one conv: its format, its region, why, and the predicted gain."""

    name: str
    format: str  # "channels_last" | "nchw"
    region: int | None
    reason: str
    #: the region's predicted time saved net of its conversions (None outside a region)
    predicted_gain_s: float | None = None

    @property
    def channels_last(self) -> bool:
        return self.format == "channels_last"

    def detail(self, backend: str | None = None) -> LayoutDetail:
        return LayoutDetail(LayoutFormat(self.format), self.region, self.predicted_gain_s,
                            backend)  # backend: why the backend runs the conv otherwise


@dataclass(frozen=True)
class LayoutPlan:
    """The layout decision for a plan: per conv, per region, and for the model."""

    mode: str
    convs: dict[str, ConvLayout]  # plan order
    regions: tuple[tuple[PlanRegion, LayoutEstimate], ...]
    nhwc: bool
    reason: str

    def summary(self) -> LayoutSummary:
        """The model-level decision and the regions, as the plan's ``rewrites.layout``."""
        return LayoutSummary(self.mode, self.nhwc, self.reason, tuple(LayoutRegion(
            r.id, tuple(r.convs), e.gain_s, e.cost_s, e.apply, e.reason) for r, e in self.regions))


def _model_level(convs: dict[str, ConvLayout], times: dict[str, float],
                 regions: Sequence[tuple[PlanRegion, LayoutEstimate]]) -> tuple[bool, str]:
    """NHWC for the model when channels_last convs hold at least half the conv time."""
    if not convs:
        return False, "no convolutions: layout does not matter"
    total = sum(times.values())
    cl = [c for c in convs.values() if c.channels_last]
    share = (sum(times[c.name] for c in cl) / total) if total > 0 else len(cl) / len(convs)
    nhwc = bool(cl) and share >= 0.5
    # the reason of the side that won, from the region (or excluded conv) with most conv time
    side = [c for c in convs.values() if c.channels_last == nhwc]
    top = max(side, key=lambda c: times[c.name])
    why = next((e.reason for r, e in regions if r.id == top.region), top.reason)
    if top.region is None:
        why = top.reason.removeprefix("kept NCHW: ")
    head = "channels_last" if nhwc else "NCHW"
    return nhwc, (f"{head}: {len(cl)} of {len(convs)} conv(s) channels_last ({share:.0%} of the "
                  f"conv time); {why}")


def decide_layout(plan: Plan, target: HardwareProfile, compute_dtype: str, mode: str, *,
                  onednn: bool = True) -> LayoutPlan:
    """Cases 1-5 for every conv of ``plan``, per region, and the model-level answer.

    ``onednn``: the CPU rule models oneDNN's reorders; the torch backend says if its torch has
    oneDNN (without it CPU convs gain nothing).
    """
    nodes = [n for n in plan.nodes if n.op_type in CONVS]
    times = {n.name: n.cost.est_time_s for n in nodes}
    if not nodes:  # nothing to decide: no region search over the whole graph
        return LayoutPlan(mode, {}, (), False, "no convolutions: layout does not matter")
    if mode == "keep":
        keep = {n.name: ConvLayout(n.name, "nchw", None, "kept: layout=keep") for n in nodes}
        reason = "kept NCHW: layout='keep'" if nodes else "no convolutions: layout does not matter"
        return LayoutPlan(mode, keep, (), False, reason)
    out: dict[str, ConvLayout] = {}
    facts: dict[str, ConvFacts] = {}
    for n in nodes:
        f = conv_facts(n)
        legal = can_channels_last(f)
        why = None if legal else legal.reason
        if legal and f is not None:
            slow = known_slow_case(f, target, compute_dtype)
            why = slow if slow is not None and mode == "auto" else None
            facts[n.name] = f
        if why is not None:
            out[n.name] = ConvLayout(n.name, "nchw", None, f"kept NCHW: {why}")
    regions: list[tuple[PlanRegion, LayoutEstimate]] = []
    for region in plan_regions(plan, out):
        est = should_channels_last([facts[c] for c in region.convs],
                                   [static_dims(t.shape) for t in (*region.entries, *region.exits)],
                                   target, compute_dtype, mode, onednn=onednn)
        regions.append((region, est))
        net = est.gain_s - est.cost_s
        for c in region.convs:
            if est.apply:
                slow = known_slow_case(facts[c], target, compute_dtype)
                note = f" (known slow case: {slow})" if slow else ""
                out[c] = ConvLayout(c, "channels_last", region.id,
                                    f"channels_last: region {region.id} {est.reason}{note}", net)
            else:
                out[c] = ConvLayout(c, "nchw", region.id,
                                    f"kept NCHW: region {region.id} {est.reason}", net)
        logger.debug("layout region %d: %s", region.id, est.reason)
    ordered = {n.name: out.get(n.name) or ConvLayout(n.name, "nchw", None,
                                                     "kept NCHW: in no conv region")
               for n in nodes}
    nhwc, reason = _model_level(ordered, times, regions)
    logger.info("layout decision: %s", reason)
    return LayoutPlan(mode, ordered, tuple(regions), nhwc, reason)
