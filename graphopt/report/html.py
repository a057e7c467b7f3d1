"""A self-contained HTML page of a plan report: summary, roofline, memory / quantization /
runtime-settings / optimization panels (``sections_html``), sortable/filterable node table.

Why it is built this way:

1. One file, no network: CSS and JS are inline, the Content-Security-Policy allows no fetches and
   only the page's own script (by SHA-256), so an injected ``<script>`` could not run anyway.
2. Names come from untrusted models: Python-rendered text goes through ``html.escape``; the node
   data sits in one ``<script type="application/json">`` block with ``<``, ``>`` and ``&``
   written as ``\\u003c`` etc., so ``</script>`` in a name cannot close it; the script builds the
   table with ``textContent`` only.
3. 50k-node models: the node data stores each distinct string, decision set and node profile
   once (``_html_data``; 50k nodes: 5 MB where one array per node took 50 MB), the table
   renders a page of rows at a time, and roofline points on one pixel merge above
   ``MERGE_POINTS``.
4. Deterministic: keys are sorted and nothing depends on time or locale, so the same report gives
   the same bytes (diffable, cacheable).
"""

from __future__ import annotations

import base64
import gc
import hashlib
import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from graphopt._version import __version__
from graphopt.report._html_assets import PAGE, SCRIPT, STYLE
from graphopt.report._html_colors import class_colors
from graphopt.report._html_data import Tables, encode, payload, points, r6
from graphopt.report.format import (
    BOTTLENECKS,
    SCHEMA_VERSION,
    finite,
    fmt_count,
    fmt_rate,
    fmt_seconds,
    fmt_shape,
    fmt_si,
    plans_of,
)
from graphopt.report.fusion import fusion_html, node_labels
from graphopt.report.html_text import esc
from graphopt.report.prediction import prediction_html
from graphopt.report.sections_html import (
    bar,
    cards,
    comparison,
    deployment,
    issues,
    share,
    target_name,
)
from graphopt.report.shape_range import shape_range_html

if TYPE_CHECKING:  # ir.plan imports the report package (its emitters): no import at run time
    from graphopt.ir.plan import NodePlan, Plan, PlanSet

__all__ = ["render_html"]

logger = logging.getLogger(__name__)

MERGE_POINTS = 2000  # above this many points per chart, points on the same pixel are merged
MAX_SHOW_ALL = 5000  # "show all" is offered only up to this many matching rows (DOM cost)
_BN_COLORS = {"compute": "#2f64d0", "memory": "#e8903a", "latency": "#9aa3ad"}
_W, _H, _PL, _PR, _PT, _PB = 600, 360, 58, 104, 14, 42  # roofline box and paddings (px)


def _join(plans: Sequence[Plan]) -> list[tuple[str, list[NodePlan | None]]]:
    """Nodes matched across targets by (name, occurrence), in the first plan's order."""
    if len(plans) == 1:  # nothing to match
        return [(n.name, [n]) for n in plans[0].nodes]
    order: list[tuple[str, int]] = []
    table: dict[tuple[str, int], list[NodePlan | None]] = {}
    for p, plan in enumerate(plans):
        seen: dict[str, int] = {}
        for n in plan.nodes:
            key = (n.name, seen.get(n.name, 0))
            seen[n.name] = key[1] + 1
            if key not in table:
                order.append(key)
                table[key] = [None] * len(plans)
            table[key][p] = n
    return [(key[0], table[key]) for key in order]


def _payload(plans: Sequence[Plan], tb: Tables, colors: dict[str, str], page: int) -> str:
    """The embedded JSON (``_html_data``): node tables plus the targets and view settings."""
    targets = [{"name": p.target.name, "display": target_name(p.target),
                "lat": r6(p.summary.est_latency_s)} for p in plans]
    return payload(tb, {"targets": targets, "colors": colors, "page": page,
                        "merge": MERGE_POINTS, "maxall": MAX_SHOW_ALL})


def _time_panel(plan: Plan, colors: dict[str, str]) -> str:
    s = plan.summary
    mix, tmix = s.bottleneck_mix, s.time_by_bottleneck_s  # every bottleneck is a key
    total = sum(finite(tmix[b]) or 0.0 for b in BOTTLENECKS)
    stack = "".join(f'<span title="{b}" style="width:{100 * share(tmix[b], total):.1f}%;'
                    f'background:{_BN_COLORS[b]}"></span>' for b in BOTTLENECKS)
    keys = "".join(f'<span><i class="sw" style="background:{_BN_COLORS[b]}"></i>{b} '
                   f'<b>{esc(fmt_seconds(tmix[b]))}</b> '
                   f'({esc(fmt_count(mix[b]))} nodes)</span>' for b in BOTTLENECKS)
    counts = s.kernel_class_counts
    # a class may have a time and no count, or a count and no time
    times = {c: s.time_by_kernel_class_s.get(c) for c in {*s.time_by_kernel_class_s, *counts}}
    classes = sorted(times, key=lambda c: (-(finite(times[c]) or 0.0), c))
    top = max((finite(times[c]) or 0.0 for c in classes), default=0.0)
    bars = "".join(
        f'<span class="lbl" title="{esc(c)}">{esc(c)}</span>'
        f'{bar(share(times[c], top), colors.get(c, "#9aa3ad"))}'
        f'<span class="t">{esc(fmt_seconds(times[c]))}</span>'
        f'<span class="n">{100 * share(times[c], s.est_latency_s):.1f}% · '
        f'{esc(fmt_count(counts.get(c, 0)))}</span>' for c in classes)
    return (f'<div class="panel"><h3>Where the time goes<span class="hint">by bottleneck, then by '
            f'kernel class (time · share · nodes)</span></h3><div class="stack">{stack}</div>'
            f'<div class="keys">{keys}</div><div class="bars">{bars}</div></div>')


@dataclass(frozen=True)
class _Frame:
    """The roofline's log-log box: decades ``x0..x1`` (FLOP/byte) and ``y0..y1`` (FLOP/s)."""

    x0: int
    x1: int
    y0: int
    y1: int
    pw: int = _W - _PL - _PR
    ph: int = _H - _PT - _PB

    def px(self, v: float) -> float:
        return _PL + (math.log10(v) - self.x0) / (self.x1 - self.x0) * self.pw

    def py(self, v: float) -> float:
        return _PT + self.ph - (math.log10(v) - self.y0) / (self.y1 - self.y0) * self.ph


def _frame(pts: Sequence[tuple[float, float, int]], peaks: Mapping[float, list[str]],
           bw: float) -> _Frame:
    """The decades that hold every point, and each ridge a decade either side."""
    ridges = [p / bw for p in peaks] if bw else []
    xs = [x for x, _, _ in pts] + [r / 10 for r in ridges] + [r * 10 for r in ridges] or [1e-2, 1e4]
    ys = [y for _, y, _ in pts] + list(peaks) or [1e9, 1e15]
    x1, y1 = math.ceil(math.log10(max(xs))), math.ceil(math.log10(max(ys) * 1.05))
    x0 = max(math.floor(math.log10(min(xs))), x1 - 10)
    y0 = max(math.floor(math.log10(min(ys))), y1 - 8)
    return _Frame(min(x0, x1 - 1), x1, min(y0, y1 - 1), y1)


def _axes(f: _Frame, t: int) -> list[str]:
    """The clip box, the decade grid with its labels, and the axes' box."""
    pw, ph, px, py = f.pw, f.ph, f.px, f.py
    parts = [f'<clipPath id="clip{t}"><rect x="{_PL}" y="{_PT}" width="{pw}" height="{ph}"/>'
             f'</clipPath>']
    step = 1 if f.x1 - f.x0 <= 8 else 2
    for k in range(f.x0, f.x1 + 1):
        parts.append(f'<line class="gl" x1="{px(10.0**k):.1f}" y1="{_PT}" x2="{px(10.0**k):.1f}" '
                     f'y2="{_PT + ph}"/>')
        if (k - f.x0) % step == 0:
            parts.append(f'<text x="{px(10.0**k):.1f}" y="{_PT + ph + 14}" text-anchor="middle">'
                         f'{esc(fmt_si(10.0**k))}</text>')
    for k in range(f.y0, f.y1 + 1):
        parts.append(f'<line class="gl" x1="{_PL}" y1="{py(10.0**k):.1f}" x2="{_PL + pw}" '
                     f'y2="{py(10.0**k):.1f}"/><text x="{_PL - 6}" y="{py(10.0**k) + 3.5:.1f}" '
                     f'text-anchor="end">{esc(fmt_si(10.0**k))}</text>')
    parts.append(f'<rect class="ax" x="{_PL}" y="{_PT}" width="{pw}" height="{ph}" fill="none"/>')
    return parts


def _roofs(f: _Frame, t: int, peaks: Mapping[float, list[str]], bw: float) -> list[str]:
    """One flat roof per peak (labelled right of the plot) and the bandwidth slope."""
    px, py, parts = f.px, f.py, []
    label_y = -1e9
    lo, hi = 10.0**f.x0, 10.0**f.x1
    for peak in sorted(peaks, reverse=True):
        start = max(peak / bw, lo) if bw else lo
        parts.append(f'<line class="rl roof-peak" clip-path="url(#clip{t})" x1="{px(start):.1f}" '
                     f'y1="{py(peak):.1f}" x2="{px(hi):.1f}" y2="{py(peak):.1f}"/>')
        label_y = max(py(peak) + 3.5, label_y + 11)  # right of the plot, never on a point
        parts.append(f'<text class="rt" x="{_PL + f.pw + 5}" y="{label_y:.1f}">'
                     f'{esc("/".join(peaks[peak]))} {esc(fmt_si(peak))}</text>')
    if bw:
        a = max(lo, 10.0**f.y0 / bw)
        b = min(hi, max(peaks) / bw) if peaks else hi
        if b > a:
            parts.append(f'<line class="rl roof-bw" clip-path="url(#clip{t})" x1="{px(a):.1f}" '
                         f'y1="{py(bw * a):.1f}" x2="{px(b):.1f}" y2="{py(bw * b):.1f}"/>')
            m = math.sqrt(a * math.sqrt(a * b))
            ang = math.degrees(math.atan2(py(bw * b) - py(bw * a), px(b) - px(a)))
            parts.append(f'<text class="rt bwl" transform="translate({px(m):.1f},'
                         f'{py(bw * m) - 6:.1f}) rotate({ang:.1f})">{esc(fmt_rate(bw))}</text>')
    return parts


def _roofline(plan: Plan, t: int, colors: dict[str, str],
              pts: Sequence[tuple[float, float, int]]) -> str:
    """Log-log roofline frame (axes, bandwidth slope, one roof per peak); JS adds the points.

    ``pts`` are the distinct points with their node counts (``_html_data.points``): the frame
    only needs the extremes and the count.
    """
    tgt, nodes = plan.target, plan.nodes
    bw = finite(tgt.bandwidth_bytes_per_s) or 0.0
    peaks: dict[float, list[str]] = {}
    for k, v in sorted(tgt.peak_flops.items()):
        if (finite(v) or 0.0) > 0:
            peaks.setdefault(float(v), []).append(str(k))
    plotted = sum(c for _, _, c in pts)
    f = _frame(pts, peaks, bw)
    parts = [*_axes(f, t), *_roofs(f, t, peaks, bw)]
    parts.append(f'<text x="{_PL + f.pw / 2:.1f}" y="{_H - 6}" text-anchor="middle">'
                 f'arithmetic intensity (FLOP/byte)</text><text transform="translate(13,'
                 f'{_PT + f.ph / 2:.1f}) rotate(-90)" text-anchor="middle">attained FLOP/s</text>')
    box = (f'data-t="{t}" data-lx0="{f.x0}" data-lx1="{f.x1}" data-ly0="{f.y0}" '
           f'data-ly1="{f.y1}" data-px="{_PL}" data-py="{_PT}" data-pw="{f.pw}" '
           f'data-ph="{f.ph}"')
    svg = (f'<svg class="roofline" viewBox="0 0 {_W} {_H}" role="img" aria-label="Roofline of '
           f'{esc(target_name(tgt))}" {box}>{"".join(parts)}<g class="pts" '
           f'clip-path="url(#clip{t})"></g></svg>')
    present = sorted({n.analysis.kernel_class.value for n in nodes})
    legend = "".join(f'<button type="button" data-class="{esc(c)}"><i class="sw" '
                     f'style="background:{colors.get(c, "#9aa3ad")}"></i>{esc(c)}</button>'
                     for c in present)
    skipped = len(nodes) - plotted
    cap = (f"{plotted:,} of {len(nodes):,} nodes plotted; x = FLOPs per byte moved, y = FLOPs "
           f"/ estimated time. Lines: memory bandwidth and the peak of each dtype.")
    cap += f" {skipped:,} with no FLOPs, bytes or time are not shown." if skipped else ""
    cap += " Overlapping points are merged." if plotted > MERGE_POINTS else ""
    return (f'<div class="panel roof"><h3>Roofline<span class="hint">click a point or a class to '
            f'filter the node table</span></h3>{svg}<div class="legend">{legend}</div>'
            f'<div class="cap">{esc(cap)}</div></div>')


@contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic GC while rendering: it would walk the whole report (millions of objects at 50k
    nodes) on each of its passes, ~0.7 s each; rendering makes no cycles for it to free."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def render_html(report: Plan | PlanSet, *, page_size: int = 200) -> str:
    """Render a single- or multi-target plan report as one self-contained HTML page.

    Args:
        report: a plan, or a plan set (one plan per target).
        page_size: node-table rows rendered per page ("show more" adds as many).
    """
    with _gc_paused():
        return _render(plans_of(report), page_size)


def _inputs(plan: Plan) -> str:
    return ", ".join(f"{t.name} {fmt_shape(t.shape)} {t.dtype or ''}".strip()
                     for t in plan.model.inputs)


def _render(plans: tuple[Plan, ...], page_size: int) -> str:
    colors = class_colors(plans)
    joined = _join(plans)
    tb = encode(joined, [node_labels(p) for p in plans])
    index: dict[str, int] = {}
    for i, (name, _) in enumerate(joined):
        index.setdefault(name, i)
    digest = base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()
    csp = (f"default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
           f"script-src 'sha256-{digest}'")
    targets = " · ".join(target_name(p.target) for p in plans)
    multi = len(plans) > 1
    sections = [comparison(plans)] if multi else [cards(p) for p in plans]  # one, or none
    for t, plan in enumerate(plans):
        if multi:
            sections.append(f"<h2>{esc(target_name(plan.target))}</h2>")
        costly, findings = issues(plan, index)
        roof = _roofline(plan, t, colors, points(tb, t))
        sections.append(f'<section class="grid"><div class="col">{_time_panel(plan, colors)}'
                        f'{costly}</div><div class="col">{roof}'
                        f"{findings}</div></section>{shape_range_html(plan)}{fusion_html(plan)}"
                        f"{prediction_html(plan)}"
                        f"{deployment(plan, collapsed=multi, colors=colors)}")
    options = "".join(f'<option value="{esc(c)}">{esc(c)}</option>' for c in colors)
    bn_label = "All bottlenecks" + (f" ({target_name(plans[0].target)})" if multi else "")
    bn_opts = "".join(f'<option value="{b}">{b}</option>' for b in BOTTLENECKS)
    data = _payload(plans, tb, colors, page_size)
    model = plans[0].model if plans else None  # a set of no plans has no model
    ins = _inputs(plans[0]) if plans else ""
    sub = ("?" if model is None else f"{model.source} · {fmt_count(model.num_nodes)} nodes · "
           f"{fmt_si(model.param_count)} params" + (f" · inputs: {ins}" if ins else ""))
    page = PAGE.substitute(
        csp=csp, version=esc(__version__), title=esc(model.name if model else "model"),
        style=STYLE, model=esc(model.name if model else "?"), sub=esc(sub),
        targets=esc(targets), schema=esc(SCHEMA_VERSION), sections="".join(sections),
        options=options, bn_label=esc(bn_label), bn_opts=bn_opts, data=data, script=SCRIPT)
    logger.debug("rendered html for %d plan(s), %d bytes", len(plans), len(page))
    return page
