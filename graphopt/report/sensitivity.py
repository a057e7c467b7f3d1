"""The accuracy guard's per-node sensitivity in a report: per guarded pass, how it was measured
(runs, sessions, samples) and its most sensitive nodes with their numbers (the ONNX backend's
``guard[*].sensitivity``, :mod:`graphopt.backends.onnx.sensitivity`). Every measured node also
carries its numbers on its decision (``sensitivity``). Shared by the Markdown and HTML reports.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from graphopt.report.format import fmt_count, fmt_err, md_code, md_table, md_text
from graphopt.report.html_text import esc, table

__all__ = ["HEADER", "sensitivity_html", "sensitivity_md", "sensitivity_sections"]

HEADER = ("rank", "node", "format", "local error", "cumulative error", "contribution", "share",
          "kept")
_ALIGN = "rllrrrrl"
_TITLE = "Per-node sensitivity (accuracy guard)"
_NOTE = ("local: the relative error the node adds from exact inputs; cumulative: its output's "
         "relative error with every node lowered (ONNX guard); contribution: the output error "
         "it causes (max abs / output scale); share: its part of all the nodes' contributions")


def _num(value: Any) -> str:
    return value if value in ("overflow", "inf") else fmt_err(value)


def _share(node: Mapping[str, Any], total: float) -> str:
    share = node.get("share")
    if not isinstance(share, (int, float)):
        c = node.get("contribution")
        share = c / total if isinstance(c, (int, float)) and total > 0 else None
    return "" if share is None else f"{share:.1%}"


def sensitivity_sections(opt: Mapping[str, Any]) -> list[tuple[str, str, list[list[str]]]]:
    """(pass, summary, rows of ``HEADER``) per guarded pass that measured nodes."""
    out = []
    for g in opt.get("guard") or []:
        sens = g.get("sensitivity") if isinstance(g, Mapping) else None
        if not isinstance(sens, Mapping) or not sens.get("nodes"):
            continue
        skipped = sens.get("not_measured") or 0
        runs = (f"{fmt_count(sens.get('runs'))} forward run(s) of the torch module with its real "
                "kernels" if sens.get("runner") == "torch" else
                f"{fmt_count(sens.get('runs'))} run(s) of {fmt_count(sens.get('sessions'))} "
                "ONNX Runtime session(s)")
        listed = len(sens.get("top") or [])
        shown = ("" if not isinstance(sens.get("nodes"), int) or listed >= sens["nodes"] else
                 f" (the {listed} most sensitive listed; each node's decision has its numbers)")
        summary = (f"{fmt_count(sens.get('nodes'))} node(s) measured{shown} in {runs} on "
                   f"{fmt_count(sens.get('samples'))} sample(s); "
                   f"{fmt_count(sens.get('kept'))} kept in higher precision"
                   + (f"; {fmt_count(skipped)} not measured" if skipped else "")
                   + (f"; nothing lowered: {g['declined']}" if g.get("declined") else ""))
        top = [n for n in sens.get("top") or [] if isinstance(n, Mapping)]
        total = sum(n["contribution"] for n in top
                    if isinstance(n.get("contribution"), (int, float)))
        rows = [[str(n.get("rank", "")), str(n.get("node", "?")), str(n.get("format") or ""),
                 _num(n.get("local")), _num(n.get("cumulative")), _num(n.get("contribution")),
                 _share(n, total), "yes" if n.get("kept") else "no"]
                for n in top]
        out.append((str(g.get("pass", "?")), summary, rows))
    return out


def sensitivity_md(opt: Mapping[str, Any], h: str) -> list[str]:
    sections = sensitivity_sections(opt)
    if not sections:
        return []
    out = [f"{h}# {_TITLE}", "", f"_{md_text(_NOTE)}_", ""]
    for name, summary, rows in sections:
        out += [f"**{md_text(name)}:** {md_text(summary)}", ""]
        out += md_table(list(HEADER), [[r[0], md_code(r[1]), md_text(r[2]), *r[3:]]
                                       for r in rows], _ALIGN)
    return out


def sensitivity_html(opt: Mapping[str, Any]) -> str:
    parts = []
    for name, summary, rows in sensitivity_sections(opt):
        cls = ["num", "mono", "", "num", "num", "num", "num", ""]
        trs = ["<tr>" + "".join(f'<td class="{k}">{esc(c)}</td>' for k, c in zip(cls, r,
                                                                                  strict=True))
               + "</tr>" for r in rows]
        parts.append(f'<div class="faint"><b class="mono">{esc(name)}</b>: {esc(summary)}</div>'
                     + table(list(HEADER), _ALIGN, trs, "sensitivity"))
    if not parts:
        return ""
    return f'<h4>{esc(_TITLE)}</h4><div class="faint">{esc(_NOTE)}</div>' + "".join(parts)
