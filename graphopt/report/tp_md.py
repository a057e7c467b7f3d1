"""The ``strategy`` and ``tensor_parallel`` sections of a plan as markdown; the row functions
are shared with the HTML renderer (``tp_html``).

``strategy`` (a :class:`~graphopt.ir.plan_partition.StrategyChoice`): the winner, why, and every
candidate's latency and throughput (or why it could not run). ``tensor_parallel`` (a
:class:`~graphopt.ir.plan_parallel.TensorParallelPlan`, or a ``TwoDParallelPlan``): per device
memory, busy and collective time, each block's split (degree, dims), the stages of a 2-D split,
and the ``parallelize_module`` plan; for a 2-D split, its run (micro-batches, schedule, stage
modules, moved and uneven cuts) and the emitted code (:mod:`graphopt.partition.two_d_emit`) or
why it is not emitted. Both renderers print the same values from the same functions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from graphopt.ir.plan_parallel import (
    ParallelizePlan,
    ParallelizeUnavailable,
    TensorParallelPlan,
    TwoDParallelPlan,
    TwoDPipeline,
)
from graphopt.ir.plan_partition import StrategyChoice
from graphopt.report.format import finite, fmt_bytes, fmt_seconds, md_code, md_table, md_text

if TYPE_CHECKING:  # ir.plan imports the report package (its emitters): no import at run time
    from graphopt.ir.plan import Plan

__all__ = ["TPDeviceRow", "candidate_rows", "split_rows", "stage2d_rows", "tp_device_rows",
           "tp_md", "two_d_code", "two_d_facts"]

#: the ``tensor_parallel`` section: one group, or a 2-D split (stages of groups)
TPSection = TensorParallelPlan | TwoDParallelPlan


class TPDeviceRow(NamedTuple):
    name: str
    group: str
    used: str
    usable: str
    params: str
    activations: str
    busy: str
    collective: str
    used_frac: float


def _rate(x: float | None) -> str:
    v = finite(x)
    return "—" if v is None else f"{v:,.1f}/s"


def candidate_rows(st: StrategyChoice) -> list[list[str]]:
    """strategy, latency, throughput, fits, note: the winner first, then by latency."""
    win = st.winner
    cands = sorted(st.candidates, key=lambda c: (c.strategy != win, finite(c.latency_s) is None,
                                                 finite(c.latency_s) or 0.0, str(c.strategy)))
    return [[str(c.strategy) + (" (picked)" if c.strategy == win else ""),
             fmt_seconds(c.latency_s) if finite(c.latency_s) else "—",
             _rate(c.throughput_per_s),
             "yes" if c.feasible else "no",
             c.why_not or ((f"not emitted, never picked: {c.not_emitted}; "
                            if c.not_emitted else "") + c.detail)] for c in cands]


def tp_device_rows(tp: TPSection) -> list[TPDeviceRow]:
    out = []
    for d in tp.devices:
        used, usable = finite(d.memory_used_bytes), finite(d.memory_bytes)
        out.append(TPDeviceRow(
            d.name, str(d.group), fmt_bytes(used), fmt_bytes(usable), fmt_bytes(d.param_bytes),
            fmt_bytes(d.activation_bytes), fmt_seconds(d.busy_s), fmt_seconds(d.collective_s),
            min(max(used / usable, 0.0), 1.0) if used is not None and usable else 0.0))
    return out


def split_rows(tp: TPSection) -> list[list[str]]:
    """block, kind, degree, column dims, row dims, stage, compute (split / whole), and the
    collective after it (an all-reduce, or the LM head's all-gather)."""
    return [[s.block, s.kind, str(s.degree),
             # dims: the split's dimension per side; a side a block does not split is absent
             s.dims.get("column", "—"), s.dims.get("row", "—"),
             "—" if s.stage is None else str(s.stage + 1),
             f"{fmt_seconds(s.compute_s)} / {fmt_seconds(s.unsplit_s)}",
             f"{s.collective or 'all-reduce'} {fmt_bytes(s.allreduce_bytes)} in "
             f"{fmt_seconds(s.allreduce_s)}"] for s in tp.splits]


def stage2d_rows(tp: TPSection) -> list[list[str]]:
    """stage, group, nodes, first … last, compute, collectives, transfer, stage time (a 2-D
    split's; none for one group)."""
    if not isinstance(tp, TwoDParallelPlan):
        return []
    return [[str(s.stage + 1), "+".join(s.group), f"{s.nodes:,}", f"{s.first} … {s.last}",
             fmt_seconds(s.compute_s), fmt_seconds(s.collective_s),
             (f"{fmt_bytes(s.send_bytes)} in {fmt_seconds(s.send_s)}"
              if finite(s.send_bytes) else "—"), fmt_seconds(s.stage_s)]
            for s in tp.stages]


def _pipeline(tp: TPSection) -> TwoDPipeline | None:
    return tp.pipeline if isinstance(tp, TwoDParallelPlan) else None


def two_d_facts(tp: TPSection) -> list[tuple[str, str]]:
    """(label, text) lines of a 2-D split's run: micro-batches and schedule, each stage's
    modules, an uneven split and every cut moved onto a module boundary."""
    pipe = _pipeline(tp)
    if pipe is None:
        return []
    out = [("run", f"{pipe.micro_batches} micro-batches, {pipe.schedule}"
                   f"{', sequence parallel in each stage' if pipe.sequence_parallel else ''}"
                   f": {pipe.schedule_why}")]
    for st in pipe.emitted.stages if pipe.emitted else ():
        out.append((f"stage {st.stage + 1}", ", ".join(st.modules) or "—"))
    notes = tp.notes
    if notes.uneven:
        out.append(("uneven", notes.uneven))
    for c in pipe.moved_cuts:
        pair = "–".join(str(x) for x in c.between_stages)
        out.append(("moved cut", f"stages {pair}: planned after {c.planned_after} "
                                 f"({c.why}), moved {c.at} (after {c.moved_after}); "
                                 f"re-costed: latency {fmt_seconds(tp.makespan_s)}, planned "
                                 f"{fmt_seconds(notes.planned_latency_s)}"))
    if pipe.not_emitted:
        out.append(("not emitted", pipe.not_emitted))
    return out


def two_d_code(tp: TPSection) -> str:
    """The emitted 2-D code ("" when there is none)."""
    pipe = _pipeline(tp)
    return pipe.emitted.code if pipe is not None and pipe.emitted is not None else ""


def _two_d_md(tp: TPSection, h: str) -> list[str]:
    facts = two_d_facts(tp)
    if not facts:
        return []
    out = [f"{h}# 2-D plan (pipeline stages x tensor parallel)", ""]
    out += [f"- **{label}:** {md_text(text)}" for label, text in facts] + [""]
    code = two_d_code(tp)
    return out + (["```python", code, "```", ""] if code else [])


def _strategy_md(st: StrategyChoice, h: str) -> list[str]:
    out = [f"{h} Strategy", "",
           f"- **picked:** {md_code(st.winner)} — by {md_text(st.picked_by)}",
           f"- **why:** {md_text(st.why)}", ""]
    return out + md_table(["strategy", "latency (one request)", "throughput (stream)",
                           "fits memory", "note"],
                          [[md_code(r[0]), r[1], r[2], r[3], md_text(r[4])]
                           for r in candidate_rows(st)], "lrrll")


def _module_plan_md(tp: TPSection, h: str) -> list[str]:
    """A 2-D split's run and code, else the one-group ``parallelize_module`` code or why there
    is none."""
    pm = tp.parallelize_module
    if isinstance(tp, TwoDParallelPlan):
        return _two_d_md(tp, h)
    if isinstance(pm, ParallelizePlan) and pm.code:
        return [f"{h}# parallelize_module plan", "", "```python", pm.code, "```", ""]
    if isinstance(pm, ParallelizeUnavailable) and pm.unavailable:
        return [f"_No parallelize\\_module plan:_ {md_text(pm.unavailable)}", ""]
    return []


def tp_md(plan: Plan, h: str) -> list[str]:
    """The "Strategy" and "Tensor parallelism" sections, or nothing."""
    st, tp = plan.strategy, plan.tensor_parallel
    out = _strategy_md(st, h) if st is not None else []
    if tp is None:
        return out
    out += [f"{h} Tensor parallelism", "",
            f"- **strategy:** {md_code(tp.strategy)}, degree {md_text(tp.degree)}, groups "
            + ", ".join(md_code("+".join(g)) for g in tp.groups),
            f"- **latency (one request):** {fmt_seconds(tp.makespan_s)}",
            f"- **throughput (stream of micro-batches):** {_rate(tp.throughput_per_s)}"]
    link = tp.link if isinstance(tp, TensorParallelPlan) else None  # 2-D: a link per stage
    if link:
        out.append(f"- **collective link:** {md_code(link.name)}")
    out.append("")
    out += md_table(["device", "group", "memory used", "usable", "parameters", "activations",
                     "busy", "collectives"],
                    [[md_code(r.name), r.group, r.used, r.usable, r.params, r.activations,
                      r.busy, r.collective] for r in tp_device_rows(tp)], "lrrrrrrr")
    stages = stage2d_rows(tp)
    if stages:
        out += [f"{h}# Stages (pipeline across groups)", ""]
        out += md_table(["stage", "group", "nodes", "nodes from … to", "compute",
                         "collectives", "transfer out", "stage time"],
                        [[r[0], md_code(r[1]), r[2], md_code(r[3]), *r[4:]] for r in stages],
                        "rlrlrrrr")
    splits = split_rows(tp)
    if splits:
        out += [f"{h}# Block splits", ""]
        out += md_table(["block", "kind", "degree", "column split", "row split", "stage",
                         "compute split / whole", "collective"],
                        [[md_code(r[0]), *r[1:]] for r in splits], "llrllrrr")
    if tp.fallbacks:
        out += [f"_Not split:_ {md_text('; '.join(tp.fallbacks))}", ""]
    return out + _module_plan_md(tp, h)
