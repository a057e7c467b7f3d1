"""The report's "Predicted vs measured" section (``graphopt.profile``), Markdown and HTML.

It reads ``summary.prediction`` and the nodes' ``measured_s`` beside their estimates; a plan
that was not profiled has neither and gets no section. The HTML scatter is static inline SVG
(no script): log-log, one point per node, the diagonal where prediction equals measurement and
dashed lines at 2x either way, so the reader sees at once which nodes the model gets wrong.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from graphopt.ir.plan_summary import Prediction
from graphopt.report._html_colors import class_colors
from graphopt.report.format import finite, fmt_count, fmt_seconds, md_code, md_table, md_text
from graphopt.report.html_text import esc

if TYPE_CHECKING:  # ir.plan imports the report package (its emitters): no import at run time
    from graphopt.ir.plan import NodePlan, Plan

__all__ = ["measured_nodes", "prediction_html", "prediction_md", "worst_nodes"]

WORST = 10  # nodes listed as the furthest off
MAX_POINTS = 5000  # the scatter keeps the costliest measured nodes beyond this
_W, _H, _PL, _PR, _PT, _PB = 460, 360, 58, 26, 14, 42  # scatter box and paddings (px)


def measured_nodes(plan: Plan) -> list[tuple[NodePlan, float, float]]:
    """(node, predicted s, measured s) for every node with both numbers positive."""
    out = []
    for n in plan.nodes:
        p, m = finite(n.cost.est_time_s), finite(n.measured_s)
        if p and m and p > 0 and m > 0:
            out.append((n, p, m))
    return out


def worst_nodes(plan: Plan, k: int = WORST) -> list[tuple[NodePlan, float, float]]:
    """The ``k`` nodes whose predicted/measured ratio is furthest from 1 (either way)."""
    rows = measured_nodes(plan)
    rows.sort(key=lambda r: (-abs(math.log(r[1] / r[2])), r[0].name))
    return rows[:k]


def _facts(pred: Prediction) -> list[tuple[str, str]]:
    def num(v: float | None, fmt: str) -> str:
        x = finite(v)
        return "—" if x is None else format(x, fmt)

    module = [] if pred.measured_module_s is None else [
        ("user's module predicted / measured", num(pred.module_ratio, ".3g") + "×"),
        ("measured user's module (graph + its Python)", fmt_seconds(pred.measured_module_s))]
    return [("Spearman (per node)", num(pred.spearman, ".3f")),
            ("median predicted / measured", num(pred.median_ratio, ".3g") + "×"),
            ("model predicted / measured", num(pred.model_ratio, ".3g") + "×"),
            ("measured whole model (the planned graph)", fmt_seconds(pred.measured_model_s)),
            *module,
            ("nodes measured", fmt_count(pred.nodes_measured)),
            ("runs", f"{fmt_count(pred.runs)} after {fmt_count(pred.warmup)} warm-up")]


def prediction_md(plan: Plan, h: str) -> list[str]:
    pred = plan.summary.prediction
    if pred is None:
        return []
    out = [f"{h} Predicted vs measured", "", f"_{md_text(pred.method)}_", ""]
    out += [f"- **{k}:** {md_text(v)}" for k, v in _facts(pred)] + [""]
    rows = [[md_code(n.name), md_code(n.analysis.kernel_class), fmt_seconds(p), fmt_seconds(m),
             f"{p / m:.3g}×"] for n, p, m in worst_nodes(plan)]
    if rows:
        out += ["Furthest off (predicted / measured):", ""]
        out += md_table(["node", "class", "predicted", "measured", "ratio"], rows, "llrrr")
    return out


def _scatter(rows: Sequence[tuple[NodePlan, float, float]], colors: Mapping[str, str]) -> str:
    vals = [v for _, p, m in rows for v in (p, m)]
    lo = math.floor(math.log10(min(vals)))
    hi = max(math.ceil(math.log10(max(vals))), lo + 1)
    pw, ph = _W - _PL - _PR, _H - _PT - _PB

    def px(v: float) -> float:
        return _PL + (math.log10(v) - lo) / (hi - lo) * pw

    def py(v: float) -> float:
        return _PT + ph - (math.log10(v) - lo) / (hi - lo) * ph

    parts = []
    for k in range(lo, hi + 1):
        v = 10.0**k
        parts.append(f'<line class="gl" x1="{px(v):.1f}" y1="{_PT}" x2="{px(v):.1f}" '
                     f'y2="{_PT + ph}"/><line class="gl" x1="{_PL}" y1="{py(v):.1f}" '
                     f'x2="{_PL + pw}" y2="{py(v):.1f}"/>'
                     f'<text x="{px(v):.1f}" y="{_PT + ph + 14}" text-anchor="middle">'
                     f'{esc(fmt_seconds(v))}</text><text x="{_PL - 6}" y="{py(v) + 3.5:.1f}" '
                     f'text-anchor="end">{esc(fmt_seconds(v))}</text>')
    a, b = 10.0**lo, 10.0**hi
    parts.append(f'<rect class="ax" x="{_PL}" y="{_PT}" width="{pw}" height="{ph}" fill="none"/>'
                 f'<clipPath id="pvm"><rect x="{_PL}" y="{_PT}" width="{pw}" height="{ph}"/>'
                 f'</clipPath><g clip-path="url(#pvm)"><line class="rl" x1="{px(a):.1f}" '
                 f'y1="{py(a):.1f}" x2="{px(b):.1f}" y2="{py(b):.1f}"/>')
    for f in (2.0, 0.5):  # 2x too slow / too fast
        parts.append(f'<line class="gl" stroke-dasharray="4 3" x1="{px(a):.1f}" '
                     f'y1="{py(a * f):.1f}" x2="{px(b):.1f}" y2="{py(b * f):.1f}"/>')
    for n, p, m in rows:
        kc = n.analysis.kernel_class.value
        parts.append(f'<circle cx="{px(m):.1f}" cy="{py(p):.1f}" r="3.5" '
                     f'fill="{colors.get(kc, "#9aa3ad")}" '
                     f'fill-opacity=".85" stroke="rgba(0,0,0,.35)" stroke-width=".6"><title>'
                     f'{esc(n.name)} ({esc(kc)})\n'
                     f'predicted {esc(fmt_seconds(p))}, measured {esc(fmt_seconds(m))}, '
                     f'{p / m:.3g}×</title></circle>')
    parts.append("</g>")
    parts.append(f'<text x="{_PL + pw / 2:.1f}" y="{_H - 6}" text-anchor="middle">measured '
                 f'time per node</text><text transform="translate(13,{_PT + ph / 2:.1f}) '
                 f'rotate(-90)" text-anchor="middle">predicted time per node</text>')
    return (f'<svg class="pvm" viewBox="0 0 {_W} {_H}" role="img" aria-label="Predicted '
            f'against measured time per node">{"".join(parts)}</svg>')


def prediction_html(plan: Plan) -> str:
    pred = plan.summary.prediction
    if pred is None:
        return ""
    rows = measured_nodes(plan)
    facts = "".join(f"<tr><td>{esc(k)}</td><td class=\"num\">{esc(v)}</td></tr>"
                    for k, v in _facts(pred))
    worst = "".join(f'<tr><td class="mono">{esc(n.name)}</td><td>'
                    f'{esc(n.analysis.kernel_class)}</td><td class="num">'
                    f'{esc(fmt_seconds(p))}</td><td class="num">{esc(fmt_seconds(m))}</td>'
                    f'<td class="num">{p / m:.3g}×</td></tr>' for n, p, m in worst_nodes(plan))
    shown = sorted(rows, key=lambda r: (-r[2], r[0].name))[:MAX_POINTS]
    chart = _scatter(shown, class_colors([plan])) if shown else ""
    cap = (f"{len(shown):,} of {len(rows):,} measured nodes plotted (the costliest); "
           if len(shown) < len(rows) else "") + ("x = measured, y = predicted, per node; the "
                                                 "solid line is exact, dashed lines 2× off.")
    return ('<section class="grid"><div class="col"><div class="panel"><h3>Predicted vs '
            f'measured<span class="hint">{esc(pred.method)}</span></h3><table>'
            f'<tbody>{facts}</tbody></table>'
            + (f'<h4>Furthest off</h4><table><thead><tr><th>node</th><th>class</th>'
               f'<th>predicted</th><th>measured</th><th>ratio</th></tr></thead><tbody>{worst}'
               f'</tbody></table>' if worst else "")
            + '</div></div><div class="col"><div class="panel roof"><h3>Predicted against '
            f'measured</h3>{chart}<div class="cap">{esc(cap)}</div></div></div></section>')
