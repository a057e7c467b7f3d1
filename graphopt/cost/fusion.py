"""Fusion groups: the kernels a deploying runtime would actually launch, and their cost.

Inductor, TensorRT and ONNX Runtime all fuse, so summing unfused nodes overstates memory-bound
work: every pointwise op would pay a full round trip to DRAM and a launch. The groups here
follow the fusions all three make:

1. A recognized pattern (attention, RMSNorm/LayerNorm, SwiGLU, RoPE) is one kernel.
2. A GEMM or conv takes its epilogue: the pointwise ops that read only its result (bias add,
   activation, residual add), through free views, as long as each intermediate has no reader
   outside the group.
3. Otherwise a chain of pointwise ops fuses, with at most one reduction (a norm, softmax or
   reduce: Inductor fuses pointwise producers and consumers into the reduction's loop).
4. Data movement (transpose copies, concat, gather) and unknown ops stay single kernels; free
   views cost nothing and join whichever group reads them.

An ONNX model runs on ONNX Runtime, which fuses only what its transformers recognise for the
target's execution provider: its groups come from :mod:`graphopt.cost.ort_fusion` instead, and
every other node stays a kernel of its own.

A group of one node costs what the node costs. A larger group costs one launch plus
max(sum of its nodes' compute times, bytes crossing the group's boundary / the bandwidth the
roofline used): intermediates stay in registers or shared memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from graphopt.analysis.kernel_class import KernelClass
from graphopt.cost.ort_fusion import ort_units
from graphopt.ir.plan_sections import FusionKind, FusionPlan, FusionRuntime, KernelGroup
from graphopt.ir.plan_summary import CostlyKernel

__all__ = ["COSTLIEST_KERNELS", "FusionGroup", "costliest_kernels", "fusion_groups",
           "fusion_section"]

_POINTWISE = frozenset({KernelClass.ELEMENTWISE, KernelClass.SILU, KernelClass.ROPE})
_REDUCING = frozenset({KernelClass.NORM, KernelClass.RMSNORM, KernelClass.SOFTMAX,
                       KernelClass.REDUCTION})
_ANCHORS = frozenset({KernelClass.GEMM, KernelClass.GEMV, KernelClass.CONV,
                      KernelClass.QUANT_GEMM, KernelClass.QUANT_DOT})


@dataclass
class FusionGroup:
    """One kernel a runtime would launch: its nodes (graph order), kind and cost."""

    id: str
    kind: FusionKind
    nodes: list[str] = field(default_factory=list)
    est_time_s: float = 0.0
    unfused_s: float = 0.0
    external_bytes: int = 0
    #: ORT groups: the op ORT makes and the transformers that made it, in the order they ran
    fused_op: str | None = None
    rules: tuple[str, ...] = ()

    def record(self) -> KernelGroup:
        """The group as the plan's ``fusion`` section lists it."""
        return KernelGroup(self.id, self.kind, tuple(self.nodes), self.est_time_s,
                           self.unfused_s, self.external_bytes, self.fused_op,
                           None if self.fused_op is None else tuple(self.rules))


def fusion_groups(nodes: Sequence[Any], graph_outputs: Sequence[str] = (),
                  ep: str | None = None) -> list[FusionGroup]:
    """Group plan nodes (``NodePlan``: name, analysis, cost, inputs, outputs) into kernels:
    ONNX Runtime's fusions for execution provider ``ep`` when given, else cases 1-4."""
    by_name = {n.name: n for n in nodes}
    readers: dict[str, list[str]] = {}
    for n in nodes:
        for t in n.inputs:
            if t is not None:
                readers.setdefault(t.name, []).append(n.name)
    outputs = set(graph_outputs)
    if ep is not None:
        groups = []
        for i, u in enumerate(ort_units(nodes, graph_outputs, ep)):
            kind = (FusionKind.FOLDED if u.folded else FusionKind.ORT if len(u.nodes) > 1
                    else FusionKind.SINGLE)
            g = _costed(FusionGroup(f"k{i}", kind, u.nodes, fused_op=u.op
                                    if kind is FusionKind.ORT else None, rules=tuple(u.rules)),
                        by_name, readers, outputs)
            if u.folded:  # computed once when the session starts, never per run
                g.est_time_s = 0.0
            groups.append(g)
        return groups
    group_of: dict[str, str] = {}
    groups: list[FusionGroup] = []
    patterns: dict[str, list[str]] = {}
    for n in nodes:
        if n.analysis.pattern:
            patterns.setdefault(n.analysis.pattern, []).append(n.name)

    def sole_reader(name: str) -> str | None:
        """The one node reading all of ``name``'s outputs, if there is exactly one."""
        outs = [t.name for t in by_name[name].outputs if t is not None]
        who = {r for t in outs for r in readers.get(t, ())}
        if len(who) != 1 or any(t in outputs for t in outs):
            return None
        (r,) = who
        return r if r not in group_of else None

    for n in nodes:
        if n.name in group_of:
            continue
        a = n.analysis
        if a.pattern:
            members, kind = patterns[a.pattern], FusionKind.PATTERN
        else:
            members, kind = [n.name], FusionKind.SINGLE
            reduced = a.kernel_class in _REDUCING
            fusible = a.kernel_class in _ANCHORS | _POINTWISE | _REDUCING
            nxt = sole_reader(n.name) if fusible else None
            while nxt is not None:
                k = by_name[nxt].analysis
                if k.pattern or not (k.kernel_class in _POINTWISE | {KernelClass.VIEW} or
                                     (k.kernel_class in _REDUCING and not reduced and
                                      a.kernel_class not in _ANCHORS)):
                    break
                reduced |= k.kernel_class in _REDUCING
                members.append(nxt)
                nxt = sole_reader(nxt)
            if len(members) > 1:
                kind = (FusionKind.EPILOGUE if a.kernel_class in _ANCHORS
                        else FusionKind.POINTWISE)
        gid = f"k{len(groups)}"
        for m in members:
            group_of[m] = gid
        groups.append(_costed(FusionGroup(gid, kind, members), by_name, readers, outputs))
    return groups


def _costed(g: FusionGroup, by_name: dict[str, Any], readers: dict[str, list[str]],
            outputs: set[str]) -> FusionGroup:
    members = [by_name[m] for m in g.nodes]
    g.unfused_s = sum(m.cost.est_time_s for m in members)
    inside = set(g.nodes)
    written = {t.name for m in members for t in m.outputs if t is not None}
    ext = 0
    seen: set[str] = set()
    for m in members:
        for t in m.inputs:
            if t is not None and t.name not in written and t.name not in seen:
                seen.add(t.name)
                ext += t.nbytes
        for t in m.outputs:
            if t is not None and (t.name in outputs or
                                  any(r not in inside for r in readers.get(t.name, ()))):
                ext += t.nbytes
    g.external_bytes = ext
    real = [m for m in members if m.analysis.kernel_class is not KernelClass.VIEW]
    if len(real) <= 1:
        g.est_time_s = g.unfused_s
        return g
    compute = sum(m.cost.compute_time_s for m in real)
    bandwidth = max(m.cost.bandwidth_used for m in real)
    memory = ext / bandwidth if bandwidth else 0.0
    g.est_time_s = max(compute, memory) + max(m.cost.overhead_s for m in real)
    return g


def fusion_section(nodes: Sequence[Any], graph_outputs: Sequence[str] = (),
                   ep: str | None = None) -> tuple[FusionPlan, tuple[CostlyKernel, ...]]:
    """The plan's ``fusion`` section (whose fusions it follows, every multi-node group, each
    node's group, the fused estimate beside the unfused one) and the summary's ranking of the
    kernels by what runs. ``ep``: group as ONNX Runtime's optimizer does for that execution
    provider (an ONNX model)."""
    groups = fusion_groups(nodes, graph_outputs, ep)
    fused = sum(g.est_time_s for g in groups)
    unfused = sum(g.unfused_s for g in groups)
    kind = {n.name: n.analysis.kernel_class for n in nodes}
    kernels = [g for g in groups if g.kind is not FusionKind.FOLDED and
               any(kind[m] is not KernelClass.VIEW for m in g.nodes)]
    runtime = (FusionRuntime("onnxruntime", ep, f"as ONNX Runtime's graph optimizer fuses for "
                                                f"{ep} at ORT_ENABLE_ALL")
               if ep is not None else
               FusionRuntime("generic", None, "as Inductor, TensorRT and ONNX Runtime fuse: "
                             "patterns, GEMM/conv epilogues, pointwise chains with one "
                             "reduction"))
    section = FusionPlan(runtime=runtime, est_latency_fused_s=fused,
                         est_latency_unfused_s=unfused, kernels_fused=len(kernels),
                         nodes=len(nodes), group_of={m: g.id for g in groups for m in g.nodes},
                         groups=tuple(g.record() for g in groups if len(g.nodes) > 1))
    return section, costliest_kernels(kernels, kind, fused)


#: kernels listed in the summary's fused ranking (as many as ``costliest_nodes``)
COSTLIEST_KERNELS = 10


def costliest_kernels(kernels: Sequence[FusionGroup], kind: dict[str, KernelClass],
                      fused_total: float, top: int = COSTLIEST_KERNELS
                      ) -> tuple[CostlyKernel, ...]:
    """The summary's ranking by what runs: each kernel (a fusion group, or a node alone) at its
    fused time, named by its nodes, beside the unfused sum of its nodes. ``costliest_nodes``
    ranks nodes by their own unfused times, which a fused group does not pay."""
    ranked = sorted(kernels, key=lambda g: (-g.est_time_s, g.nodes[0] if g.nodes else g.id))
    rows = []
    for g in ranked[:top]:
        real = [m for m in g.nodes if kind[m] is not KernelClass.VIEW] or list(g.nodes)
        rows.append(CostlyKernel(kernel=g.id, name="+".join(real), nodes=tuple(g.nodes),
                                 kind=g.kind, fused=len(g.nodes) > 1,
                                 kernel_class=kind[real[0]].value, est_time_s=g.est_time_s,
                                 unfused_s=g.unfused_s,
                                 share=g.est_time_s / fused_total if fused_total else 0.0))
    return tuple(rows)
