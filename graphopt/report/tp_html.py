"""The ``strategy`` and ``tensor_parallel`` panel of the HTML report: the winner and the
losers' numbers, per device memory / busy / collective time, the stages of a 2-D split, each
block's split and the ``parallelize_module`` code. Rows come from :mod:`.tp_md`, so both
renderers print the same values; every text is escaped. The timeline (with the collectives)
is the partition panel's Gantt chart. A 2-D split shows its run and its emitted code in place of
the one-group ``parallelize_module`` plan."""

from __future__ import annotations

from typing import TYPE_CHECKING

from graphopt.ir.plan_parallel import ParallelizePlan, ParallelizeUnavailable
from graphopt.report.format import fmt_seconds
from graphopt.report.html_text import esc, table
from graphopt.report.tp_md import (
    candidate_rows,
    split_rows,
    stage2d_rows,
    tp_device_rows,
    two_d_code,
    two_d_facts,
)

if TYPE_CHECKING:  # ir.plan imports the report package (its emitters): no import at run time
    from graphopt.ir.plan import Plan

__all__ = ["tp_panel"]


def _table(head: list[str], align: str, rows: list[list[str]], cls: str,
           mono: int = 1) -> str:
    """``align``: ``r`` right, ``l`` left, ``w`` left and wrapping (a sentence, which on one
    line would make the table wider than its panel)."""
    kind = {"r": "num", "w": "wrap"}
    body = ["<tr>" + "".join(f'<td class="{kind.get(a) or ("mono" if i < mono else "")}">'
                             f"{esc(c)}</td>" for i, (c, a) in enumerate(zip(r, align,
                                                                              strict=True)))
            + "</tr>" for r in rows]
    return table(head, align, body, cls)


def tp_panel(plan: Plan) -> str:
    """The full-width panel, or "" when the plan has neither section."""
    st, tp = plan.strategy, plan.tensor_parallel
    if st is None and tp is None:
        return ""
    out = []
    if st is not None:
        out.append(f"<p><b>picked {esc(st.winner)}</b> by {esc(st.picked_by)}: "
                   f"{esc(st.why)}</p>")
        out.append(_table(["strategy", "latency (one request)", "throughput (stream)",
                           "fits memory", "note"], "lrrlw", candidate_rows(st), "tp-cands"))
    if tp is not None:
        out.append(f"<h4>Tensor parallelism<span class=\"hint\">{esc(tp.strategy)} · "
                   f"degree {esc(tp.degree)} · latency "
                   f"{esc(fmt_seconds(tp.makespan_s))}</span></h4>")
        out.append(_table(["device", "group", "memory used", "usable", "parameters",
                           "activations", "busy", "collectives"], "lrrrrrrr",
                          [list(r[:8]) for r in tp_device_rows(tp)], "tp-dev"))
        stages = stage2d_rows(tp)
        if stages:
            out.append("<h4>Stages (pipeline across groups)</h4>" + _table(
                ["stage", "group", "nodes", "nodes from … to", "compute", "collectives",
                 "transfer out", "stage time"], "rlrlrrrr", stages, "tp-stages", 0))
        splits = split_rows(tp)
        if splits:
            out.append("<h4>Block splits</h4>" + _table(
                ["block", "kind", "degree", "column split", "row split", "stage",
                 "compute split / whole", "collective"], "llrllrrr", splits, "tp-splits"))
        pm = tp.parallelize_module
        facts = two_d_facts(tp)
        if facts:
            code = two_d_code(tp)
            out.append("<h4>2-D plan (pipeline stages × tensor parallel)</h4><ul>"
                       + "".join(f"<li><b>{esc(k)}:</b> {esc(v)}</li>" for k, v in facts)
                       + "</ul>" + (f'<pre class="tpcode">{esc(code)}</pre>' if code else ""))
        elif isinstance(pm, ParallelizePlan) and pm.code:
            out.append(f'<h4>parallelize_module plan</h4><pre class="tpcode">{esc(pm.code)}'
                       "</pre>")
        elif isinstance(pm, ParallelizeUnavailable) and pm.unavailable:
            out.append(f'<p class="faint">No parallelize_module plan: {esc(pm.unavailable)}</p>')
    return ('<section class="panel tp"><h3>Strategy and tensor parallelism</h3>'
            + "".join(out) + "</section>")
