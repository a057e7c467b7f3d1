"""The report's shape-range section: the dynamic dims, the estimate at min/opt/max, the
alignment hints, and the numbers checked at the range's ends (Markdown and HTML)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from graphopt.ir.plan_run import TorchOptimization
from graphopt.ir.shape_range import CHECK_BUDGET
from graphopt.report.format import fmt_seconds, md_table, md_text
from graphopt.report.html_text import esc

if TYPE_CHECKING:  # ir.plan imports the report package (its emitters): no import at run time
    from graphopt.ir.plan import Plan

__all__ = ["range_rows", "shape_range_html", "shape_range_md"]


def range_rows(plan: Plan) -> list[list[str]]:
    """One row per dynamic dim (min, opt, max, source), then the estimated latency row."""
    rng = plan.shape_range
    if rng is None:
        return []
    rows = [[d.name, str(d.min), str(d.opt), "inf" if d.max is None else str(d.max), d.source]
            for d in rng.dims]
    est = rng.est_latency_s
    rows.append(["est. latency", fmt_seconds(est.min), fmt_seconds(est.opt), fmt_seconds(est.max),
                 "cost model"])
    return rows


def _checks(plan: Plan) -> list[str]:
    """"min at (1, 4, 288): within tolerance" for each range end the optimized module was
    checked at (only the torch backend checks the ends)."""
    opt = plan.optimization
    if not isinstance(opt, TorchOptimization):
        return []
    out = []
    for c in opt.range_checks or ():
        dims = ", ".join(f"{k}={v}" for k, v in c.dims.items())
        scaled = (f" (scaled down from the range's {c.point}: a check holds at most "
                  f"{CHECK_BUDGET}x the example's elements)" if c.scaled_down else "")
        out.append(f"{c.point} at {dims}, inputs {c.input_shapes}{scaled}: "
                   f"{'within' if c.within else 'OUT OF'} tolerance")
    return out


def _hints(plan: Plan) -> tuple[str, ...]:
    return () if plan.shape_range is None else plan.shape_range.hints or ()


def shape_range_md(plan: Plan, h: str) -> list[str]:
    rows = range_rows(plan)
    if not rows:
        return []
    out = [f"{h} Shape range", "", *md_table(["dim", "min", "opt", "max", "source"], rows,
                                             "lrrrl")]
    hints, checks = _hints(plan), _checks(plan)
    out += [f"- {md_text(x)}" for x in hints]
    out += [f"- checked {md_text(x)}" for x in checks]
    return out + ([""] if hints or checks else [])


def shape_range_html(plan: Plan) -> str:
    rows = range_rows(plan)
    if not rows:
        return ""
    body = "".join("<tr>" + "".join(f'<td class="{"mono" if i == 0 else "num"}">{esc(c)}</td>'
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    notes = [*_hints(plan), *(f"checked {c}" for c in _checks(plan))]
    items = "".join(f"<li>{esc(n)}</li>" for n in notes)
    return ('<div class="panel"><h3>Shape range<span class="hint">planned at opt, costed at '
            'min and max</span></h3><table><thead><tr><th>dim</th><th>min</th><th>opt</th>'
            f'<th>max</th><th>source</th></tr></thead><tbody>{body}</tbody></table>'
            + (f"<ul>{items}</ul>" if items else "") + "</div>")
