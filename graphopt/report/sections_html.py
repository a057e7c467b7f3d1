"""HTML panels of a plan: summary cards, findings, target comparison and the deployment panels
(memory, quantization, runtime settings, optimization; the partition from ``partition_html``).

Every text goes through ``html_text.esc`` (``html.escape`` with quotes): reasons and notes name
the model's tensors and targets, so they are untrusted like node names. The facts come from
``sections_md``, so the HTML and markdown reports print the same values. The panels read the
plan's typed records; a section the plan lacks is None and gets no panel.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from graphopt.hardware.profile import HardwareProfile
from graphopt.ir.decision_details import PrecisionDetail
from graphopt.ir.kinds import REWRITE_KINDS
from graphopt.ir.plan_memory import MemoryPlan, QuantizationPlan, RuntimeSettings
from graphopt.ir.plan_run import OnnxOptimization, TorchOptimization
from graphopt.ir.plan_summary import CostlyKernel
from graphopt.report.deploy import deploy_html
from graphopt.report.format import (
    BOTTLENECKS,
    finite,
    fmt_bytes,
    fmt_count,
    fmt_pct,
    fmt_rate,
    fmt_seconds,
    fmt_si,
    fmt_value,
)
from graphopt.report.html_text import breakable, esc, table
from graphopt.report.llm_section import llm_html
from graphopt.report.optimization import (
    ARTIFACTS,
    decision_rows,
    note_items,
    numerics_rows,
    optimization_facts,
)
from graphopt.report.partition_html import partition_panel
from graphopt.report.partition_md import partition_facts
from graphopt.report.sections_md import deployment_rows, memory_facts, quant_facts, settings_of
from graphopt.report.sensitivity import sensitivity_html
from graphopt.report.tp_html import tp_panel

if TYPE_CHECKING:  # ir.plan imports the report package (its emitters): no import at run time
    from graphopt.ir.plan import Plan

__all__ = ["bar", "cards", "comparison", "deployment", "issues", "share", "target_name"]

# Memory components in the order a budget is read; "free" is what is left for larger batches.
_MEM_COLORS = {"parameters": "#2f64d0", "activations (peak)": "#8a55d4", "workspace": "#e8903a",
               "reserve": "#9aa3ad", "free": "#cfe3d6"}
_MEM_SPARE = ("#16a08a", "#c7a020", "#d2476f", "#6d597a")


def target_name(target: HardwareProfile) -> str:
    return target.display_name or target.name or "?"


def share(part: Any, whole: Any) -> float:
    p, w = finite(part), finite(whole)
    return p / w if p is not None and w else 0.0


def bar(frac: float, color: str) -> str:
    return (f'<div class="bar"><span style="width:{100 * min(max(frac, 0.0), 1.0):.1f}%;'
            f'background:{color}"></span></div>')


def _yes(text: str, good: str = "yes") -> str:
    """A yes/no fact as a coloured chip; anything else as plain text."""
    if text in ("yes", "✓", "no", "✗"):
        return f'<span class="chip {"yes" if text in (good, "✓") else "bad"}">{esc(text)}</span>'
    return esc(text)


def _mark(value: Any) -> str:
    """A compact yes/no for table cells, where a chip per cell would be noise."""
    return ('<span class="y">✓</span>' if value is True else
            '<span class="n">✗</span>' if value is False else "—")


def _facts(facts: Sequence[tuple[str, str, str]]) -> str:
    rows = "".join(f"<dt>{esc(k)}</dt><dd>{_yes(v)}"
                   + (f' <span class="faint">{esc(d)}</span>' if d else "") + "</dd>"
                   for k, v, d in facts)
    return f'<dl class="facts">{rows}</dl>'


def card(key: str, value: str, sub: str, small: bool = False) -> str:
    return (f'<div class="card"><div class="k">{esc(key)}</div><div class="v{" sm" * small}" '
            f'title="{esc(value)}">{esc(value)}</div>'
            f'<div class="s">{esc(sub)}</div></div>')


def cards(plan: Plan) -> str:
    s, tgt, model = plan.summary, plan.target, plan.model
    mem, q, opt, part = plan.memory, plan.quantization, plan.optimization, plan.partition
    lat = finite(s.est_latency_s)
    flops, nbytes = finite(s.total_flops), finite(s.total_bytes)
    peaks = tgt.peak_flops
    top = max(peaks, key=lambda k: (finite(peaks[k]) or 0.0, k)) if peaks else None
    out = [
        card("Estimated latency", fmt_seconds(lat), f"on {target_name(tgt)}"),
        card("Compute", fmt_si(flops, "FLOP"),
             f"{fmt_rate(flops / lat if flops and lat else None, 'FLOP/s')} average"),
        card("Memory traffic", fmt_bytes(nbytes),
             f"{fmt_rate(nbytes / lat if nbytes and lat else None)} average"),
        card("Nodes", fmt_count(model.num_nodes or len(plan.nodes)),
             f"{fmt_si(model.param_count)} parameters"),
        card("Target", target_name(tgt),
             f"{tgt.generation} · {fmt_rate(tgt.bandwidth_bytes_per_s)}"
             + (f" · {top} {fmt_rate(peaks[top], 'FLOP/s')}" if top else ""), small=True),
    ]
    if mem is not None:
        out.append(card("Memory", f"{'fits' if mem.fits else 'does not fit'} · "
                        f"{fmt_bytes(mem.required_bytes)}",
                        f"of {fmt_bytes(mem.usable_bytes)} usable · max batch "
                        f"{fmt_count(mem.max_batch_size)}"
                        + (f" · batch {fmt_count(mem.recommended_batch_size)} recommended"
                           if mem.recommended_batch_size is not None else ""),
                        small=True))
    if q is not None:
        out.append(_weights_card(plan, q))
    if part is not None:
        facts = {k: v for k, v, _ in partition_facts(part)}
        out.append(card("Split across devices", f"{facts['devices']} · {facts['strategy']}",
                        f"makespan {facts['makespan']} · {facts['transfers']}", small=True))
    if opt is not None:
        facts = {k: v for k, v, _ in optimization_facts(opt)}
        out.append(card("Optimized", facts["compute dtype"], f"passes: {facts['passes applied']}"
                        f" · within tolerance: {facts['outputs within']}", small=True))
    return '<section class="cards">' + "".join(out) + "</section>"


def _weights_card(plan: Plan, q: QuantizationPlan) -> str:
    """The weights the nodes get (their precision decisions), not the memory fit's model-level
    pick; where that pick is narrower than what the nodes take, one line says so."""
    formats = Counter(d.detail.format for n in plan.nodes if n.analysis.param_count > 0
                      and (d := n.decisions.get("precision")) is not None
                      and isinstance(d.detail, PrecisionDetail))
    if not formats:
        sub = (f"{fmt_value(q.bits_per_weight)} bits/weight · "
               f"{fmt_bytes(q.est_memory_bytes)}") if q.format else "no weights"
        return card("Weights (memory fit)", q.display or q.format or "none", sub, small=True)
    value = " · ".join(f"{f} ×{c}" if len(formats) > 1 else f for f, c in formats.most_common())
    fit = q.format
    sub = (f"the memory fit alone would allow {q.display or fit}; the nodes do not "
           "take it (each node's precision says why)" if fit and fit not in formats else
           f"{fmt_value(q.bits_per_weight)} bits/weight · {fmt_bytes(q.est_memory_bytes)}")
    return card("Weights (per node)", value, sub, small=True)


def _costliest_kernels(kernels: Sequence[CostlyKernel]) -> str:
    """The ranking by what runs: each kernel at its fused time (none before fusion is planned)."""
    if not kernels:
        return ""
    rows = [f'<tr><td class="num faint">{i}</td><td class="mono trunc" '
            f'title="{esc(", ".join(k.nodes))}">{breakable(k.name)}</td>'
            f'<td>{esc(k.kernel_class)}</td>'
            f'<td class="num">{esc(fmt_seconds(k.est_time_s))}</td>'
            f'<td class="num faint">{esc(fmt_seconds(k.unfused_s))}</td>'
            f'<td class="num">{100 * (finite(k.share) or 0.0):.1f}%</td></tr>'
            for i, k in enumerate(kernels, 1)]
    return ('<h3>Costliest kernels</h3><p class="faint">fused: each kernel as it runs, ranked '
            'by its fused time, beside its nodes\' unfused sum</p>'
            + table(["#", "kernel", "kernel class", "est. time", "unfused", "share"], "rllrrr",
                    rows))


def issues(plan: Plan, index: dict[str, int]) -> tuple[str, str]:
    """The costliest-nodes panel and the findings panel (warnings, unsupported ops, flags)."""
    s, parts, rows = plan.summary, [], []
    for i, n in enumerate(s.costliest_nodes, 1):
        name = n.name
        jump = f' class="mono trunc jump" data-idx="{index[name]}"' if name in index else \
            ' class="mono trunc"'
        frac = finite(n.share) or share(n.est_time_s, s.est_latency_s)
        rows.append(f'<tr><td class="num faint">{i}</td><td{jump} title="{esc(name)}">'
                    f'{breakable(name)}</td>'
                    f'<td>{esc(n.kernel_class)}</td><td class="num">'
                    f'{esc(fmt_seconds(n.est_time_s))}</td><td class="num">{100 * frac:.1f}%'
                    f'<span class="sharebar"><span style="width:{100 * min(frac, 1.0):.1f}%">'
                    f'</span></span></td></tr>')
    costly = ('<div class="panel">' + _costliest_kernels(s.costliest_kernels or ())
              + '<h3>Costliest nodes</h3><p class="faint">unfused: each '
              'node its own kernel (the fusion section gives what runs fused)</p>' + table(
        ["#", "node", "kernel class", "est. time", "share"], "rllrr", rows) + "</div>")
    if plan.warnings:
        parts.append("<h4>Warnings</h4><ul class=\"warn\">"
                     + "".join(f"<li>{esc(w)}</li>" for w in plan.warnings) + "</ul>")
    for title, items, cls in (("Unsupported ops", s.unsupported_ops, "chip"),
                              ("Flagged nodes", s.flagged_nodes, "chip"),
                              ("Patterns found", s.patterns, "chip yes")):
        if items:
            parts.append(f"<h4>{title}</h4>" + "".join(
                f'<span class="{cls}">{esc(k)} × {esc(fmt_count(v))}</span>'
                for k, v in sorted(items.items(), key=lambda kv: str(kv[0]))))
    body = "".join(parts) or '<p class="ok">No warnings, unsupported ops or flagged nodes.</p>'
    return costly, f'<div class="panel issues"><h3>Findings</h3>{body}</div>'


def _memory(mem: MemoryPlan) -> str:
    parts = mem.breakdown
    spare = iter(_MEM_SPARE * len(parts))
    colors = [_MEM_COLORS.get(b.component) or next(spare) for b in parts]
    total = sum(finite(b.bytes) or 0.0 for b in parts)
    stack = "".join(f'<span title="{esc(b.component)}" class="'
                    f'{"nz" if (finite(b.bytes) or 0) > 0 else ""}" style="width:'
                    f'{100 * share(b.bytes, total):.2f}%;background:{c}"></span>'
                    for b, c in zip(parts, colors, strict=True))
    rows = [f'<tr><td><i class="sw" style="background:{c}"></i>{esc(b.component)}'
            f'</td><td class="num">{esc(fmt_bytes(b.bytes))}</td><td class="num faint">'
            f'{esc(fmt_count(b.bytes))}</td><td class="num">'
            f'{esc(fmt_pct(b.percent, b.bytes))}</td></tr>'
            for b, c in zip(parts, colors, strict=True)]
    notes = "".join(f"<li>{esc(n)}</li>" for n in mem.notes)
    return (f'<div class="panel mem"><h3>Memory<span class="hint">of '
            f'{esc(fmt_bytes(mem.total_bytes))} on {esc(mem.target or "?")}'
            f'</span></h3>' + (f'<div class="stack">{stack}</div>' if parts else "")
            + (table(["component", "size", "bytes", "share"], "lrrr", rows, "mem-table")
               if rows else "") + _facts(memory_facts(mem))
            + (f'<ul class="notes">{notes}</ul>' if notes else "") + "</div>")


def _quantization(q: QuantizationPlan) -> str:
    rows = []
    for a in q.alternatives or ():
        cls = "pick" if a.format == q.format else "faint" if a.eligible is False else ""
        rows.append(f'<tr class="{cls}"><td class="mono">{esc(a.format)}</td>'
                    f'<td class="num">{esc(fmt_value(a.bits_per_weight))}</td>'
                    f'<td class="num">{esc(fmt_bytes(a.est_memory_bytes))}</td>'
                    + "".join(f"<td>{_mark(v)}</td>" for v in (a.fits, a.native, a.eligible))
                    + f'<td class="wrap">{esc(a.note)}</td></tr>')
    reason = f'<p class="why">{esc(q.reason)}</p>' if q.reason else ""
    alts = ("<h4>Formats considered</h4>" + table(
        ["format", "bits/weight", "est. memory", "fits", "native", "eligible", "note"], "lrr",
        rows, "alts") if rows else "")
    return (f'<div class="panel quant"><h3>Quantization<span class="hint">model-level weight '
            f'format</span></h3><div class="split"><div>{_facts(quant_facts(q))}{reason}</div>'
            f'<div>{alts}</div></div></div>')


def _runtime(rt: RuntimeSettings) -> str:
    rows = [f'<tr><td class="mono">{esc(n)}</td><td class="mono">{esc(v)}</td>'
            f'<td class="wrap faint">{esc(r)}</td></tr>' for n, v, r in settings_of(rt)]
    where = " · ".join(f"{k} {v}" for k, v in (("device", rt.device), ("target", rt.target))
                       if v)
    return (f'<div class="panel"><h3>Runtime settings<span class="hint">{esc(where)}</span>'
            f'</h3>{table(["setting", "value", "reason"], "lll", rows, "rt")}</div>')


def _optimization(opt: TorchOptimization | OnnxOptimization, title: str = "Optimization") -> str:
    reverted = "".join(f'<li><b class="mono">{esc(r.name)}</b>: {esc(r.reason)}</li>'
                       for r in opt.passes_reverted)
    nums = [f'<tr class="{"ok-row" if r[5] == "✓" else "bad-row"}">'
            + "".join(f'<td class="num">{esc(c)}</td>' for c in r[:5])
            + f"<td>{_yes(r[5])}</td></tr>" for r in numerics_rows(opt)]
    groups = []
    for group in sorted(opt.notes, key=str):
        counts, texts = note_items(opt.notes[group])
        chips = "".join(f'<span class="chip">{esc(k)} <b>{esc(v)}</b></span>' for k, v in counts)
        lines = "".join(f'<div class="faint">{esc(k)}: {esc(v)}</div>' for k, v in texts)
        groups.append(f'<tr><td class="mono">{esc(group)}</td><td class="wrap">{chips}{lines}'
                      f"</td></tr>")
    decided = [f'<tr><td class="mono">{esc(r[0])}</td>'
               + "".join(f'<td class="wrap">{esc(c)}</td>' for c in r[1:]) + "</tr>"
               for r in decision_rows(opt)]
    return (f'<div class="panel opt"><h3>{esc(title)}<span class="hint">passes, measured error '
            'vs the original model</span></h3>' + _facts(optimization_facts(opt))
            + (f'<h4>Reverted</h4><ul class="warn">{reverted}</ul>' if reverted else "")
            + ("<h4>Measured error</h4>" + table(["output", "max abs", "limit", "max rel",
                                                  "cosine", "within"], "rrrrr", nums, "numerics")
               if nums else "")
            + (f'<h4>Pass notes</h4><table class="notes-t"><tbody>{"".join(groups)}</tbody>'
               f"</table>" if groups else "") + sensitivity_html(opt)
            + ("<h4>Decisions on its nodes</h4>" + table(
                ["node", *REWRITE_KINDS], "", decided, "decided")
               if decided else "") + "</div>")


def deployment(plan: Plan, collapsed: bool = False,
               colors: Mapping[str, str] | None = None) -> str:
    """Memory and runtime settings (with the optimization, if any) as a two-column grid; the
    quantization, the partition across devices and the LLM phases (if any) full width below it:
    the formats table's notes need the width, in a column it spilled out of its panel.
    ``colors``: the kernel-class colours of the page (default: those of this plan alone)."""
    mem, q, rt, llm = plan.memory, plan.quantization, plan.runtime_settings, plan.llm
    memory = _memory(mem) if mem is not None else ""
    runtime = _runtime(rt) if rt is not None else ""
    opts = "".join(_optimization(opt, title) for key, title in ARTIFACTS
                   if (opt := getattr(plan, key)) is not None)
    left, right = (memory + runtime, opts) if opts else (memory, runtime)
    if not left:  # one panel alone takes the left column
        left, right = right, ""
    split = partition_panel(plan, colors) + tp_panel(plan)
    part = (_quantization(q) if q is not None else "") + split \
        + (llm_html(llm) if llm is not None else "")
    choice = deploy_html(plan)
    if not left and not right and not part and not choice:
        return ""
    grid = (f'<section class="deploy">{choice}</section>' if choice else "") + (
        f'<section class="grid deploy"><div class="col">{left}</div>'
        f'<div class="col">{right}</div></section>' if left or right else "") + part
    if not collapsed:
        return grid
    what = "Memory, quantization, runtime settings" + (" and partition" if split else "") \
        + (" and LLM phases" if llm is not None else "")
    return (f'<details class="more"><summary>{what} on '
            f'{esc(target_name(plan.target))}</summary>{grid}</details>')


def comparison(plans: Sequence[Plan]) -> str:
    sums, tgts = [p.summary for p in plans], [p.target for p in plans]
    lats = [finite(s.est_latency_s) for s in sums]
    best = min((x for x in lats if x), default=None)
    first = sums[0].time_by_kernel_class_s
    classes = sorted({c for s in sums for c in s.time_by_kernel_class_s},
                     key=lambda c: (-(finite(first.get(c)) or 0.0), c))
    rows: list[tuple[str, list[str], bool]] = [
        ("kind · generation", [f"{t.kind} · {t.generation}" for t in tgts], False),
        ("memory bandwidth", [fmt_rate(t.bandwidth_bytes_per_s) for t in tgts], False),
        ("estimated latency", [fmt_seconds(x) for x in lats], True),
        ("vs fastest", [f"{x / best:.2f}×" if x and best else "—" for x in lats], False),
        *[(f"{b}-bound: nodes · time",
           [f"{fmt_count(s.bottleneck_mix[b])} · {fmt_seconds(s.time_by_bottleneck_s[b])}"
            for s in sums], False) for b in BOTTLENECKS],
        *[(f"time in {c}", [fmt_seconds(s.time_by_kernel_class_s.get(c)) for s in sums], False)
          for c in classes],
        ("unsupported ops", [fmt_count(sum(s.unsupported_ops.values())) for s in sums], False),
        ("warnings", [fmt_count(len(p.warnings)) for p in plans], False),
    ]
    head = "".join(f'<th class="num">{esc(target_name(t))}</th>' for t in tgts)
    body = "".join(
        f"<tr><td>{esc(label)}</td>" + "".join(
            f'<td class="num{" best" if mark and lats[i] == best else ""}">{esc(c)}</td>'
            for i, c in enumerate(cells)) + "</tr>" for label, cells, mark in rows)
    out = (f'<div class="panel"><h3>Targets compared</h3><table class="cmp"><thead><tr><th></th>'
           f"{head}</tr></thead><tbody>{body}</tbody></table></div>")
    deploy, last = [], None
    for group, label, cells in deployment_rows(plans):
        if group != last:
            deploy.append(f'<tr class="grp"><td colspan="{len(plans) + 1}">{esc(group)}</td></tr>')
            last = group
        name = f'<td class="mono">{esc(label)}</td>' if group == "Runtime settings" else \
            f"<td>{esc(label)}</td>"
        deploy.append(f"<tr>{name}" + "".join(f'<td class="num">{_yes(c)}</td>' for c in cells)
                      + "</tr>")
    if deploy:
        out += (f'<div class="panel"><h3>Memory, format and runtime settings compared</h3>'
                f'<table class="cmp dep"><thead><tr><th></th>{head}</tr></thead><tbody>'
                f'{"".join(deploy)}</tbody></table></div>')
    return f'<section class="cmps">{out}</section>'
