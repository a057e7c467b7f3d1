"""HTML panels of a plan: summary cards, findings, target comparison and the deployment panels
(memory, quantization, runtime settings, optimization; the partition from ``partition_html``).

Every text goes through ``html_text.esc`` (``html.escape`` with quotes): reasons and notes name
the model's tensors and targets, so they are untrusted like node names. The facts come from
``sections_md``, so the HTML and markdown reports print the same values.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from graphopt.ir.kinds import REWRITE_KINDS
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
from graphopt.report.html_text import esc, table
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

__all__ = ["bar", "cards", "comparison", "deployment", "issues", "share", "target_name"]

# Memory components in the order a budget is read; "free" is what is left for larger batches.
_MEM_COLORS = {"parameters": "#2f64d0", "activations (peak)": "#8a55d4", "workspace": "#e8903a",
               "reserve": "#9aa3ad", "free": "#cfe3d6"}
_MEM_SPARE = ("#16a08a", "#c7a020", "#d2476f", "#6d597a")


def target_name(target: Mapping[str, Any]) -> str:
    return str(target.get("display_name") or target.get("name") or "?")


def share(part: Any, whole: Any) -> float:
    p, w = finite(part), finite(whole)
    return p / w if p is not None and w else 0.0


def bar(frac: float, color: str) -> str:
    return (f'<div class="bar"><span style="width:{100 * min(max(frac, 0.0), 1.0):.1f}%;'
            f'background:{color}"></span></div>')


def _section(plan: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = plan.get(key)
    return value if isinstance(value, Mapping) else {}


def _yes(text: str, good: str = "yes") -> str:
    """A yes/no fact as a coloured chip; anything else as plain text."""
    if text in ("yes", "✓", "no", "✗"):
        return f'<span class="chip {"yes" if text in (good, "✓") else "bad"}">{esc(text)}</span>'
    return esc(text)


def _mark(value: Any) -> str:
    """A compact yes/no for table cells, where a chip per cell would be noise."""
    return {True: '<span class="y">✓</span>', False: '<span class="n">✗</span>'}.get(value, "—")


def _facts(facts: Sequence[tuple[str, str, str]]) -> str:
    rows = "".join(f"<dt>{esc(k)}</dt><dd>{_yes(v)}"
                   + (f' <span class="faint">{esc(d)}</span>' if d else "") + "</dd>"
                   for k, v, d in facts)
    return f'<dl class="facts">{rows}</dl>'


def card(key: str, value: str, sub: str, small: bool = False) -> str:
    return (f'<div class="card"><div class="k">{esc(key)}</div><div class="v{" sm" * small}" '
            f'title="{esc(value)}">{esc(value)}</div>'
            f'<div class="s">{esc(sub)}</div></div>')


def cards(plan: Mapping[str, Any]) -> str:
    s, tgt, model = plan.get("summary") or {}, plan.get("target") or {}, plan.get("model") or {}
    mem, q, opt = (_section(plan, k) for k in ("memory", "quantization", "optimization"))
    lat = finite(s.get("est_latency_s"))
    flops, nbytes = finite(s.get("total_flops")), finite(s.get("total_bytes"))
    peaks = tgt.get("peak_flops") or {}
    top = max(peaks, key=lambda k: (finite(peaks[k]) or 0.0, k)) if peaks else None
    out = [
        card("Estimated latency", fmt_seconds(lat), f"on {target_name(tgt)}"),
        card("Compute", fmt_si(flops, "FLOP"),
             f"{fmt_rate(flops / lat if flops and lat else None, 'FLOP/s')} average"),
        card("Memory traffic", fmt_bytes(nbytes),
             f"{fmt_rate(nbytes / lat if nbytes and lat else None)} average"),
        card("Nodes", fmt_count(model.get("num_nodes") or len(plan.get("nodes") or [])),
             f"{fmt_si(model.get('param_count'))} parameters"),
        card("Target", target_name(tgt),
             f"{tgt.get('generation', '')} · {fmt_rate(tgt.get('bandwidth_bytes_per_s'))}"
             + (f" · {top} {fmt_rate(peaks[top], 'FLOP/s')}" if top else ""), small=True),
    ]
    if mem:
        fits = {True: "fits", False: "does not fit"}.get(mem.get("fits"), "—")
        out.append(card("Memory", f"{fits} · {fmt_bytes(mem.get('required_bytes'))}",
                        f"of {fmt_bytes(mem.get('usable_bytes'))} usable · max batch "
                        f"{fmt_count(mem.get('max_batch_size'))}"
                        + (f" · batch {fmt_count(mem['recommended_batch_size'])} recommended"
                           if mem.get("recommended_batch_size") is not None else ""),
                        small=True))
    if q:
        out.append(_weights_card(plan, q))
    part = _section(plan, "partition")
    if part:
        facts = {k: v for k, v, _ in partition_facts(part)}
        out.append(card("Split across devices", f"{facts['devices']} · {facts['strategy']}",
                        f"makespan {facts['makespan']} · {facts['transfers']}", small=True))
    if opt:
        facts = {k: v for k, v, _ in optimization_facts(opt)}
        out.append(card("Optimized", facts["compute dtype"], f"passes: {facts['passes applied']}"
                        f" · within tolerance: {facts['outputs within']}", small=True))
    return '<section class="cards">' + "".join(out) + "</section>"


def _weights_card(plan: Mapping[str, Any], q: Mapping[str, Any]) -> str:
    """The weights the nodes get (their precision decisions), not the memory fit's model-level
    pick; where that pick is narrower than what the nodes take, one line says so."""
    formats = Counter(str((n.get("decisions") or {}).get("precision", {}).get("format"))
                      for n in plan.get("nodes") or [] if (n.get("params") or 0) > 0 and
                      isinstance((n.get("decisions") or {}).get("precision"), Mapping))
    formats.pop("None", None)
    if not formats:
        sub = (f"{fmt_value(q.get('bits_per_weight'))} bits/weight · "
               f"{fmt_bytes(q.get('est_memory_bytes'))}") if q.get("format") else "no weights"
        return card("Weights (memory fit)", str(q.get("display") or q.get("format") or "none"),
                    sub, small=True)
    value = " · ".join(f"{f} ×{c}" if len(formats) > 1 else f for f, c in formats.most_common())
    fit = q.get("format")
    sub = (f"the memory fit alone would allow {q.get('display') or fit}; the nodes do not "
           "take it (each node's precision says why)" if fit and fit not in formats else
           f"{fmt_value(q.get('bits_per_weight'))} bits/weight · "
           f"{fmt_bytes(q.get('est_memory_bytes'))}")
    return card("Weights (per node)", value, sub, small=True)


def _costliest_kernels(kernels: list[Mapping[str, Any]]) -> str:
    """The ranking by what runs: each kernel at its fused time (none before fusion is planned)."""
    if not kernels:
        return ""
    rows = [f'<tr><td class="num faint">{i}</td><td class="mono trunc" '
            f'title="{esc(", ".join(k.get("nodes") or []))}">{esc(k.get("name", "?"))}</td>'
            f'<td>{esc(k.get("kernel_class", "?"))}</td>'
            f'<td class="num">{esc(fmt_seconds(k.get("est_time_s")))}</td>'
            f'<td class="num faint">{esc(fmt_seconds(k.get("unfused_s")))}</td>'
            f'<td class="num">{100 * (finite(k.get("share")) or 0.0):.1f}%</td></tr>'
            for i, k in enumerate(kernels, 1)]
    return ('<h3>Costliest kernels</h3><p class="faint">fused: each kernel as it runs, ranked '
            'by its fused time, beside its nodes\' unfused sum</p>'
            + table(["#", "kernel", "kernel class", "est. time", "unfused", "share"], "rllrrr",
                    rows))


def issues(plan: Mapping[str, Any], index: dict[str, int]) -> tuple[str, str]:
    """The costliest-nodes panel and the findings panel (warnings, unsupported ops, flags)."""
    s, warnings = plan.get("summary") or {}, plan.get("warnings") or []
    lat, parts = s.get("est_latency_s"), []
    rows = []
    for i, n in enumerate(s.get("costliest_nodes") or [], 1):
        name = str(n.get("name", "?"))
        jump = f' class="mono trunc jump" data-idx="{index[name]}"' if name in index else \
            ' class="mono trunc"'
        frac = finite(n.get("share")) or share(n.get("est_time_s"), lat)
        rows.append(f'<tr><td class="num faint">{i}</td><td{jump} title="{esc(name)}">'
                    f'{esc(name)}</td>'
                    f'<td>{esc(n.get("kernel_class", "?"))}</td><td class="num">'
                    f'{esc(fmt_seconds(n.get("est_time_s")))}</td><td class="num">{100 * frac:.1f}%'
                    f'<span class="sharebar"><span style="width:{100 * min(frac, 1.0):.1f}%">'
                    f'</span></span></td></tr>')
    costly = ('<div class="panel">' + _costliest_kernels(s.get("costliest_kernels") or [])
              + '<h3>Costliest nodes</h3><p class="faint">unfused: each '
              'node its own kernel (the fusion section gives what runs fused)</p>' + table(
        ["#", "node", "kernel class", "est. time", "share"], "rllrr", rows) + "</div>")
    if warnings:
        parts.append("<h4>Warnings</h4><ul class=\"warn\">"
                     + "".join(f"<li>{esc(w)}</li>" for w in warnings) + "</ul>")
    for title, key, cls in (("Unsupported ops", "unsupported_ops", "chip"),
                            ("Flagged nodes", "flagged_nodes", "chip"),
                            ("Patterns found", "patterns", "chip yes")):
        items = s.get(key) or {}
        if items:
            parts.append(f"<h4>{title}</h4>" + "".join(
                f'<span class="{cls}">{esc(k)} × {esc(fmt_count(v))}</span>'
                for k, v in sorted(items.items(), key=lambda kv: str(kv[0]))))
    body = "".join(parts) or '<p class="ok">No warnings, unsupported ops or flagged nodes.</p>'
    return costly, f'<div class="panel issues"><h3>Findings</h3>{body}</div>'


def _memory(mem: Mapping[str, Any]) -> str:
    parts = [b for b in mem.get("breakdown") or [] if isinstance(b, Mapping)]
    spare = iter(_MEM_SPARE * len(parts))
    colors = [_MEM_COLORS.get(str(b.get("component"))) or next(spare) for b in parts]
    total = sum(finite(b.get("bytes")) or 0.0 for b in parts)
    stack = "".join(f'<span title="{esc(b.get("component", "?"))}" class="'
                    f'{"nz" if (finite(b.get("bytes")) or 0) > 0 else ""}" style="width:'
                    f'{100 * share(b.get("bytes"), total):.2f}%;background:{c}"></span>'
                    for b, c in zip(parts, colors, strict=True))
    rows = [f'<tr><td><i class="sw" style="background:{c}"></i>{esc(b.get("component", "?"))}'
            f'</td><td class="num">{esc(fmt_bytes(b.get("bytes")))}</td><td class="num faint">'
            f'{esc(fmt_count(b.get("bytes")))}</td><td class="num">'
            f'{esc(fmt_pct(b.get("percent"), b.get("bytes")))}</td></tr>'
            for b, c in zip(parts, colors, strict=True)]
    notes = "".join(f"<li>{esc(n)}</li>" for n in mem.get("notes") or [])
    return (f'<div class="panel mem"><h3>Memory<span class="hint">of '
            f'{esc(fmt_bytes(mem.get("total_bytes")))} on {esc(mem.get("target") or "?")}'
            f'</span></h3>' + (f'<div class="stack">{stack}</div>' if parts else "")
            + (table(["component", "size", "bytes", "share"], "lrrr", rows, "mem-table")
               if rows else "") + _facts(memory_facts(mem))
            + (f'<ul class="notes">{notes}</ul>' if notes else "") + "</div>")


def _quantization(q: Mapping[str, Any]) -> str:
    rows = []
    for a in q.get("alternatives") or []:
        if not isinstance(a, Mapping):
            continue
        cls = "pick" if a.get("format") == q.get("format") else \
            "faint" if a.get("eligible") is False else ""
        rows.append(f'<tr class="{cls}"><td class="mono">{esc(a.get("format", "?"))}</td>'
                    f'<td class="num">{esc(fmt_value(a.get("bits_per_weight")))}</td>'
                    f'<td class="num">{esc(fmt_bytes(a.get("est_memory_bytes")))}</td>'
                    + "".join(f"<td>{_mark(a.get(k))}</td>" for k in ("fits", "native",
                                                                       "eligible"))
                    + f'<td class="wrap">{esc(a.get("note") or "")}</td></tr>')
    reason = f'<p class="why">{esc(q["reason"])}</p>' if q.get("reason") else ""
    alts = ("<h4>Formats considered</h4>" + table(
        ["format", "bits/weight", "est. memory", "fits", "native", "eligible", "note"], "lrr",
        rows, "alts") if rows else "")
    return (f'<div class="panel quant"><h3>Quantization<span class="hint">model-level weight '
            f'format</span></h3>{_facts(quant_facts(q))}{reason}{alts}</div>')


def _runtime(rt: Mapping[str, Any]) -> str:
    rows = [f'<tr><td class="mono">{esc(n)}</td><td class="mono">{esc(v)}</td>'
            f'<td class="wrap faint">{esc(r)}</td></tr>' for n, v, r in settings_of(rt)]
    where = " · ".join(f"{k} {rt[k]}" for k in ("device", "target") if rt.get(k))
    return (f'<div class="panel"><h3>Runtime settings<span class="hint">{esc(where)}</span>'
            f'</h3>{table(["setting", "value", "reason"], "lll", rows, "rt")}</div>')


def _optimization(opt: Mapping[str, Any], title: str = "Optimization") -> str:
    reverted = "".join(f'<li><b class="mono">{esc(r.get("pass", "?"))}</b>: '
                       f'{esc(r.get("reason") or "")}</li>'
                       for r in opt.get("passes_reverted") or [] if isinstance(r, Mapping))
    nums = [f'<tr class="{"ok-row" if r[5] == "✓" else "bad-row"}">'
            + "".join(f'<td class="num">{esc(c)}</td>' for c in r[:5])
            + f"<td>{_yes(r[5])}</td></tr>" for r in numerics_rows(opt)]
    notes = opt.get("notes") if isinstance(opt.get("notes"), Mapping) else {}
    groups = []
    for group in sorted(notes, key=str):
        counts, texts = note_items(notes[group])
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


def deployment(plan: Mapping[str, Any], collapsed: bool = False,
               colors: Mapping[str, str] | None = None) -> str:
    """Memory + quantization, then runtime settings + optimization, as a two-column grid; the
    partition across devices and the LLM phases (if any) full width below it. ``colors``: the
    kernel-class colours of the page (default: those of this plan alone)."""
    mem, q, rt = (_section(plan, k) for k in ("memory", "quantization", "runtime_settings"))
    left = (_memory(mem) if mem else "") + (_runtime(rt) if rt else "")
    right = "".join(_optimization(opt, title) for key, title in ARTIFACTS
                    if (opt := _section(plan, key))) + (_quantization(q) if q else "")
    llm = _section(plan, "llm")
    split = partition_panel(plan, colors) + tp_panel(plan)
    part = split + (llm_html(llm) if llm else "")
    choice = deploy_html(plan)
    if not left and not right and not part and not choice:
        return ""
    grid = (f'<section class="deploy">{choice}</section>' if choice else "") + (
        f'<section class="grid deploy"><div class="col">{left}</div>'
        f'<div class="col">{right}</div></section>' if left or right else "") + part
    if not collapsed:
        return grid
    what = "Memory, quantization, runtime settings" + (" and partition" if split else "") \
        + (" and LLM phases" if llm else "")
    return (f'<details class="more"><summary>{what} on '
            f'{esc(target_name(plan.get("target") or {}))}</summary>{grid}</details>')


def comparison(plans: Sequence[Mapping[str, Any]]) -> str:
    sums = [p.get("summary") or {} for p in plans]
    tgts = [p.get("target") or {} for p in plans]
    lats = [finite(s.get("est_latency_s")) for s in sums]
    best = min((x for x in lats if x), default=None)
    first = sums[0].get("time_by_kernel_class_s") or {}
    classes = sorted({c for s in sums for c in s.get("time_by_kernel_class_s") or {}},
                     key=lambda c: (-(finite(first.get(c)) or 0.0), c))
    rows: list[tuple[str, list[str], bool]] = [
        ("kind · generation", [f"{t.get('kind', '?')} · {t.get('generation', '?')}" for t in tgts],
         False),
        ("memory bandwidth", [fmt_rate(t.get("bandwidth_bytes_per_s")) for t in tgts], False),
        ("estimated latency", [fmt_seconds(x) for x in lats], True),
        ("vs fastest", [f"{x / best:.2f}×" if x and best else "—" for x in lats], False),
        *[(f"{b}-bound: nodes · time",
           [f"{fmt_count((s.get('bottleneck_mix') or {}).get(b, 0))} · "
            f"{fmt_seconds((s.get('time_by_bottleneck_s') or {}).get(b, 0.0))}" for s in sums],
           False) for b in BOTTLENECKS],
        *[(f"time in {c}", [fmt_seconds((s.get("time_by_kernel_class_s") or {}).get(c))
                            for s in sums], False) for c in classes],
        ("unsupported ops", [fmt_count(sum((s.get("unsupported_ops") or {}).values()))
                             for s in sums], False),
        ("warnings", [fmt_count(len(p.get("warnings") or [])) for p in plans], False),
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
