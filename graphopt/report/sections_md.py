"""The deployment sections of a plan (memory, quantization, runtime settings, optimization, and
the partition from ``partition_md``) and the per-node decisions, as markdown; the fact lists here
are shared with the HTML renderer.

Both renderers print the same facts from the same functions (``memory_facts``, ``quant_facts``,
``optimization_facts``, ``deployment_rows``, ``decision_head``...), so the two reports cannot
disagree on a value. The fact functions return plain text; each renderer escapes it its own way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

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


def settings_of(runtime: Any) -> list[tuple[str, str, str]]:
    """(setting, value, reason) for every setting, by name; target and device are not settings."""
    if not isinstance(runtime, Mapping):
        return []
    out = []
    for name in sorted(runtime, key=str):
        s = runtime[name]
        if name in ("target", "device"):
            continue
        if isinstance(s, Mapping):
            out.append((str(name), fmt_value(s.get("value")), str(s.get("reason") or "")))
        else:
            out.append((str(name), fmt_value(s), ""))
    return out


def memory_facts(mem: Mapping[str, Any]) -> list[Fact]:
    usable, required = finite(mem.get("usable_bytes")), finite(mem.get("required_bytes"))
    short = required - usable if required is not None and usable is not None else None
    fits = mem.get("fits")
    batch = mem.get("traced_batch")
    out: list[Fact] = [
        ("fits", yes_no(fits), f"{fmt_bytes(short)} short" if fits is False and short else ""),
        ("needed", fmt_bytes(required), "" if batch is None else f"at the traced batch of {batch}"),
        ("usable", fmt_bytes(usable), f"of {fmt_bytes(mem.get('total_bytes'))} total"),
        ("max batch size", fmt_count(mem.get("max_batch_size")), str(mem.get("batch_note") or "")),
        *batch_facts(mem),
    ]
    ratio = finite(mem.get("compression_ratio"))
    if ratio is not None:
        out.append(("parameters vs fp32", f"{ratio:.2f}× smaller" if ratio > 1.0005 else "same",
                    f"{fmt_bytes(mem.get('fp32_param_bytes'))} in fp32 → "
                    f"{fmt_bytes(mem.get('param_bytes'))} ({mem.get('param_format') or '?'})"))
    if mem.get("activation_peak_bytes") is not None:
        peak = mem.get("peak_node")
        out.append(("activation peak", fmt_bytes(mem.get("activation_peak_bytes")),
                    (f"at {peak}; " if peak else "")
                    + f"{fmt_bytes(mem.get('activation_peak_per_sample_bytes'))} per sample"))
    for key, label, why in (("workspace_bytes", "workspace", "workspace_reason"),
                            ("reserve_bytes", "reserve", "reserve_policy")):
        if mem.get(key) is not None:
            out.append((label, fmt_bytes(mem.get(key)), str(mem.get(why) or "")))
    return out


def batch_facts(mem: Mapping[str, Any]) -> list[Fact]:
    """The recommended batch, what decided it, and samples/s at 1, it and the memory maximum."""
    if mem.get("recommended_batch_size") is None:
        return []
    rates = mem.get("samples_per_s_at") or {}
    keys = {str(k) for k in (1, mem.get("recommended_batch_size"), mem.get("max_batch_size"))}
    shown = " · ".join(f"batch {fmt_count(int(k))}: {fmt_si(v)}" for k, v in
                       sorted((kv for kv in rates.items() if str(kv[0]).isdigit()),
                              key=lambda kv: int(kv[0])) if str(k) in keys)
    return [("recommended batch", fmt_count(mem.get("recommended_batch_size")),
             f"decided by {mem.get('batch_decided_by') or '?'}: {mem.get('batch_advice') or ''}"),
            *([("samples/s (estimated)", shown, "")] if shown else [])]


def quant_facts(q: Mapping[str, Any]) -> list[Fact]:
    if not q.get("format"):
        return [("recommended", "none", "")]
    missing = finite(q.get("missing_bytes"))
    bpw = finite(q.get("bits_per_weight"))
    return [
        ("recommended", str(q.get("display") or q.get("format")), str(q.get("format"))),
        ("bits per weight", "—" if bpw is None else f"{bpw:g}",
         f"from {q.get('original_format')}" if q.get("original_format") else ""),
        ("weights", fmt_bytes(q.get("weight_bytes")), ""),
        ("estimated memory", fmt_bytes(q.get("est_memory_bytes")),
         f"of {fmt_bytes(q.get('usable_bytes'))} usable" if q.get("usable_bytes") else ""),
        ("fits", yes_no(q.get("fits")), f"{fmt_bytes(missing)} missing" if missing else ""),
        ("preference", str(q.get("preference") or "—"), ""),
    ]


def deployment_rows(plans: Sequence[Mapping[str, Any]]) -> list[tuple[str, str, list[str]]]:
    """(group, label, one cell per plan): memory, format and runtime settings side by side."""
    mems = [p.get("memory") if isinstance(p.get("memory"), Mapping) else {} for p in plans]
    quants = [p.get("quantization") if isinstance(p.get("quantization"), Mapping) else {}
              for p in plans]
    opts = [p.get("optimization") if isinstance(p.get("optimization"), Mapping) else {}
            for p in plans]
    rows: list[tuple[str, str, list[str]]] = [
        ("Memory", "fits", [yes_no(m.get("fits")) for m in mems]),
        ("Memory", "needed", [fmt_bytes(m.get("required_bytes")) for m in mems]),
        ("Memory", "usable", [fmt_bytes(m.get("usable_bytes")) for m in mems]),
        ("Memory", "max batch size", [fmt_count(m.get("max_batch_size")) for m in mems]),
        ("Memory", "recommended batch", [fmt_count(m.get("recommended_batch_size"))
                                         + (f" ({m['batch_decided_by']})"
                                            if m.get("batch_decided_by") else "")
                                         for m in mems]),
        ("Quantization", "recommended", [str(q.get("display") or q.get("format") or "—")
                                         for q in quants]),
        ("Quantization", "bits per weight", [f"{finite(q.get('bits_per_weight')):g}"
                                             if finite(q.get("bits_per_weight")) is not None
                                             else "—" for q in quants]),
        ("Quantization", "estimated memory", [fmt_bytes(q.get("est_memory_bytes"))
                                              for q in quants]),
        ("Quantization", "fits", [yes_no(q.get("fits")) for q in quants]),
    ]
    per = [dict((n, v) for n, v, _ in settings_of(p.get("runtime_settings"))) for p in plans]
    for name in sorted({n for s in per for n in s}):
        rows.append(("Runtime settings", name, [s.get(name, "—") for s in per]))
    if any(opts):
        facts = [dict((k, v) for k, v, _ in optimization_facts(o)) if o else {} for o in opts]
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


def plan_summary(plan: Mapping[str, Any], h: str) -> list[str]:
    s = plan.get("summary") or {}
    lat = s.get("est_latency_s")
    out = [f"- **Estimated latency:** {fmt_seconds(lat)} (unfused)",
           f"- **Total work:** {fmt_si(s.get('total_flops'), 'FLOP')}, "
           f"{fmt_bytes(s.get('total_bytes'))} moved", ""]
    mix, tmix = s.get("bottleneck_mix") or {}, s.get("time_by_bottleneck_s") or {}
    out += [f"{h} Bottleneck mix", ""]
    out += md_table(["bottleneck", "nodes", "est. time", "share"],
                  [[b, fmt_count(mix.get(b, 0)), fmt_seconds(tmix.get(b, 0.0)),
                    _share(tmix.get(b, 0.0), lat)] for b in BOTTLENECKS], "lrrr")
    times, counts = s.get("time_by_kernel_class_s") or {}, s.get("kernel_class_counts") or {}
    if times or counts:
        classes = sorted(set(times) | set(counts), key=lambda c: (-(finite(times.get(c)) or 0), c))
        out += [f"{h} Time by kernel class", ""]
        out += md_table(["kernel class", "nodes", "est. time", "share"],
                      [[md_code(c), fmt_count(counts.get(c, 0)), fmt_seconds(times.get(c)),
                        _share(times.get(c), lat)] for c in classes], "lrrr")
    kernels = s.get("costliest_kernels") or []
    if kernels:
        out += [f"{h} Costliest kernels", "", _FUSED, ""]
        out += md_table(["#", "kernel", "kernel class", "est. time", "unfused", "share"],
                      [[str(i), md_code(k.get("name", "?"))
                        + (f" ({fmt_count(len(k.get('nodes') or []))} nodes)"
                           if k.get("fused") else ""),
                        md_code(k.get("kernel_class", "?")), fmt_seconds(k.get("est_time_s")),
                        fmt_seconds(k.get("unfused_s")),
                        f"{100.0 * (finite(k.get('share')) or 0.0):.1f}%"]
                       for i, k in enumerate(kernels, 1)], "rllrrr")
    costly = s.get("costliest_nodes") or []
    if costly:
        out += [f"{h} Costliest nodes", "", _UNFUSED, ""]
        out += md_table(["#", "node", "kernel class", "est. time", "share"],
                      [[str(i), md_code(n.get("name", "?")), md_code(n.get("kernel_class", "?")),
                        fmt_seconds(n.get("est_time_s")),
                        f"{100.0 * (finite(n.get('share')) or 0.0):.1f}%"]
                       for i, n in enumerate(costly, 1)], "rllrr")
    for title, key, head in (("Patterns found", "patterns", "pattern"),
                             ("Unsupported ops", "unsupported_ops", "op"),
                             ("Flagged nodes", "flagged_nodes", "flag")):
        counts_map = s.get(key) or {}
        if counts_map:
            out += [f"{h} {title}", ""]
            out += md_table([head, "count"], [[md_code(k), fmt_count(v)]
                                            for k, v in sorted(counts_map.items())], "lr")
    warnings = plan.get("warnings") or []
    if warnings:
        out += [f"{h} Warnings", ""] + [f"- {md_text(w)}" for w in warnings] + [""]
    return out


def memory_md(mem: Mapping[str, Any], h: str) -> list[str]:
    out = [f"{h} Memory", "", *facts_md(memory_facts(mem)), ""]
    rows = [[md_text(b.get("component", "?")), fmt_bytes(b.get("bytes")), fmt_count(b.get("bytes")),
             md_text(fmt_pct(b.get("percent"), b.get("bytes")))]
            for b in mem.get("breakdown") or [] if isinstance(b, Mapping)]
    if rows:
        out += md_table(["component", "size", "bytes", "share"], rows, "lrrr")
    return out + [f"- {md_text(n)}" for n in mem.get("notes") or []] + (
        [""] if mem.get("notes") else [])


def quantization_md(q: Mapping[str, Any], h: str) -> list[str]:
    out = [f"{h} Quantization", "", *facts_md(quant_facts(q))]
    if q.get("reason"):
        out.append(f"- **why:** {md_text(q['reason'])}")
    out.append("")
    alts = [a for a in q.get("alternatives") or [] if isinstance(a, Mapping)]
    if alts:
        rows = [[md_code(a.get("format", "?")) + (" ←" if a.get("format") == q.get("format")
                                                   else ""),
                 fmt_value(a.get("bits_per_weight")), fmt_bytes(a.get("est_memory_bytes")),
                 yes_no(a.get("fits")), yes_no(a.get("native")), yes_no(a.get("eligible")),
                 md_text(a.get("note") or "")] for a in alts]
        out += [f"{h}# Formats considered", ""]
        out += md_table(["format", "bits/weight", "est. memory", "fits", "native", "eligible",
                         "note"], rows, "lrrllll")
    return out


def runtime_md(rt: Mapping[str, Any], h: str) -> list[str]:
    rows = [[md_code(n), md_code(v), md_text(r) or "—"] for n, v, r in settings_of(rt)]
    if not rows:
        return []
    where = ", ".join(f"{k} {md_code(rt[k])}" for k in ("device", "target") if rt.get(k))
    return [f"{h} Runtime settings", "", *([f"_For {where}._", ""] if where else []),
            *md_table(["setting", "value", "reason"], rows)]


def deployment_md(plan: Mapping[str, Any], h: str) -> list[str]:
    """Deploy, the optimization sections (after optimize), memory, quantization, runtime
    settings."""
    out: list[str] = deploy_md(plan, h)
    out += artifacts_md(plan, h)
    for key, render in (("memory", memory_md), ("quantization", quantization_md),
                        ("runtime_settings", runtime_md), ("llm", llm_md)):
        section = plan.get(key)
        if isinstance(section, Mapping) and section:
            out += render(section, h)
    return out + partition_md(plan, h) + tp_md(plan, h)


def deployment_table(plans: Sequence[Mapping[str, Any]]) -> list[str]:
    rows, last = [], None
    for group, label, cells in deployment_rows(plans):
        if group != last:
            rows.append([f"_{md_text(group)}_", *[""] * len(plans)])
            last = group
        name = md_code(label) if group == "Runtime settings" else md_text(label)
        rows.append([name, *[md_text(c) for c in cells]])
    header = ["", *[md_text((p.get("target") or {}).get("display_name")
                            or (p.get("target") or {}).get("name", "?")) for p in plans]]
    return md_table(header, rows, "l" + "r" * len(plans)) if rows else []


# --------------------------------------------------------------------------- nodes

def _decision_cell(decisions: Any) -> str:
    """``bf16 · tma_wgmma · cuda:0; padding: not applied``: the head, its device, the rest."""
    if not isinstance(decisions, Mapping):
        return "—"
    head = [decision_head(decisions)] if decision_head(decisions) else []
    head += [decision_summary(decisions["device"])] if "device" in decisions else []
    bits = [md_text(" · ".join(head))] if head else []
    bits += [f"{md_text(k)}: {md_text(decision_summary(decisions[k]))}"
             for k in ordered_kinds(decisions) if k not in (*HEAD_KINDS, "device")]
    return "; ".join(bits) or "—"


def _reasons(nodes: Sequence[Mapping[str, Any]], h: str) -> list[str]:
    out = []
    for n in nodes:
        decisions = n.get("decisions")
        if not isinstance(decisions, Mapping) or not decisions:
            continue
        out.append(f"- {md_code(n.get('name', '?'))}")
        for kind in ordered_kinds(decisions):
            d = decisions[kind]
            d = d if isinstance(d, Mapping) else {"value": d}
            extra = "; ".join(f"{k}: {v}" for k, v in decision_fields(d))
            out.append(f"  - **{md_text(kind)}** {md_code(decision_summary(d))}: "
                       f"{md_text(d.get('reason') or '(no reason given)')}"
                       + (f" ({md_text(extra)})" if extra else ""))
    return [f"{h} Decision reasons (top {len(nodes)} nodes)", "", *out, ""] if out else []


def node_table(plan: Mapping[str, Any], h: str, max_nodes: int) -> list[str]:
    nodes = [n for n in plan.get("nodes") or [] if isinstance(n, Mapping)]
    if not nodes:
        return []
    order = sorted(range(len(nodes)), key=lambda i: (-(finite(nodes[i].get("est_time_s")) or 0), i))
    shown = order[: max(0, max_nodes)]
    title = "Nodes" if len(shown) == len(nodes) else f"Nodes (top {len(shown)} by est. time)"
    out = [f"{h} {title}", ""]
    if len(shown) < len(nodes):
        out += [f"_{len(nodes) - len(shown):,} more nodes not shown; "
                f"the HTML or JSON report lists all {len(nodes):,}._", ""]
    lat = finite((plan.get("summary") or {}).get("est_latency_s"))
    labels = group_labels(plan)
    rows = []
    for i in shown:
        n = nodes[i]
        op = n.get("op_type") or n.get("op") or "?"  # canonical: aten.linear.default -> Linear
        t = finite(n.get("est_time_s"))
        rows.append([md_code(n.get("name", "?")), md_code(op), md_code(n.get("kernel_class", "?")),
                     md_text(fmt_dims(n.get("dims"))), md_text(n.get("dtype") or "—"),
                     fmt_si(n.get("flops")), fmt_bytes(n.get("bytes")),
                     f"{finite(n.get('arithmetic_intensity')) or 0.0:.3g}",
                     md_text(n.get("bottleneck", "?")), fmt_seconds(t),
                     "—" if t is None or not lat else f"{100.0 * t / lat:.1f}%",
                     md_text(labels.get(str(n.get("fusion_group")), "—")),
                     _decision_cell(n.get("decisions"))])
    out += md_table(["node", "op", "kernel class", "dims", "dtype", "FLOPs", "bytes", "FLOP/B",
                     "bottleneck", "est. time", "share", "fusion group", "decisions"], rows,
                    "lllllrrrlrrll")
    return out + _reasons([nodes[i] for i in shown[:DETAIL_NODES]], h)
