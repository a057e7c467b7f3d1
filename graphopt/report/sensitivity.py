"""The accuracy guard's per-node sensitivity in a report: per guarded pass, how it was measured
(runs, sessions, samples) and its most sensitive nodes with their numbers (the run's
``guard[*].sensitivity``: the ONNX guard's :class:`~graphopt.ir.plan_run.OnnxSensitivity`, or
the torch quantize guard's :class:`~graphopt.ir.plan_run.TorchSensitivity`). Every measured node
also carries its numbers on its decision (``sensitivity``). Shared by the Markdown and HTML
reports.
"""

from __future__ import annotations

from graphopt.ir.plan_run import (
    Number,
    OnnxGuard,
    OnnxOptimization,
    OnnxSensitivity,
    OnnxSensitivityRow,
    TorchGuard,
    TorchOptimization,
    TorchSensitivityRow,
)
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


def _num(value: Number | None) -> str:
    return value if value in ("overflow", "inf") else fmt_err(value)


def _row(n: TorchSensitivityRow | OnnxSensitivityRow, total: float) -> list[str]:
    """One node's cells; the torch guard measures no cumulative error, the ONNX guard runs one
    format and gives no share (it is then this node's part of ``total``)."""
    torch = isinstance(n, TorchSensitivityRow)
    share = n.share if torch else None
    if not isinstance(share, (int, float)):
        c = n.contribution
        share = c / total if isinstance(c, (int, float)) and total > 0 else None
    return [str(n.rank), n.node, n.format if torch else "", _num(n.local),
            _num(None if torch else n.cumulative), _num(n.contribution),
            "" if share is None else f"{share:.1%}", "yes" if n.kept else "no"]


def _summary(g: TorchGuard | OnnxGuard) -> str:
    sens = g.sensitivity
    onnx = isinstance(sens, OnnxSensitivity)
    skipped = sens.not_measured if onnx else 0
    runs = (f"{fmt_count(sens.runs)} run(s) of {fmt_count(sens.sessions)} ONNX Runtime "
            "session(s)" if onnx else
            f"{fmt_count(sens.runs)} forward run(s) of the torch module with its real kernels")
    listed = len(sens.top)
    shown = ("" if listed >= sens.nodes else
             f" (the {listed} most sensitive listed; each node's decision has its numbers)")
    declined = g.declined if isinstance(g, TorchGuard) else None
    return (f"{fmt_count(sens.nodes)} node(s) measured{shown} in {runs} on "
            f"{fmt_count(sens.samples)} sample(s); {fmt_count(sens.kept)} kept in higher "
            "precision" + (f"; {fmt_count(skipped)} not measured" if skipped else "")
            + (f"; nothing lowered: {declined}" if declined else ""))


def sensitivity_sections(opt: TorchOptimization | OnnxOptimization
                         ) -> list[tuple[str, str, list[list[str]]]]:
    """(pass, summary, rows of ``HEADER``) per guarded pass that measured nodes."""
    out = []
    for g in opt.guard:
        if not g.sensitivity.nodes:
            continue
        top = g.sensitivity.top
        total = sum(n.contribution for n in top if isinstance(n.contribution, (int, float)))
        out.append((g.name, _summary(g), [_row(n, total) for n in top]))
    return out


def sensitivity_md(opt: TorchOptimization | OnnxOptimization, h: str) -> list[str]:
    sections = sensitivity_sections(opt)
    if not sections:
        return []
    out = [f"{h}# {_TITLE}", "", f"_{md_text(_NOTE)}_", ""]
    for name, summary, rows in sections:
        out += [f"**{md_text(name)}:** {md_text(summary)}", ""]
        out += md_table(list(HEADER), [[r[0], md_code(r[1]), md_text(r[2]), *r[3:]]
                                       for r in rows], _ALIGN)
    return out


def sensitivity_html(opt: TorchOptimization | OnnxOptimization) -> str:
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
