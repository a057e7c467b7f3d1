"""The ``partition`` panel of the HTML report: facts, per-device table, pipeline stages, copies,
and a timeline (Gantt chart) drawn as inline SVG.

The chart has one lane per device, with a bar per node from its start to its finish coloured by
its kernel class, and one thin lane per link direction with a bar per copy. Under tensor
parallelism the collectives (all-reduces, reduce-scatters, all-gathers) are bars of their own
colour on the lane of each device of their group, between the nodes they wait for and those
that read them. Every bar carries a ``<title>`` tooltip; a node's bar also carries its name
in ``data-node``, which the page script turns into a jump to the node table. Large graphs:
above ``DETAIL_BARS`` rows the bars narrower than one pixel are merged per pixel column and lane
(the column's dominant class, opacity = how busy it is), so a 50k-node schedule draws at most
a few elements per pixel column. Every text is escaped; all numbers are formatted with fixed
precision, so the same report gives the same bytes.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from graphopt.ir.plan_partition import PartitionPlan
from graphopt.report._html_colors import class_colors
from graphopt.report.format import finite, fmt_bytes, fmt_seconds
from graphopt.report.html_text import esc, table
from graphopt.report.partition_md import (
    device_rows,
    largest_transfers,
    link_rows,
    partition_facts,
    span_s,
    stage_rows,
)

if TYPE_CHECKING:  # ir.plan imports the report package (its emitters): no import at run time
    from graphopt.ir.plan import Plan

__all__ = ["DETAIL_BARS", "gantt", "partition_panel"]

DETAIL_BARS = 2000  # up to this many rows every bar is drawn; above, sub-pixel bars are merged
_W, _PL, _PR, _PT = 1000, 118, 14, 8  # viewBox width, label column, right and top padding
_LANE, _LINK, _GAP, _AXIS = 22, 9, 5, 24  # lane heights, gap between lanes, axis band (px)
_MIN_W = 0.8  # a bar is drawn at least this wide, so a 1 ns node still shows
_LABEL = 17  # lane labels longer than this are cut (the full name is in the tooltip)
_NO_CLASS = "#9aa3ad"
_COPY = "#2b2f36"  # copies: near-black (the CSS follows the theme), apart from every class
_COLL = "#e4572e"  # collectives: a red no kernel class uses
_WHAT = {"gb": "nodes", "gx": "copies", "gc": "collectives"}  # a lane's bars, by bar class


def _colors(plan: Plan) -> dict[str, str]:
    """The page's kernel-class colours, so the timeline matches the roofline and the table."""
    return class_colors([plan])


def _ticks(span: float) -> list[float]:
    """About eight ticks at 1, 2 or 5 times a power of ten."""
    raw = span / 8
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw * (1 - 1e-9))
    return [i * step for i in range(int(span / step + 1e-9) + 1)]


def _cut(text: str) -> str:
    return text if len(text) <= _LABEL else text[: _LABEL - 1] + "…"


Row = tuple[float, float, str, str, str]  # start, finish, fill, node or tensor, class or link


def _tip(cls: str, lane: str, row: Row) -> str:
    a, b, _, label, detail = row
    times = f"{fmt_seconds(a)} → {fmt_seconds(b)} ({fmt_seconds(b - a)})"
    return f"{label}\n{lane} · {detail}\n{times}" if cls == "gb" else f"{label}: {detail}\n{times}"


def _lane(rows: list[Row], y: float, h: float, scale: float, merge: bool, cls: str,
          lane: str) -> list[str]:
    """One lane's bars; with ``merge``, bars under a pixel wide become one bar per column run."""
    out: list[str] = []
    cols: dict[int, list[Any]] = {}  # column -> [count, busy s, {fill: s}, first, last]
    pw = _W - _PL - _PR
    for row in sorted(rows, key=lambda r: (r[0], r[1], r[3])):
        start, finish, fill, label, _ = row
        x, w = _PL + start * scale, (finish - start) * scale
        if merge and w < 1.0:
            c = min(max(int(x - _PL), 0), pw - 1)
            acc = cols.setdefault(c, [0, 0.0, defaultdict(float), label, label])
            acc[0] += 1
            acc[1] += finish - start
            acc[2][fill] += finish - start
            acc[4] = label
            continue
        data = f' data-node="{esc(label)}"' if cls == "gb" else ""
        out.append(f'<rect class="{cls}"{data} x="{x:.2f}" y="{y:.1f}" '
                   f'width="{max(w, _MIN_W):.2f}" height="{h}" fill="{fill}"><title>'
                   f"{esc(_tip(cls, lane, row))}</title></rect>")
    runs: list[list[Any]] = []  # [first col, last col, fill, opacity, count, busy, first, last]
    for c in sorted(cols):
        n, busy, fills, first, last = cols[c]
        fill = min(fills, key=lambda f: (-fills[f], f))
        opacity = min(1.0, max(0.3, round(busy * scale, 1)))  # share of the column that is busy
        prev = runs[-1] if runs else None
        if prev and prev[1] == c - 1 and prev[2] == fill and prev[3] == opacity:
            prev[1], prev[4], prev[5], prev[7] = c, prev[4] + n, prev[5] + busy, last
        else:
            runs.append([c, c, fill, opacity, n, busy, first, last])
    for c0, c1, fill, opacity, n, busy, first, last in runs:
        tip = (f"{n:,} short {_WHAT[cls]} on {lane}, {fmt_seconds(busy)} busy\nfirst: {first}"
               + (f"\nlast: {last}" if n > 1 else ""))
        out.append(f'<rect class="{cls} m" x="{_PL + c0}" y="{y:.1f}" width="{c1 - c0 + 1}" '
                   f'height="{h}" fill="{fill}" fill-opacity="{opacity:.1f}"><title>'
                   f"{esc(tip)}</title></rect>")
    return out


def _num(x: Any) -> float | None:
    return float(x) if type(x) in (float, int) and math.isfinite(x) else finite(x)


def _bars(plan: Plan, part: PartitionPlan, devices: list[str], colors: Mapping[str, str]
          ) -> tuple[dict[str, list[Row]], dict[tuple[str, str], list[Row]],
                     dict[str, list[Row]], dict[str, float]]:
    """The bars of each device lane, link lane and device's collectives, and the busy time per
    kernel class."""
    kc = {n.name: n.analysis.kernel_class.value for n in plan.nodes}
    lanes: dict[str, list[Row]] = {d: [] for d in devices}
    by_class: dict[str, float] = defaultdict(float)
    for s in part.schedule:
        a, b = _num(s.start_s), _num(s.finish_s)
        if a is None or b is None:
            continue
        cls = kc.get(s.node, "?")  # a node the plan does not hold has no class
        by_class[cls] += max(b - a, 0.0)
        lanes[s.device].append((a, max(b, a), colors.get(cls, _NO_CLASS), s.node, cls))
    copies: dict[tuple[str, str], list[Row]] = {(r.src, r.dst): [] for r in link_rows(part)}
    for t in part.transfers:
        a, b = _num(t.start_s), _num(t.finish_s)
        key = (t.src, t.dst)
        if a is None or b is None or key not in copies:
            continue
        copies[key].append((a, max(b, a), _COPY, t.tensor,
                            f"{key[0]} → {key[1]}, {fmt_bytes(t.bytes)}"))
    on_dev: dict[str, list[Row]] = {d: [] for d in devices}
    for c in part.collectives or ():
        a, b = _num(c.start_s), _num(c.finish_s)
        group = [d for d in c.devices or () if d in on_dev]
        if a is None or b is None:
            continue
        for dev in group:
            on_dev[dev].append((a, max(b, a), _COLL, f"{c.kind} after {c.after}",
                                f"{c.kind} of {fmt_bytes(c.bytes)} over {len(group)} devices"))
    return lanes, copies, on_dev, dict(by_class)


def _timeline(plan: Plan, colors: Mapping[str, str]) -> tuple[str, dict[str, float]]:
    """The SVG and the busy time per kernel class (for the legend)."""
    part = plan.partition
    span = span_s(part) if part is not None else 0.0
    if part is None or span <= 0 or not part.schedule:
        return "", {}
    sched = part.schedule
    devices = [d.name for d in part.devices]
    devices += sorted({s.device for s in sched} - set(devices))
    targets = {d.name: d.target or "?" for d in part.devices}
    pw = _W - _PL - _PR
    scale = pw / span
    merge = len(sched) + len(part.transfers) + len(part.collectives or ()) > DETAIL_BARS
    lanes, copies, on_dev, by_class = _bars(plan, part, devices, colors)
    links = list(copies)  # one lane per link direction, in device order
    # lane backgrounds, then the time grid, then the bars on top of both
    back, bars, y = [], [], float(_PT)
    rows = [(dev, lanes[dev], _LANE, "gb", "dev", f"{dev} · {targets.get(dev, '?')}")
            for dev in devices]
    rows += [(f"{a} → {b}", copies[a, b], _LINK, "gx", "link", f"copies {a} → {b}")
             for a, b in links]
    for label, lane, h, cls, kind, tip in rows:
        back.append(f'<rect class="lane {kind}" x="{_PL}" y="{y:.1f}" width="{pw}" '
                    f'height="{h}"/><text class="ll {kind}" x="{_PL - 8}" '
                    f'y="{y + h / 2 + (4 if kind == "dev" else 3):.1f}" text-anchor="end">'
                    f"{esc(_cut(label))}<title>{esc(tip)}</title></text>")
        bars += _lane(lane, y, h, scale, merge, cls, label)
        if kind == "dev" and on_dev[label]:
            bars += _lane(on_dev[label], y, h, scale, merge, "gc", label)
        y += h + _GAP
    bottom = y - _GAP
    for tick in _ticks(span):
        x = _PL + tick * scale
        back.append(f'<line class="gt" x1="{x:.1f}" y1="{_PT}" x2="{x:.1f}" '
                    f'y2="{bottom + 4:.1f}"/><text class="ax" x="{x:.1f}" y="{bottom + 16:.1f}" '
                    f'text-anchor="middle">{"0" if tick == 0 else esc(fmt_seconds(tick))}</text>')
    svg = (f'<svg class="gantt" viewBox="0 0 {_W} {bottom + _AXIS:.0f}" role="img" '
           f'aria-label="Timeline of {len(sched):,} nodes on {len(devices)} devices" '
           f'data-merged="{int(merge)}">{"".join(back + bars)}</svg>')
    return svg, by_class


def gantt(plan: Plan, colors: Mapping[str, str] | None = None) -> str:
    """The timeline SVG: device lanes, then one thin lane per link direction, then the axis."""
    return _timeline(plan, _colors(plan) if colors is None else colors)[0]


def _legend(by_class: Mapping[str, float], colors: Mapping[str, str], copies: bool,
            collectives: bool = False) -> str:
    keys = [f'<span><i class="sw" style="background:{colors.get(c, _NO_CLASS)}"></i>{esc(c)}'
            f"</span>" for c in sorted(by_class, key=lambda c: (-by_class[c], c))]
    if copies:
        keys.append('<span><i class="sw cp"></i>copy between devices</span>')
    if collectives:
        keys.append(f'<span><i class="sw" style="background:{_COLL}"></i>collective '
                    "(all-reduce) on every device of the group</span>")
    return f'<div class="keys gkeys">{"".join(keys)}</div>'


def _bar(frac: float) -> str:
    return (f'<span class="sharebar"><span style="width:{100 * frac:.1f}%"></span></span>')


def _td(text: str, cls: str = "", extra: str = "") -> str:
    attr = f' class="{cls}"' if cls else ""
    return f"<td{attr}>{esc(text)}{extra}</td>"


def partition_panel(plan: Plan, colors: Mapping[str, str] | None = None) -> str:
    """The full-width panel for a plan split across devices, or "" when it is not split."""
    part = plan.partition
    if part is None:
        return ""
    colors = _colors(plan) if colors is None else colors
    facts = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}"
                    + (f' <span class="faint">{esc(d)}</span>' if d else "") + "</dd>"
                    for k, v, d in partition_facts(part))
    devs = [f'<tr>{_td(r.name, "mono")}{_td(r.target, "mono faint")}{_td(r.used, "num")}'
            f'{_td(r.usable, "num faint")}{_td(r.used_pct, "num", _bar(r.used_frac))}'
            f'{_td(r.busy, "num")}{_td(r.util, "num", _bar(r.util_frac))}{_td(r.nodes, "num")}'
            f"</tr>" for r in device_rows(part)]
    left = f'<dl class="facts">{facts}</dl>'
    right = table(["device", "target", "memory used", "usable", "used", "busy", "utilization",
                    "nodes"], "llrrrrrr", devs, "part-dev") if devs else ""
    chart, by_class = _timeline(plan, colors)
    legend = _legend(by_class, colors, bool(part.transfers), bool(part.collectives))
    timeline = (f'<h4>Timeline<span class="hint">hover a bar for the node; click it to open the '
                f'node below</span></h4><div class="gwrap">{chart}</div>{legend}'
                if chart else "")
    if chart and 'data-merged="1"' in chart:
        timeline += ('<div class="cap">Bars narrower than a pixel are merged per pixel column; '
                     "the fainter, the less of the column is busy.</div>")
    stages = [f'<tr>{_td(s.stage, "num")}{_td(s.device, "mono")}{_td(s.nodes, "num")}'
              f'<td class="mono trunc" title="{esc(s.first)} … {esc(s.last)}">'
              f'{esc(s.first)} … {esc(s.last)}</td>{_td(s.time, "num", _bar(s.frac))}</tr>'
              for s in stage_rows(part)]
    below = ("<h4>Pipeline stages</h4>" + table(
        ["stage", "device", "nodes", "nodes from … to", "stage time"], "rlrlr", stages,
        "part-stages") if stages else "")
    links = [f'<tr>{_td(r.src, "mono")}{_td(r.dst, "mono")}{_td(r.copies, "num")}'
             f'{_td(r.size, "num")}{_td(r.time, "num")}{_td(r.busy_pct, "num")}</tr>'
             for r in link_rows(part)]
    top = [f'<tr><td class="mono trunc" title="{esc(t)}">{esc(t)}</td>{_td(a, "mono")}'
           f'{_td(b, "mono")}{_td(size, "num")}{_td(start, "num")}{_td(dur, "num")}</tr>'
           for t, a, b, size, start, dur in largest_transfers(part)]
    if links:
        n = len(part.transfers)
        below += "<h4>Transfers</h4>" + table(
            ["from", "to", "copies", "bytes", "time on link", "of makespan"], "llrrrr", links,
            "part-links")
        below = (f'<div class="scroll">{below}</div><div class="scroll"><h4>'
                 f"{'Largest copies' if n > len(top) else 'Copies'}<span class=\"hint\">"
                 f"{len(top)} of {n:,}, largest first</span></h4>"
                 + table(["tensor", "from", "to", "size", "start", "time"], "lllrrr", top,
                          "part-xfer") + "</div>")
    elif below:
        below = f'<div class="scroll">{below}</div>'
    hint = f"{part.strategy} · makespan {fmt_seconds(part.makespan_s)}"
    return (f'<section class="panel part"><h3>Partition across devices<span class="hint">'
            f'{esc(hint)}</span></h3><div class="ptop"><div>{left}</div><div class="scroll">'
            f'{right}</div></div>{timeline}'
            + (f'<div class="pgrid">{below}</div>' if below else "") + "</section>")
