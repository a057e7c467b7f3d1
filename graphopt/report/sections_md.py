"""The deployment sections of a plan (memory, quantization, runtime settings, optimization, and
the partition from ``partition_md``) and the per-node decisions, as markdown; the fact lists here
are shared with the HTML renderer.

Both renderers print the same facts from the same functions (``memory_facts``, ``quant_facts``,
``optimization_facts``, ``deployment_rows``, ``decision_head``...), so the two reports cannot
disagree on a value. The fact functions read the plan's typed records and return plain text;
each renderer escapes it its own way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from graphopt.ir.plan_memory import MemoryPlan, QuantizationPlan, RuntimeSettings
from graphopt.report.deploy import deploy_md
from graphopt.report.format import (
    BOTTLENECKS,
    HEAD_KINDS,
    Fact,
    decision_fields,
    decision_head,
    decision_summary,
    facts_md,
    finite,
    fmt_bytes,
    fmt_count,
    fmt_dims,
    fmt_pct,
    fmt_seconds,
    fmt_si,
    fmt_value,
    md_code,
    md_table,
    md_text,
    ordered_kinds,
    yes_no,
)
from graphopt.report.fusion import group_labels
from graphopt.report.llm_section import llm_md
from graphopt.report.optimization import (
    artifacts_md,
    note_items,
    numerics_rows,
    optimization_facts,
)
from graphopt.report.partition_md import partition_md
from graphopt.report.tp_md import tp_md

if TYPE_CHECKING:  # ir.plan imports the report package (its emitters): no import at run time
    from graphopt.ir.plan import Decision, NodePlan, Plan

__all__ = [
    "batch_facts",
    "deployment_md",
    "deployment_rows",
    "deployment_table",
    "memory_facts",
    "node_table",
    "note_items",
    "numerics_rows",
    "optimization_facts",
    "plan_summary",
    "quant_facts",
    "settings_of",
]

DETAIL_NODES = 10  # markdown lists the decision reasons of this many costliest nodes
_S = TypeVar("_S")


def settings_of(rt: RuntimeSettings | None) -> list[tuple[str, str, str]]:
    """(setting, value, reason) for every setting, by name; target and device are not settings."""
    if rt is None:
        return []
    names = sorted(f.name for f in dataclasses.fields(rt) if f.name not in ("target", "device"))
    return [(n, fmt_value(getattr(rt, n).value), getattr(rt, n).reason) for n in names]


def memory_facts(mem: MemoryPlan) -> list[Fact]:
    usable, required = finite(mem.usable_bytes), finite(mem.required_bytes)
    short = required - usable if required is not None and usable is not None else None
    out: list[Fact] = [
        ("fits", yes_no(mem.fits), f"{fmt_bytes(short)} short" if mem.fits is False and short
         else ""),
        ("needed", fmt_bytes(required), f"at the traced batch of {mem.traced_batch}"),
        ("usable", fmt_bytes(usable), f"of {fmt_bytes(mem.total_bytes)} total"),
        ("max batch size", fmt_count(mem.max_batch_size), mem.batch_note),
        *batch_facts(mem),
    ]
    ratio = finite(mem.compression_ratio)
    if ratio is not None:
        out.append(("parameters vs fp32", f"{ratio:.2f}× smaller" if ratio > 1.0005 else "same",
                    f"{fmt_bytes(mem.fp32_param_bytes)} in fp32 → "
                    f"{fmt_bytes(mem.param_bytes)} ({mem.param_format or '?'})"))
    peak = mem.peak_node
    out.append(("activation peak", fmt_bytes(mem.activation_peak_bytes),
                (f"at {peak}; " if peak else "")
                + f"{fmt_bytes(mem.activation_peak_per_sample_bytes)} per sample"))
    return out + [("workspace", fmt_bytes(mem.workspace_bytes), mem.workspace_reason),
                  ("reserve", fmt_bytes(mem.reserve_bytes), mem.reserve_policy)]


def batch_facts(mem: MemoryPlan) -> list[Fact]:
    """The recommended batch, what decided it, and samples/s at 1, it and the memory maximum."""
    if mem.recommended_batch_size is None:
        return []
    rates = mem.samples_per_s_at or {}
    keys = {str(k) for k in (1, mem.recommended_batch_size, mem.max_batch_size)}
    shown = " · ".join(f"batch {fmt_count(int(k))}: {fmt_si(v)}" for k, v in
                       sorted((kv for kv in rates.items() if kv[0].isdigit()),
                              key=lambda kv: int(kv[0])) if k in keys)
    return [("recommended batch", fmt_count(mem.recommended_batch_size),
             f"decided by {mem.batch_decided_by or '?'}: {mem.batch_advice or ''}"),
            *([("samples/s (estimated)", shown, "")] if shown else [])]


def _bpw(q: QuantizationPlan) -> str:
    bpw = finite(q.bits_per_weight)
    return "—" if bpw is None else f"{bpw:g}"


def quant_facts(q: QuantizationPlan) -> list[Fact]:
    if not q.format:
        return [("recommended", "none", "")]
    missing = finite(q.missing_bytes)
    return [
        ("recommended", q.display or q.format, q.format),
        ("bits per weight", _bpw(q),
         f"from {q.original_format}" if q.original_format else ""),
        ("weights", fmt_bytes(q.weight_bytes), ""),
        ("estimated memory", fmt_bytes(q.est_memory_bytes),
         f"of {fmt_bytes(q.usable_bytes)} usable" if q.usable_bytes else ""),
        ("fits", yes_no(q.fits), f"{fmt_bytes(missing)} missing" if missing else ""),
        ("preference", q.preference or "—", ""),
    ]


def _cells(sections: Sequence[_S | None], cell: Callable[[_S], str]) -> list[str]:
    """One cell per plan; a plan without the section gets "—"."""
    return ["—" if s is None else cell(s) for s in sections]


def deployment_rows(plans: Sequence[Plan]) -> list[tuple[str, str, list[str]]]:
    """(group, label, one cell per plan): memory, format and runtime settings side by side."""
    mems, quants = [p.memory for p in plans], [p.quantization for p in plans]
    rows: list[tuple[str, str, list[str]]] = [
        ("Memory", "fits", _cells(mems, lambda m: yes_no(m.fits))),
        ("Memory", "needed", _cells(mems, lambda m: fmt_bytes(m.required_bytes))),
        ("Memory", "usable", _cells(mems, lambda m: fmt_bytes(m.usable_bytes))),
        ("Memory", "max batch size", _cells(mems, lambda m: fmt_count(m.max_batch_size))),
        ("Memory", "recommended batch", _cells(mems, lambda m: fmt_count(
            m.recommended_batch_size) + (f" ({m.batch_decided_by})" if m.batch_decided_by
                                         else ""))),
        ("Quantization", "recommended", _cells(quants, lambda q: q.display or q.format or "—")),
        ("Quantization", "bits per weight", _cells(quants, _bpw)),
        ("Quantization", "estimated memory", _cells(quants,
                                                    lambda q: fmt_bytes(q.est_memory_bytes))),
        ("Quantization", "fits", _cells(quants, lambda q: yes_no(q.fits))),
    ]
    per = [{n: v for n, v, _ in settings_of(p.runtime_settings)} for p in plans]
    for name in sorted({n for s in per for n in s}):
        rows.append(("Runtime settings", name, [s.get(name, "—") for s in per]))
    opts = [p.optimization for p in plans]
    if any(o is not None for o in opts):
        facts = [{} if o is None else {k: v for k, v, _ in optimization_facts(o)} for o in opts]
        for label in ("compute dtype", "passes applied", "outputs within"):
            rows.append(("Optimization", label, [f.get(label, "—") for f in facts]))
    return [r for r in rows if any(c not in ("—", "") for c in r[2])]


# --------------------------------------------------------------------------- markdown sections

#: what the node tables' times are (issue 33: a table ranked unfused beside a fusion table)
_UNFUSED = ("Times are unfused: each node its own kernel, ranked so; the fusion section gives "
            "what a runtime runs fused.")
_FUSED = ("Times are fused: each kernel as it runs (a fusion group, or a node alone), ranked "
          "by its fused time, beside the unfused sum of its nodes.")


def _share(part: Any, whole: Any) -> str:
    p, w = finite(part), finite(whole)
    return "—" if p is None or not w else f"{100.0 * p / w:.1f}%"


def _pct(share: float) -> str:
    return f"{100.0 * (finite(share) or 0.0):.1f}%"


def _counts_md(title: str, head: str, counts: Mapping[str, int], h: str) -> list[str]:
    if not counts:
        return []
    return [f"{h} {title}", "", *md_table([head, "count"], [[md_code(k), fmt_count(v)]
                                                           for k, v in sorted(counts.items())],
                                         "lr")]


def plan_summary(plan: Plan, h: str) -> list[str]:
    s = plan.summary
    lat = s.est_latency_s
    out = [f"- **Estimated latency:** {fmt_seconds(lat)} (unfused)",
           f"- **Total work:** {fmt_si(s.total_flops, 'FLOP')}, "
           f"{fmt_bytes(s.total_bytes)} moved", ""]
    mix, tmix = s.bottleneck_mix, s.time_by_bottleneck_s
    out += [f"{h} Bottleneck mix", ""]
    out += md_table(["bottleneck", "nodes", "est. time", "share"],
                    [[b, fmt_count(mix[b]), fmt_seconds(tmix[b]), _share(tmix[b], lat)]
                     for b in BOTTLENECKS], "lrrr")
    times, counts = s.time_by_kernel_class_s, s.kernel_class_counts
    if times or counts:
        classes = sorted(set(times) | set(counts), key=lambda c: (-(finite(times.get(c)) or 0), c))
        out += [f"{h} Time by kernel class", ""]
        out += md_table(["kernel class", "nodes", "est. time", "share"],
                        [[md_code(c), fmt_count(counts.get(c, 0)), fmt_seconds(times.get(c)),
                          _share(times.get(c), lat)] for c in classes], "lrrr")
    if s.costliest_kernels:
        out += [f"{h} Costliest kernels", "", _FUSED, ""]
        out += md_table(["#", "kernel", "kernel class", "est. time", "unfused", "share"],
                        [[str(i), md_code(k.name) + (f" ({fmt_count(len(k.nodes))} nodes)"
                                                     if k.fused else ""),
                          md_code(k.kernel_class), fmt_seconds(k.est_time_s),
                          fmt_seconds(k.unfused_s), _pct(k.share)]
                         for i, k in enumerate(s.costliest_kernels, 1)], "rllrrr")
    if s.costliest_nodes:
        out += [f"{h} Costliest nodes", "", _UNFUSED, ""]
        out += md_table(["#", "node", "kernel class", "est. time", "share"],
                        [[str(i), md_code(n.name), md_code(n.kernel_class),
                          fmt_seconds(n.est_time_s), _pct(n.share)]
                         for i, n in enumerate(s.costliest_nodes, 1)], "rllrr")
    out += _counts_md("Patterns found", "pattern", s.patterns, h)
    out += _counts_md("Unsupported ops", "op", s.unsupported_ops, h)
    out += _counts_md("Flagged nodes", "flag", s.flagged_nodes, h)
    if plan.warnings:
        out += [f"{h} Warnings", ""] + [f"- {md_text(w)}" for w in plan.warnings] + [""]
    return out


def memory_md(mem: MemoryPlan, h: str) -> list[str]:
    out = [f"{h} Memory", "", *facts_md(memory_facts(mem)), ""]
    rows = [[md_text(b.component), fmt_bytes(b.bytes), fmt_count(b.bytes),
             md_text(fmt_pct(b.percent, b.bytes))] for b in mem.breakdown]
    if rows:
        out += md_table(["component", "size", "bytes", "share"], rows, "lrrr")
    return out + [f"- {md_text(n)}" for n in mem.notes] + ([""] if mem.notes else [])


def quantization_md(q: QuantizationPlan, h: str) -> list[str]:
    out = [f"{h} Quantization", "", *facts_md(quant_facts(q))]
    if q.reason:
        out.append(f"- **why:** {md_text(q.reason)}")
    out.append("")
    if q.alternatives:
        rows = [[md_code(a.format) + (" ←" if a.format == q.format else ""),
                 fmt_value(a.bits_per_weight), fmt_bytes(a.est_memory_bytes), yes_no(a.fits),
                 yes_no(a.native), yes_no(a.eligible), md_text(a.note)] for a in q.alternatives]
        out += [f"{h}# Formats considered", ""]
        out += md_table(["format", "bits/weight", "est. memory", "fits", "native", "eligible",
                         "note"], rows, "lrrllll")
    return out


def runtime_md(rt: RuntimeSettings, h: str) -> list[str]:
    rows = [[md_code(n), md_code(v), md_text(r) or "—"] for n, v, r in settings_of(rt)]
    if not rows:
        return []
    where = ", ".join(f"{k} {md_code(v)}" for k, v in (("device", rt.device),
                                                       ("target", rt.target)) if v)
    return [f"{h} Runtime settings", "", *([f"_For {where}._", ""] if where else []),
            *md_table(["setting", "value", "reason"], rows)]


def deployment_md(plan: Plan, h: str) -> list[str]:
    """Deploy, the optimization sections (after optimize), memory, quantization, runtime
    settings, the LLM section, the partition and tensor parallelism."""
    out: list[str] = deploy_md(plan, h) + artifacts_md(plan, h)
    out += [] if plan.memory is None else memory_md(plan.memory, h)
    out += [] if plan.quantization is None else quantization_md(plan.quantization, h)
    out += [] if plan.runtime_settings is None else runtime_md(plan.runtime_settings, h)
    out += [] if plan.llm is None else llm_md(plan.llm, h)
    return out + partition_md(plan, h) + tp_md(plan, h)


def deployment_table(plans: Sequence[Plan]) -> list[str]:
    rows, last = [], None
    for group, label, cells in deployment_rows(plans):
        if group != last:
            rows.append([f"_{md_text(group)}_", *[""] * len(plans)])
            last = group
        name = md_code(label) if group == "Runtime settings" else md_text(label)
        rows.append([name, *[md_text(c) for c in cells]])
    header = ["", *[md_text(p.target.display_name or p.target.name) for p in plans]]
    return md_table(header, rows, "l" + "r" * len(plans)) if rows else []


# --------------------------------------------------------------------------- nodes

def _decision_cell(decisions: Mapping[str, Decision]) -> str:
    """``bf16 · tma_wgmma · cuda:0; padding: not applied``: the head, its device, the rest."""
    head = [decision_head(decisions)] if decision_head(decisions) else []
    head += [decision_summary(decisions["device"])] if "device" in decisions else []
    bits = [md_text(" · ".join(head))] if head else []
    bits += [f"{md_text(k)}: {md_text(decision_summary(decisions[k]))}"
             for k in ordered_kinds(decisions) if k not in (*HEAD_KINDS, "device")]
    return "; ".join(bits) or "—"


def _reasons(nodes: Sequence[NodePlan], h: str) -> list[str]:
    out = []
    for n in nodes:
        if not n.decisions:
            continue
        out.append(f"- {md_code(n.name)}")
        for kind in ordered_kinds(n.decisions):
            d = n.decisions[kind]
            extra = "; ".join(f"{k}: {v}" for k, v in decision_fields(d))
            out.append(f"  - **{md_text(kind)}** {md_code(decision_summary(d))}: "
                       f"{md_text(d.reason or '(no reason given)')}"
                       + (f" ({md_text(extra)})" if extra else ""))
    return [f"{h} Decision reasons (top {len(nodes)} nodes)", "", *out, ""] if out else []


def _node_row(n: NodePlan, lat: float | None, group: str) -> list[str]:
    a, t = n.analysis, finite(n.cost.est_time_s)
    return [md_code(n.name), md_code(n.op_type or n.op or "?"),  # canonical: Linear
            md_code(a.kernel_class), md_text(fmt_dims(a.dims)), md_text(a.dtype or "—"),
            fmt_si(a.flops), fmt_bytes(a.bytes_total),
            # the JSON report's rounding, so both print the same digits
            f"{finite(round(a.arithmetic_intensity, 6)) or 0.0:.3g}",
            md_text(n.cost.bottleneck), fmt_seconds(t),
            "—" if t is None or not lat else f"{100.0 * t / lat:.1f}%", md_text(group),
            _decision_cell(n.decisions)]


def node_table(plan: Plan, h: str, max_nodes: int) -> list[str]:
    nodes = plan.nodes
    if not nodes:
        return []
    order = sorted(range(len(nodes)), key=lambda i: (-(finite(nodes[i].cost.est_time_s) or 0), i))
    shown = order[: max(0, max_nodes)]
    title = "Nodes" if len(shown) == len(nodes) else f"Nodes (top {len(shown)} by est. time)"
    out = [f"{h} {title}", ""]
    if len(shown) < len(nodes):
        out += [f"_{len(nodes) - len(shown):,} more nodes not shown; "
                f"the HTML or JSON report lists all {len(nodes):,}._", ""]
    lat = finite(plan.summary.est_latency_s)
    labels = group_labels(plan)
    group_of = {} if plan.fusion is None else plan.fusion.group_of
    rows = [_node_row(nodes[i], lat, labels.get(str(group_of.get(nodes[i].name)), "—"))
            for i in shown]
    out += md_table(["node", "op", "kernel class", "dims", "dtype", "FLOPs", "bytes", "FLOP/B",
                     "bottleneck", "est. time", "share", "fusion group", "decisions"], rows,
                    "lllllrrrlrrll")
    return out + _reasons([nodes[i] for i in shown[:DETAIL_NODES]], h)
