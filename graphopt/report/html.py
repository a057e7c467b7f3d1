"""A self-contained HTML page of a plan report: summary, roofline, sortable/filterable node table.

Why it is built this way:

1. One file, no network: CSS and JS are inline, the Content-Security-Policy allows no fetches and
   only the page's own script (by SHA-256), so an injected ``<script>`` could not run anyway.
2. Names come from untrusted models: Python-rendered text goes through ``html.escape``; the node
   data sits in one ``<script type="application/json">`` block with ``<``, ``>`` and ``&``
   written as ``\\u003c`` etc., so ``</script>`` in a name cannot close it; the script builds the
   table with ``textContent`` only.
3. 50k-node models: nodes are embedded once as compact arrays and the table renders a page of
   rows at a time; roofline points overlapping on one pixel are merged above ``MERGE_POINTS``.
4. Deterministic: keys are sorted and nothing depends on time or locale, so the same report gives
   the same bytes (diffable, cacheable).
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from graphopt.report._html_assets import PAGE, SCRIPT, STYLE
from graphopt.report.markdown import (
    BOTTLENECKS,
    decision_summary,
    finite,
    fmt_bytes,
    fmt_count,
    fmt_dims,
    fmt_rate,
    fmt_seconds,
    fmt_shape,
    fmt_si,
    plans_of,
)

__all__ = ["render_html"]

logger = logging.getLogger(__name__)

MERGE_POINTS = 2000  # above this many points per chart, points on the same pixel are merged
MAX_SHOW_ALL = 5000  # "show all" is offered only up to this many matching rows (DOM cost)
FIELDS = ("name", "op", "op_type", "kernel_class", "dims", "dtype", "flops", "bytes",
          "bytes_read", "bytes_written", "ai", "params", "pattern", "flags", "inputs", "outputs",
          "per")
TFIELDS = ("est_time_s", "bottleneck", "compute_time_s", "memory_time_s", "peak_flops_used",
           "flops", "ai", "decisions", "cost")
# Fixed colours for the kernel classes graphopt emits; others take the spare palette in name order.
_CLASS_COLORS = {"gemm": "#2f64d0", "gemv": "#6f9be8", "attention": "#8a55d4",
                 "quant_gemm": "#3d3fa8", "quant_dot": "#8285dc", "conv": "#16a08a",
                 "rmsnorm": "#c7a020", "norm": "#9c7f16", "softmax": "#e35d5d", "rope": "#d2476f",
                 "silu": "#f2a54e", "elementwise": "#e57d2f", "reduction": "#a0522d",
                 "data_movement": "#7c8a9c", "view": "#c3cad3", "other": "#5b6470"}
_SPARE = ("#2a9d8f", "#e76f51", "#6d597a", "#bc6c25", "#457b9d", "#9c89b8", "#588157", "#d4a373")
_BN_COLORS = {"compute": "#2f64d0", "memory": "#e8903a", "latency": "#9aa3ad"}
_W, _H, _PL, _PR, _PT, _PB = 600, 360, 58, 104, 14, 42  # roofline box and paddings (px)


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _r6(value: Any) -> float | None:
    """Six significant digits: keeps the JSON small; enough to order nodes and plot them."""
    v = finite(value)
    return None if v is None else float(f"{v:.6g}")


def _clean(value: Any) -> Any:
    """JSON-safe copy: non-finite floats become null (JSON.parse rejects NaN/Infinity)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def _ai(node: Mapping[str, Any]) -> float | None:
    ai = finite(node.get("arithmetic_intensity"))
    if ai is None or ai <= 0:
        flops, nbytes = finite(node.get("flops")), finite(node.get("bytes"))
        ai = flops / nbytes if flops and nbytes else None
    return ai


def _point(node: Mapping[str, Any]) -> tuple[float, float] | None:
    """(FLOP/byte, attained FLOP/s), or None where log-log has no place (zero work or time)."""
    flops, t, ai = finite(node.get("flops")), finite(node.get("est_time_s")), _r6(_ai(node))
    if not flops or flops <= 0 or not t or t <= 0 or not ai or ai <= 0:
        return None
    return ai, _r6(flops) / _r6(t)  # type: ignore[operator]


def _class_colors(plans: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    classes = sorted({str(n.get("kernel_class")) for p in plans for n in p.get("nodes") or []
                      if n.get("kernel_class") is not None})
    spare = iter(_SPARE * (len(classes) // len(_SPARE) + 1))
    return {c: _CLASS_COLORS.get(c) or next(spare) for c in classes}


def _decisions(decisions: Any) -> list[list[Any]]:
    """[kind, short value, reason, [[field, text]...], 1 applied | 0 not | None unknown]."""
    out: list[list[Any]] = []
    if not isinstance(decisions, Mapping):
        return out
    for kind in sorted(decisions, key=str):
        d = decisions[kind] if isinstance(decisions[kind], Mapping) else {"value": decisions[kind]}
        extras = _pairs({k: v for k, v in d.items() if k not in ("reason", "applied")})
        applied = d.get("applied")
        out.append([str(kind), decision_summary(d), str(d.get("reason") or ""), extras,
                    None if not isinstance(applied, bool) else int(applied)])
    return out


def _pairs(fields: Any) -> list[list[str]]:
    """A free-form dict as sorted [key, text] pairs; empty values are dropped."""
    if not isinstance(fields, Mapping):
        return []
    out = []
    for k, v in sorted(fields.items(), key=lambda kv: str(kv[0])):
        if v is None or v == "":
            continue
        if isinstance(v, float):
            text = f"{v:.4g}"  # utilization 0.030303030303 -> 0.0303
        else:
            text = v if isinstance(v, str) else json.dumps(_clean(v), sort_keys=True, default=str)
        out.append([str(k), text])
    return out


def _tensors(tensors: Any) -> list[list[str]]:
    return [[str(t.get("name", "?")), fmt_shape(t.get("shape")), str(t.get("dtype") or "")]
            for t in tensors or [] if isinstance(t, Mapping)]


def _join(plans: Sequence[Mapping[str, Any]]) -> list[tuple[str, list[Mapping[str, Any] | None]]]:
    """Nodes matched across targets by (name, occurrence), in the first plan's order."""
    order: list[tuple[str, int]] = []
    table: dict[tuple[str, int], list[Mapping[str, Any] | None]] = {}
    for p, plan in enumerate(plans):
        seen: dict[str, int] = {}
        for n in plan.get("nodes") or []:
            name = str(n.get("name", ""))
            key = (name, seen.get(name, 0))
            seen[name] = key[1] + 1
            if key not in table:
                order.append(key)
                table[key] = [None] * len(plans)
            table[key][p] = n
    return [(key[0], table[key]) for key in order]


def _payload(plans: Sequence[Mapping[str, Any]], joined: Sequence[tuple[str, list[Any]]],
             colors: dict[str, str], page: int) -> str:
    """The embedded JSON: one array per node (see FIELDS), per-target parts in ``per``."""
    rows = []
    for name, nodes in joined:
        n = next(x for x in nodes if x is not None)
        per = [None if x is None else
               [_r6(x.get("est_time_s")), x.get("bottleneck"), _r6(x.get("compute_time_s")),
                _r6(x.get("memory_time_s")), _r6(x.get("peak_flops_used")), _r6(x.get("flops")),
                _r6(_ai(x)), _decisions(x.get("decisions")), _pairs(x.get("cost"))]
               for x in nodes]
        rows.append([name, str(n.get("op") or n.get("op_type") or ""), str(n.get("op_type") or ""),
                     n.get("kernel_class"), fmt_dims(n.get("dims")), n.get("dtype"),
                     n.get("flops"), n.get("bytes"), n.get("bytes_read"), n.get("bytes_written"),
                     _r6(_ai(n)), n.get("params"), n.get("pattern"),
                     [str(f) for f in n.get("flags") or []], _tensors(n.get("inputs")),
                     _tensors(n.get("outputs")), per])
    targets = [{"name": str(t.get("name", "?")), "display": _target_name(t),
                "lat": _r6((p.get("summary") or {}).get("est_latency_s"))}
               for p in plans for t in [p.get("target") or {}]]
    data = {"fields": FIELDS, "tfields": TFIELDS, "rows": rows, "targets": targets,
            "colors": colors, "page": page, "merge": MERGE_POINTS, "maxall": MAX_SHOW_ALL}
    opts: dict[str, Any] = {"ensure_ascii": True, "sort_keys": True, "separators": (",", ":"),
                            "allow_nan": False, "default": str}
    try:  # rows hold finite numbers and strings; clean only where a NaN or inf slipped in
        text = json.dumps(data, **opts)
    except ValueError:
        text = json.dumps(_clean(data), **opts)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _target_name(target: Mapping[str, Any]) -> str:
    return str(target.get("display_name") or target.get("name") or "?")


def _share(part: Any, whole: Any) -> float:
    p, w = finite(part), finite(whole)
    return p / w if p is not None and w else 0.0


def _bar(frac: float, color: str) -> str:
    return (f'<div class="bar"><span style="width:{100 * min(max(frac, 0.0), 1.0):.1f}%;'
            f'background:{color}"></span></div>')


def _time_panel(plan: Mapping[str, Any], colors: dict[str, str]) -> str:
    s = plan.get("summary") or {}
    lat = s.get("est_latency_s")
    mix, tmix = s.get("bottleneck_mix") or {}, s.get("time_by_bottleneck_s") or {}
    total = sum(finite(tmix.get(b)) or 0.0 for b in BOTTLENECKS)
    stack = "".join(f'<span title="{b}" style="width:{100 * _share(tmix.get(b), total):.1f}%;'
                    f'background:{_BN_COLORS[b]}"></span>' for b in BOTTLENECKS)
    keys = "".join(f'<span><i class="sw" style="background:{_BN_COLORS[b]}"></i>{b} '
                   f'<b>{_e(fmt_seconds(tmix.get(b, 0.0)))}</b> '
                   f'({_e(fmt_count(mix.get(b, 0)))} nodes)</span>' for b in BOTTLENECKS)
    times, counts = s.get("time_by_kernel_class_s") or {}, s.get("kernel_class_counts") or {}
    classes = sorted(set(times) | set(counts), key=lambda c: (-(finite(times.get(c)) or 0.0), c))
    top = max((finite(times.get(c)) or 0.0 for c in classes), default=0.0)
    bars = "".join(
        f'<span class="lbl" title="{_e(c)}">{_e(c)}</span>'
        f'{_bar(_share(times.get(c), top), colors.get(c, "#9aa3ad"))}'
        f'<span class="t">{_e(fmt_seconds(times.get(c)))}</span>'
        f'<span class="n">{100 * _share(times.get(c), lat):.1f}% · '
        f'{_e(fmt_count(counts.get(c, 0)))}</span>' for c in classes)
    return (f'<div class="panel"><h3>Where the time goes<span class="hint">by bottleneck, then by '
            f'kernel class (time · share · nodes)</span></h3><div class="stack">{stack}</div>'
            f'<div class="keys">{keys}</div><div class="bars">{bars}</div></div>')


def _roofline(plan: Mapping[str, Any], t: int, colors: dict[str, str]) -> str:
    """Log-log roofline frame (axes, bandwidth slope, one roof per peak); JS adds the points."""
    tgt, nodes = plan.get("target") or {}, plan.get("nodes") or []
    bw = finite(tgt.get("bandwidth_bytes_per_s")) or 0.0
    peaks: dict[float, list[str]] = {}
    for k, v in sorted((tgt.get("peak_flops") or {}).items()):
        if (finite(v) or 0.0) > 0:
            peaks.setdefault(float(v), []).append(str(k))
    pts = [p for p in (_point(n) for n in nodes) if p is not None]
    ridges = [p / bw for p in peaks] if bw else []
    xs = [x for x, _ in pts] + [r / 10 for r in ridges] + [r * 10 for r in ridges] or [1e-2, 1e4]
    ys = [y for _, y in pts] + list(peaks) or [1e9, 1e15]
    x1, y1 = math.ceil(math.log10(max(xs))), math.ceil(math.log10(max(ys) * 1.05))
    x0 = max(math.floor(math.log10(min(xs))), x1 - 10)
    y0 = max(math.floor(math.log10(min(ys))), y1 - 8)
    x0, y0 = min(x0, x1 - 1), min(y0, y1 - 1)
    pw, ph = _W - _PL - _PR, _H - _PT - _PB

    def px(v: float) -> float:
        return _PL + (math.log10(v) - x0) / (x1 - x0) * pw

    def py(v: float) -> float:
        return _PT + ph - (math.log10(v) - y0) / (y1 - y0) * ph

    parts = [f'<clipPath id="clip{t}"><rect x="{_PL}" y="{_PT}" width="{pw}" height="{ph}"/>'
             f'</clipPath>']
    step = 1 if x1 - x0 <= 8 else 2
    for k in range(x0, x1 + 1):
        parts.append(f'<line class="gl" x1="{px(10.0**k):.1f}" y1="{_PT}" x2="{px(10.0**k):.1f}" '
                     f'y2="{_PT + ph}"/>')
        if (k - x0) % step == 0:
            parts.append(f'<text x="{px(10.0**k):.1f}" y="{_PT + ph + 14}" text-anchor="middle">'
                         f'{_e(fmt_si(10.0**k))}</text>')
    for k in range(y0, y1 + 1):
        parts.append(f'<line class="gl" x1="{_PL}" y1="{py(10.0**k):.1f}" x2="{_PL + pw}" '
                     f'y2="{py(10.0**k):.1f}"/><text x="{_PL - 6}" y="{py(10.0**k) + 3.5:.1f}" '
                     f'text-anchor="end">{_e(fmt_si(10.0**k))}</text>')
    parts.append(f'<rect class="ax" x="{_PL}" y="{_PT}" width="{pw}" height="{ph}" fill="none"/>')
    label_y = -1e9
    lo, hi = 10.0**x0, 10.0**x1
    for peak in sorted(peaks, reverse=True):
        start = max(peak / bw, lo) if bw else lo
        parts.append(f'<line class="rl roof-peak" clip-path="url(#clip{t})" x1="{px(start):.1f}" '
                     f'y1="{py(peak):.1f}" x2="{px(hi):.1f}" y2="{py(peak):.1f}"/>')
        label_y = max(py(peak) + 3.5, label_y + 11)  # right of the plot, never on a point
        parts.append(f'<text class="rt" x="{_PL + pw + 5}" y="{label_y:.1f}">'
                     f'{_e("/".join(peaks[peak]))} {_e(fmt_si(peak))}</text>')
    if bw:
        a = max(lo, 10.0**y0 / bw)
        b = min(hi, max(peaks) / bw) if peaks else hi
        if b > a:
            parts.append(f'<line class="rl roof-bw" clip-path="url(#clip{t})" x1="{px(a):.1f}" '
                         f'y1="{py(bw * a):.1f}" x2="{px(b):.1f}" y2="{py(bw * b):.1f}"/>')
            m = math.sqrt(a * math.sqrt(a * b))
            ang = math.degrees(math.atan2(py(bw * b) - py(bw * a), px(b) - px(a)))
            parts.append(f'<text class="rt bwl" transform="translate({px(m):.1f},'
                         f'{py(bw * m) - 6:.1f}) rotate({ang:.1f})">{_e(fmt_rate(bw))}</text>')
    parts.append(f'<text x="{_PL + pw / 2:.1f}" y="{_H - 6}" text-anchor="middle">'
                 f'arithmetic intensity (FLOP/byte)</text><text transform="translate(13,'
                 f'{_PT + ph / 2:.1f}) rotate(-90)" text-anchor="middle">attained FLOP/s</text>')
    box = (f'data-t="{t}" data-lx0="{x0}" data-lx1="{x1}" data-ly0="{y0}" data-ly1="{y1}" '
           f'data-px="{_PL}" data-py="{_PT}" data-pw="{pw}" data-ph="{ph}"')
    svg = (f'<svg class="roofline" viewBox="0 0 {_W} {_H}" role="img" aria-label="Roofline of '
           f'{_e(_target_name(tgt))}" {box}>{"".join(parts)}<g class="pts" '
           f'clip-path="url(#clip{t})"></g></svg>')
    present = sorted({str(n.get("kernel_class")) for n in nodes if n.get("kernel_class")})
    legend = "".join(f'<button type="button" data-class="{_e(c)}"><i class="sw" '
                     f'style="background:{colors.get(c, "#9aa3ad")}"></i>{_e(c)}</button>'
                     for c in present)
    skipped = len(nodes) - len(pts)
    cap = (f"{len(pts):,} of {len(nodes):,} nodes plotted; x = FLOPs per byte moved, y = FLOPs "
           f"/ estimated time. Lines: memory bandwidth and the peak of each dtype.")
    cap += f" {skipped:,} with no FLOPs, bytes or time are not shown." if skipped else ""
    cap += " Overlapping points are merged." if len(pts) > MERGE_POINTS else ""
    return (f'<div class="panel roof"><h3>Roofline<span class="hint">click a point or a class to '
            f'filter the node table</span></h3>{svg}<div class="legend">{legend}</div>'
            f'<div class="cap">{_e(cap)}</div></div>')


def _issues(plan: Mapping[str, Any], index: dict[str, int]) -> tuple[str, str]:
    """The costliest-nodes panel and the findings panel (warnings, unsupported ops, flags)."""
    s, warnings = plan.get("summary") or {}, plan.get("warnings") or []
    lat, parts = s.get("est_latency_s"), []
    rows = []
    for i, n in enumerate(s.get("costliest_nodes") or [], 1):
        name = str(n.get("name", "?"))
        jump = f' class="mono trunc jump" data-idx="{index[name]}"' if name in index else \
            ' class="mono trunc"'
        share = finite(n.get("share")) or _share(n.get("est_time_s"), lat)
        rows.append(f'<tr><td class="num faint">{i}</td><td{jump} title="{_e(name)}">'
                    f'{_e(name)}</td>'
                    f'<td>{_e(n.get("kernel_class", "?"))}</td><td class="num">'
                    f'{_e(fmt_seconds(n.get("est_time_s")))}</td><td class="num">{100 * share:.1f}%'
                    f'<span class="sharebar"><span style="width:{100 * min(share, 1.0):.1f}%">'
                    f'</span></span></td></tr>')
    costly = ('<div class="panel"><h3>Costliest nodes</h3><table><thead><tr><th class="num">#'
              '</th><th>node</th><th>kernel class</th><th class="num">est. time</th>'
              f'<th class="num">share</th></tr></thead><tbody>{"".join(rows)}</tbody></table>'
              '</div>')
    if warnings:
        parts.append("<h4>Warnings</h4><ul class=\"warn\">"
                     + "".join(f"<li>{_e(w)}</li>" for w in warnings) + "</ul>")
    for title, key, cls in (("Unsupported ops", "unsupported_ops", "chip"),
                            ("Flagged nodes", "flagged_nodes", "chip"),
                            ("Patterns found", "patterns", "chip yes")):
        items = s.get(key) or {}
        if items:
            parts.append(f"<h4>{title}</h4>" + "".join(
                f'<span class="{cls}">{_e(k)} × {_e(fmt_count(v))}</span>'
                for k, v in sorted(items.items(), key=lambda kv: str(kv[0]))))
    body = "".join(parts) or '<p class="ok">No warnings, unsupported ops or flagged nodes.</p>'
    return costly, f'<div class="panel issues"><h3>Findings</h3>{body}</div>'


def _card(key: str, value: str, sub: str, small: bool = False) -> str:
    return (f'<div class="card"><div class="k">{_e(key)}</div><div class="v{" sm" * small}" '
            f'title="{_e(value)}">{_e(value)}</div>'
            f'<div class="s">{_e(sub)}</div></div>')


def _cards(plan: Mapping[str, Any]) -> str:
    s, tgt, model = plan.get("summary") or {}, plan.get("target") or {}, plan.get("model") or {}
    lat = finite(s.get("est_latency_s"))
    flops, nbytes = finite(s.get("total_flops")), finite(s.get("total_bytes"))
    peaks = tgt.get("peak_flops") or {}
    top = max(peaks, key=lambda k: (finite(peaks[k]) or 0.0, k)) if peaks else None
    return '<section class="cards">' + "".join([
        _card("Estimated latency", fmt_seconds(lat), f"on {_target_name(tgt)}"),
        _card("Compute", fmt_si(flops, "FLOP"),
              f"{fmt_rate(flops / lat if flops and lat else None, 'FLOP/s')} average"),
        _card("Memory traffic", fmt_bytes(nbytes),
              f"{fmt_rate(nbytes / lat if nbytes and lat else None)} average"),
        _card("Nodes", fmt_count(model.get("num_nodes") or len(plan.get("nodes") or [])),
              f"{fmt_si(model.get('param_count'))} parameters"),
        _card("Target", _target_name(tgt),
              f"{tgt.get('generation', '')} · {fmt_rate(tgt.get('bandwidth_bytes_per_s'))}"
              + (f" · {top} {fmt_rate(peaks[top], 'FLOP/s')}" if top else ""), small=True),
    ]) + "</section>"


def _comparison(plans: Sequence[Mapping[str, Any]]) -> str:
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
    head = "".join(f'<th class="num">{_e(_target_name(t))}</th>' for t in tgts)
    body = "".join(
        f"<tr><td>{_e(label)}</td>" + "".join(
            f'<td class="num{" best" if mark and lats[i] == best else ""}">{_e(c)}</td>'
            for i, c in enumerate(cells)) + "</tr>" for label, cells, mark in rows)
    return (f'<div class="panel"><h3>Targets compared</h3><table class="cmp"><thead><tr><th></th>'
            f"{head}</tr></thead><tbody>{body}</tbody></table></div>")


def render_html(report: Mapping[str, Any], *, page_size: int = 200) -> str:
    """Render a single- or multi-target plan report as one self-contained HTML page.

    Args:
        report: the v1 report dict (a plan, or ``{"plans": [...]}``).
        page_size: node-table rows rendered per page ("show more" adds as many).
    """
    plans = plans_of(report)
    first = plans[0] if plans else {}
    model = first.get("model") or {}
    colors = _class_colors(plans)
    joined = _join(plans)
    index: dict[str, int] = {}
    for i, (name, _) in enumerate(joined):
        index.setdefault(name, i)
    digest = base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()
    csp = (f"default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
           f"script-src 'sha256-{digest}'")
    ins = ", ".join(f"{t.get('name', '?')} {fmt_shape(t.get('shape'))} {t.get('dtype') or ''}"
                    .strip() for t in model.get("inputs") or [])
    version = first.get("graphopt_version") or report.get("graphopt_version") or "?"
    targets = " · ".join(_target_name(p.get("target") or {}) for p in plans)
    sections = [_cards(first)] if len(plans) == 1 else [_comparison(plans)]
    for t, plan in enumerate(plans):
        if len(plans) > 1:
            sections.append(f"<h2>{_e(_target_name(plan.get('target') or {}))}</h2>")
        costly, findings = _issues(plan, index)
        sections.append(f'<section class="grid"><div class="col">{_time_panel(plan, colors)}'
                        f'{costly}</div><div class="col">{_roofline(plan, t, colors)}'
                        f"{findings}</div></section>")
    options = "".join(f'<option value="{_e(c)}">{_e(c)}</option>' for c in colors)
    bn_label = "All bottlenecks" + (f" ({_target_name(first.get('target') or {})})"
                                    if len(plans) > 1 else "")
    bn_opts = "".join(f'<option value="{b}">{b}</option>' for b in BOTTLENECKS)
    data = _payload(plans, joined, colors, page_size)
    sub = (f"{model.get('source', '?')} · {fmt_count(model.get('num_nodes'))} nodes · "
           f"{fmt_si(model.get('param_count'))} params" + (f" · inputs: {ins}" if ins else ""))
    schema = report.get("schema_version", first.get("schema_version", 1))
    page = PAGE.substitute(
        csp=csp, version=_e(version), title=_e(model.get("name", "model")), style=STYLE,
        model=_e(model.get("name", "?")), sub=_e(sub), targets=_e(targets), schema=_e(schema),
        sections="".join(sections), options=options, bn_label=_e(bn_label), bn_opts=bn_opts,
        data=data, script=SCRIPT)
    logger.debug("rendered html for %d plan(s), %d bytes", len(plans), len(page))
    return page
