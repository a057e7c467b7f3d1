"""The console lines for ``graphopt plan --devices``: the strategy, the split and its estimate,
so that a split is seen without opening a report (the reports hold the timeline)."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from graphopt.cli.args import fmt_time
from graphopt.ir.plan_partition import HeftNotes, PipelineNotes, TwoDNotes
from graphopt.report.format import fmt_bytes

if TYPE_CHECKING:
    from graphopt.ir.plan import Plan

__all__ = ["split_lines"]


def _estimate(plan: Plan) -> str:
    part = plan.partition
    assert part is not None
    notes = part.notes
    single = (notes.best_single_device_s if isinstance(notes, HeftNotes)
              else plan.summary.est_latency_s)
    text = f"latency {fmt_time(part.makespan_s)}"
    if single:
        text += (f" against {fmt_time(single)} on one {plan.target.name} "
                 f"({single / part.makespan_s:.2f}x)" if part.makespan_s else "")
    if isinstance(notes, (PipelineNotes, TwoDNotes)) and notes.throughput_per_s:
        text += f"; pipelined {notes.throughput_per_s:.3g} batches/s"
    return text


def split_lines(plan: Plan) -> list[str]:
    """The split of ``plan`` (its ``partition``, ``strategy`` and ``tensor_parallel``
    sections), as indented console lines; none when the plan was not split."""
    part = plan.partition
    if part is None:
        return []
    out = [f"  split: {part.strategy} over {len(part.devices)} device(s), {_estimate(plan)}"]
    st = plan.strategy
    if st is not None:
        out.append(f"  strategy: {st.winner} ({st.picked_by}): {st.why}")
    nodes = Counter(row.device for row in part.schedule)
    for d in part.devices:
        out.append(f"    {d.name} ({d.target}): {nodes.get(d.name, 0)} node(s), busy "
                   f"{fmt_time(d.busy_s)}, memory {fmt_bytes(d.memory_used_bytes)} of "
                   f"{fmt_bytes(d.memory_bytes)}")
    if part.transfers:
        moved = sum(t.bytes for t in part.transfers)
        out.append(f"    {len(part.transfers)} transfer(s), {fmt_bytes(moved)}")
    tp = plan.tensor_parallel
    if tp is not None:
        out.append(f"  tensor parallel: degree {tp.degree}; the reports (--md/--html/--json) "
                   "give the per-block split and the parallelize_module code")
    return out
