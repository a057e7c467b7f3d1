"""The report's "Deploy" section: which artifact to deploy, by how much, measured or predicted,
and every candidate with its time, numerics and notes (``plan.deploy``, from
``graphopt.decisions.deploy.artifact.DeployChoice.to_dict``). Shared by the Markdown and HTML
reports.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from graphopt.report.format import finite, fmt_seconds, md_table, md_text
from graphopt.report.html_text import esc, table

__all__ = ["HEADER", "deploy_html", "deploy_md", "deploy_rows", "deploy_summary"]

HEADER = ("artifact", "time", "vs torch module", "vs original", "numerics", "note")
_ALIGN = "lrrrll"


def _x(value: Any) -> str:
    v = finite(value)
    return "" if v is None else f"{v:.2f}x"


def deploy_summary(d: Mapping[str, Any]) -> str:
    """One line: the artifact, its speed-ups, and whether that was measured."""
    art = str(d.get("artifact", "?"))
    gains = [f"{_x(d.get('speedup_vs_torch_module'))} the torch module"
             if finite(d.get("speedup_vs_torch_module")) and art != "torch" else "",
             f"{_x(d.get('speedup_vs_original'))} the original model"
             if finite(d.get("speedup_vs_original")) else ""]
    how = "measured" if d.get("measured") else "predicted, not measured"
    said = ", ".join(g for g in gains if g)
    return f"deploy {art}" + (f": {said}" if said else "") + f" ({how})"


def deploy_rows(d: Mapping[str, Any]) -> list[list[str]]:
    """Rows of :data:`HEADER`, one per candidate."""
    rows = []
    torch_s = next((finite(c.get("seconds")) for c in d.get("candidates") or []
                    if isinstance(c, Mapping) and c.get("artifact") == "torch"), None)
    original = finite(d.get("original_s"))
    for c in d.get("candidates") or []:
        if not isinstance(c, Mapping):
            continue
        s = finite(c.get("seconds"))
        within = c.get("within")
        numerics = "" if within is None else "within tolerance" if within else "OUT of tolerance"
        rows.append([str(c.get("artifact", "?")) + (" (chosen)" if c.get("artifact") ==
                                                    d.get("artifact") else ""),
                     fmt_seconds(s) if s else "", _x(torch_s / s) if s and torch_s else "",
                     _x(original / s) if s and original else "", numerics,
                     str(c.get("error") or c.get("note") or "")])
    return rows


def deploy_md(plan: Mapping[str, Any], h: str) -> list[str]:
    d = plan.get("deploy")
    if not isinstance(d, Mapping) or not d:
        return []
    out = [f"{h} Deploy", "", f"**{md_text(deploy_summary(d))}**", "",
           md_text(str(d.get("reason", ""))), "", f"_{md_text(str(d.get('method', '')))}_", ""]
    original = finite(d.get("original_s"))
    if original:
        out += [f"The original model: {fmt_seconds(original)}.", ""]
    return out + md_table(list(HEADER), [[md_text(c) for c in r] for r in deploy_rows(d)],
                          _ALIGN)


def deploy_html(plan: Mapping[str, Any]) -> str:
    d = plan.get("deploy")
    if not isinstance(d, Mapping) or not d:
        return ""
    cls = ["mono", "num", "num", "num", "", "faint"]
    trs = ["<tr>" + "".join(f'<td class="{k}">{esc(c)}</td>' for k, c in
                            zip(cls, r, strict=True)) + "</tr>" for r in deploy_rows(d)]
    original = finite(d.get("original_s"))
    return (f"<h3>Deploy</h3><div><b>{esc(deploy_summary(d))}</b></div>"
            f'<div class="faint">{esc(d.get("reason", ""))}</div>'
            f'<div class="faint">{esc(d.get("method", ""))}'
            + (f"; the original model: {esc(fmt_seconds(original))}" if original else "")
            + "</div>" + table(list(HEADER), _ALIGN, trs, "deploy"))
