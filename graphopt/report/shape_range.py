"""The report's shape-range section: the dynamic dims, the estimate at min/opt/max, the
alignment hints, and the numbers checked at the range's ends (Markdown and HTML)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from graphopt.ir.shape_range import CHECK_BUDGET
from graphopt.report.format import fmt_seconds, md_table, md_text
from graphopt.report.html_text import esc

__all__ = ["range_rows", "shape_range_html", "shape_range_md"]

_POINTS = ("min", "opt", "max")


def range_rows(plan: Mapping[str, Any]) -> list[list[str]]:
    """One row per dynamic dim (min, opt, max, source), then the estimated latency row."""
    rng = plan.get("shape_range")
    if not isinstance(rng, Mapping):
        return []
    rows = [[str(d.get("name")), str(d.get("min")), str(d.get("opt")),
             "inf" if d.get("max") is None else str(d.get("max")), str(d.get("source") or "")]
            for d in rng.get("dims") or [] if isinstance(d, Mapping)]
    est = rng.get("est_latency_s") or {}
    rows.append(["est. latency", *(fmt_seconds(est.get(p)) for p in _POINTS), "cost model"])
    return rows


def _checks(plan: Mapping[str, Any]) -> list[str]:
    """"min at (1, 4, 288): within tolerance" for each range end the optimized module was
    checked at."""
    opt = plan.get("optimization")
    checks = opt.get("range_checks") if isinstance(opt, Mapping) else None
    out = []
    for c in checks or []:
        if not isinstance(c, Mapping):
            continue
        dims = ", ".join(f"{k}={v}" for k, v in (c.get("dims") or {}).items())
        scaled = (f" (scaled down from the range's {c.get('point')}: a check holds at most "
                  f"{CHECK_BUDGET}x the example's elements)" if c.get("scaled_down") else "")
        out.append(f"{c.get('point')} at {dims}, inputs {c.get('input_shapes')}{scaled}: "
                   f"{'within' if c.get('within') else 'OUT OF'} tolerance")
    return out


def shape_range_md(plan: Mapping[str, Any], h: str) -> list[str]:
    rows = range_rows(plan)
    if not rows:
        return []
    out = [f"{h} Shape range", "", *md_table(["dim", "min", "opt", "max", "source"], rows,
                                             "lrrrl")]
    hints = (plan.get("shape_range") or {}).get("hints") or []
    out += [f"- {md_text(x)}" for x in hints]
    out += [f"- checked {md_text(x)}" for x in _checks(plan)]
    return out + ([""] if hints or _checks(plan) else [])


def shape_range_html(plan: Mapping[str, Any]) -> str:
    rows = range_rows(plan)
    if not rows:
        return ""
    body = "".join("<tr>" + "".join(f'<td class="{"mono" if i == 0 else "num"}">{esc(c)}</td>'
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    notes = [*((plan.get("shape_range") or {}).get("hints") or []),
             *(f"checked {c}" for c in _checks(plan))]
    items = "".join(f"<li>{esc(n)}</li>" for n in notes)
    return ('<div class="panel"><h3>Shape range<span class="hint">planned at opt, costed at '
            'min and max</span></h3><table><thead><tr><th>dim</th><th>min</th><th>opt</th>'
            f'<th>max</th><th>source</th></tr></thead><tbody>{body}</tbody></table>'
            + (f"<ul>{items}</ul>" if items else "") + "</div>")
