"""The report's "Deploy" section: which artifact to deploy, by how much, measured or predicted,
and every candidate with its time, numerics and notes (``plan.deploy``, a
:class:`~graphopt.ir.plan_deploy.DeployChoice`). Shared by the Markdown and HTML reports and
the ``optimize`` command's terminal line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from graphopt.ir.plan_deploy import Artifact, DeployChoice
from graphopt.report.format import finite, fmt_seconds, md_table, md_text
from graphopt.report.html_text import esc, table

if TYPE_CHECKING:  # ir.plan imports the report package (its emitters): no import at run time
    from graphopt.ir.plan import Plan

__all__ = ["HEADER", "deploy_html", "deploy_md", "deploy_rows", "deploy_summary"]

HEADER = ("artifact", "time", "vs torch module", "vs original", "numerics", "note")
_ALIGN = "lrrrll"


def _x(value: float | None) -> str:
    v = finite(value)
    return "" if v is None else f"{v:.2f}x"


def deploy_summary(d: DeployChoice) -> str:
    """One line: the artifact, its speed-ups, and whether that was measured."""
    gains = [f"{_x(d.speedup_vs_torch_module)} the torch module"
             if finite(d.speedup_vs_torch_module) and d.artifact != Artifact.TORCH else "",
             f"{_x(d.speedup_vs_original)} the original model"
             if finite(d.speedup_vs_original) else ""]
    how = "measured" if d.measured else "predicted, not measured"
    said = ", ".join(g for g in gains if g)
    return f"deploy {d.artifact}" + (f": {said}" if said else "") + f" ({how})"


def deploy_rows(d: DeployChoice) -> list[list[str]]:
    """Rows of :data:`HEADER`, one per candidate."""
    torch = d.row(Artifact.TORCH)
    torch_s = None if torch is None else finite(torch.seconds)
    original = finite(d.original_s)
    rows = []
    for c in d.candidates:
        s = finite(c.seconds)
        numerics = ("" if c.within is None else "within tolerance" if c.within
                    else "OUT of tolerance")
        rows.append([str(c.artifact) + (" (chosen)" if c.artifact == d.artifact else ""),
                     fmt_seconds(s) if s else "", _x(torch_s / s) if s and torch_s else "",
                     _x(original / s) if s and original else "", numerics,
                     c.error or c.note])
    return rows


def deploy_md(plan: Plan, h: str) -> list[str]:
    d = plan.deploy
    if d is None:
        return []
    out = [f"{h} Deploy", "", f"**{md_text(deploy_summary(d))}**", "",
           md_text(d.reason), "", f"_{md_text(d.method)}_", ""]
    original = finite(d.original_s)
    if original:
        out += [f"The original model: {fmt_seconds(original)}.", ""]
    return out + md_table(list(HEADER), [[md_text(c) for c in r] for r in deploy_rows(d)],
                          _ALIGN)


def deploy_html(plan: Plan) -> str:
    d = plan.deploy
    if d is None:
        return ""
    cls = ["mono", "num", "num", "num", "", "faint"]
    trs = ["<tr>" + "".join(f'<td class="{k}">{esc(c)}</td>' for k, c in
                            zip(cls, r, strict=True)) + "</tr>" for r in deploy_rows(d)]
    original = finite(d.original_s)
    return (f"<h3>Deploy</h3><div><b>{esc(deploy_summary(d))}</b></div>"
            f'<div class="faint">{esc(d.reason)}</div>'
            f'<div class="faint">{esc(d.method)}'
            + (f"; the original model: {esc(fmt_seconds(original))}" if original else "")
            + "</div>" + table(list(HEADER), _ALIGN, trs, "deploy"))
