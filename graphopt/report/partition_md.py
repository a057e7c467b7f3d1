"""The ``partition`` section of a plan (a model split across devices) as markdown; the fact and
row functions here are shared with the HTML renderer (``partition_html``).

The section is a :class:`~graphopt.ir.plan_partition.PartitionPlan` (None when the plan is not
split): the strategy, the makespan, per-device memory and busy time, one schedule row per node,
the copies between devices and, for a pipeline, its stages. Both renderers print the same values
from the same functions; the facts are plain text and each renderer escapes them its own way.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import TYPE_CHECKING, NamedTuple

from graphopt.ir.plan_partition import (
    CollectiveRow,
    HeftNotes,
    PartitionNotes,
    PartitionPlan,
    PipelineNotes,
    ScheduleRow,
    TensorNotes,
    TransferRow,
    TwoDNotes,
)
from graphopt.report.format import (
    finite,
    fmt_bytes,
    fmt_count,
    fmt_seconds,
    md_code,
    md_table,
    md_text,
)

if TYPE_CHECKING:  # ir.plan imports the report package (its emitters): no import at run time
    from graphopt.ir.plan import Plan

__all__ = [
    "TOP_TRANSFERS",
    "DeviceRow",
    "LinkRow",
    "StageRow",
    "device_rows",
    "largest_transfers",
    "link_rows",
    "partition_facts",
    "partition_md",
    "span_s",
    "stage_rows",
]

TOP_TRANSFERS = 10  # the largest copies listed; the per-link table sums all of them
Fact = tuple[str, str, str]  # (label, value, detail)


class DeviceRow(NamedTuple):
    name: str
    target: str
    used: str
    usable: str
    used_pct: str
    busy: str
    util: str
    nodes: str
    used_frac: float  # 0..1, for the HTML bars
    util_frac: float


class LinkRow(NamedTuple):
    src: str
    dst: str
    copies: str
    size: str
    time: str
    busy_pct: str


class StageRow(NamedTuple):
    stage: str
    device: str
    nodes: str
    first: str
    last: str
    time: str
    frac: float  # of the slowest stage


def span_s(part: PartitionPlan) -> float:
    """The chart's time range: the makespan, or the last finish if a row ends later."""
    ends = [finite(x.finish_s) or 0.0 for x in (*part.schedule, *part.transfers)]
    return max([finite(part.makespan_s) or 0.0, *ends])


def _duration(x: ScheduleRow | TransferRow | CollectiveRow) -> float:
    a, b = finite(x.start_s), finite(x.finish_s)
    return max(b - a, 0.0) if a is not None and b is not None else 0.0


def _pct(frac: float | None) -> str:
    return "—" if frac is None else f"{100.0 * frac:.1f}%"


def _ratio(part: float | None, whole: float | None) -> float | None:
    p, w = finite(part), finite(whole)
    return p / w if p is not None and w else None


def device_rows(part: PartitionPlan) -> list[DeviceRow]:
    """One row per device in the report's order: memory used of usable, busy time, nodes."""
    makespan = finite(part.makespan_s)
    counts = Counter(s.device for s in part.schedule)
    rows = []
    for d in part.devices:
        used, usable, busy = d.memory_used_bytes, d.memory_bytes, d.busy_s
        mem, util = _ratio(used, usable), _ratio(busy, makespan)
        rows.append(DeviceRow(d.name, d.target or "—", fmt_bytes(used), fmt_bytes(usable),
                              _pct(mem), fmt_seconds(busy), _pct(util), fmt_count(counts[d.name]),
                              min(max(mem or 0.0, 0.0), 1.0), min(max(util or 0.0, 0.0), 1.0)))
    return rows


def link_rows(part: PartitionPlan) -> list[LinkRow]:
    """Copies per link direction, in device order: count, bytes, time on the link."""
    order = {d.name: i for i, d in enumerate(part.devices)}
    sums: dict[tuple[str, str], list[float]] = {}
    for t in part.transfers:
        acc = sums.setdefault((t.src, t.dst), [0, 0.0, 0.0])
        acc[0] += 1
        acc[1] += finite(t.bytes) or 0.0
        acc[2] += _duration(t)
    makespan = finite(part.makespan_s)
    last = len(order)  # a 2-D split copies between stage groups, which are no device
    keys = sorted(sums, key=lambda k: (order.get(k[0], last), order.get(k[1], last), k))
    return [LinkRow(s, d, fmt_count(sums[s, d][0]), fmt_bytes(sums[s, d][1]),
                    fmt_seconds(sums[s, d][2]), _pct(_ratio(sums[s, d][2], makespan)))
            for s, d in keys]


def largest_transfers(part: PartitionPlan, k: int = TOP_TRANSFERS
                      ) -> list[tuple[str, str, str, str, str, str]]:
    """(tensor, from, to, size, start, time) of the ``k`` largest copies, largest first."""
    rows = sorted(part.transfers, key=lambda t: (-(finite(t.bytes) or 0.0),
                                                 finite(t.start_s) or 0.0, t.tensor))
    return [(t.tensor, t.src, t.dst, fmt_bytes(t.bytes), fmt_seconds(t.start_s),
             fmt_seconds(_duration(t))) for t in rows[:k]]


def _stage_times(notes: PartitionNotes) -> tuple[float, ...]:
    """The stage times the strategy gave (a pipeline's, a 2-D split's); none for the others."""
    return notes.stage_times_s if isinstance(notes, (PipelineNotes, TwoDNotes)) else ()


def stage_rows(part: PartitionPlan) -> list[StageRow]:
    """Pipeline stages in order; a stage's time is the notes' (else the sum of its nodes)."""
    stages, devs = part.stages, part.stage_devices
    if not stages:
        return []
    given = _stage_times(part.notes)
    dur = defaultdict(float, {s.node: _duration(s) for s in part.schedule})  # 0: unscheduled
    times = [finite(given[i]) if i < len(given) else None for i in range(len(stages))]
    times = [t if t is not None else sum(dur[n] for n in st)
             for t, st in zip(times, stages, strict=True)]
    slowest = max(times, default=0.0)
    return [StageRow(str(i + 1), devs[i] if i < len(devs) else "?", fmt_count(len(st)),
                     st[0] if st else "—", st[-1] if st else "—", fmt_seconds(t),
                     t / slowest if slowest > 0 else 0.0)
            for i, (st, t) in enumerate(zip(stages, times, strict=True))]


def _candidates(notes: PartitionNotes) -> str:
    """HEFT's starts tried, fastest first ("" for the other strategies)."""
    cands = notes.candidates_s if isinstance(notes, HeftNotes) else {}
    if not cands:
        return ""
    order = sorted(cands, key=lambda k: (finite(cands[k]) is None, finite(cands[k]) or 0.0, k))
    return ", ".join(f"{k} {fmt_seconds(cands[k]) if finite(cands[k]) else 'does not fit'}"
                     for k in order)


def _detail(part: PartitionPlan) -> str:
    """The strategy fact's detail: how the split was found."""
    strategy, notes = part.strategy, part.notes
    if strategy == "heft" and isinstance(notes, HeftNotes) and notes.chosen:
        moves = finite(notes.refined_moves)
        return f"the {notes.chosen} schedule" + (
            f", then {int(moves):,} refinement moves" if moves else "")
    if strategy == "pipeline":
        return f"{len(stage_rows(part))} contiguous stages in execution order"
    if strategy == "tensor":
        return "tensor parallel: every node on every device, split blocks 1/t, the rest whole"
    if strategy == "2d":
        return (f"{len(stage_rows(part))} pipeline stages, each tensor parallel within its "
                "NVLink group")
    return ""


def partition_facts(part: PartitionPlan) -> list[Fact]:
    """Strategy, devices, makespan (vs one device), transfers and the strategy's own notes."""
    notes, strategy = part.notes, str(part.strategy)
    makespan = finite(part.makespan_s)
    out: list[Fact] = [
        ("strategy", strategy, _detail(part)),
        ("devices", fmt_count(len(part.devices)),
         ", ".join(f"{d.name} ({d.target or '?'})" for d in part.devices)),
    ]
    heft = notes if isinstance(notes, HeftNotes) else None
    single = finite(heft.best_single_device_s) if heft else None
    vs = f"{single / makespan:.2f}× faster than the best single device ({fmt_seconds(single)})" \
        if single and makespan else ""
    if (strategy in ("pipeline", "tensor", "2d")
            and isinstance(notes, (PipelineNotes, TensorNotes, TwoDNotes)) and notes.makespan_is):
        vs = notes.makespan_is
    out.append(("makespan", fmt_seconds(makespan), vs))
    staged = notes if isinstance(notes, (PipelineNotes, TwoDNotes)) else None
    if staged and finite(staged.bottleneck_s) is not None:
        tput = finite(staged.throughput_per_s)
        out.append(("slowest stage", fmt_seconds(staged.bottleneck_s),
                    f"{tput:,.1f} batches/s when stages overlap" if tput else ""))
    xfers = part.transfers
    total = sum(finite(t.bytes) or 0.0 for t in xfers)
    out.append(("transfers", f"{len(xfers):,} cop{'y' if len(xfers) == 1 else 'ies'}",
                f"{fmt_bytes(total)} in {fmt_seconds(sum(_duration(t) for t in xfers))} "
                f"on links" if xfers else ""))
    colls = part.collectives or ()
    if colls:
        out.append(("collectives", f"{len(colls):,}",
                    f"{fmt_seconds(sum(_duration(c) for c in colls))} on the critical path, "
                    "drawn on every device of their group"))
    if _candidates(notes):
        out.append(("schedules tried", _candidates(notes), ""))
    if heft and heft.link_model:
        out.append(("link model", heft.link_model, ""))
    return out


def partition_md(plan: Plan, h: str) -> list[str]:
    """The "Partition across devices" section, or nothing for a plan that is not split."""
    part = plan.partition
    if part is None:
        return []
    out = [f"{h} Partition across devices", ""]
    out += [f"- **{md_text(k)}:** {md_text(v)}" + (f" — {md_text(d)}" if d else "")
            for k, v, d in partition_facts(part)]
    out.append("")
    rows = device_rows(part)
    if rows:
        out += md_table(["device", "target", "memory used", "usable", "used", "busy",
                         "utilization", "nodes"],
                        [[md_code(r.name), md_code(r.target), r.used, r.usable, r.used_pct,
                          r.busy, r.util, r.nodes] for r in rows], "llrrrrrr")
    stages = stage_rows(part)
    if stages:
        out += [f"{h}# Pipeline stages", ""]
        out += md_table(["stage", "device", "nodes", "first node", "last node", "stage time"],
                        [[s.stage, md_code(s.device), s.nodes, md_code(s.first), md_code(s.last),
                          s.time] for s in stages], "rlrllr")
    links = link_rows(part)
    if links:
        out += [f"{h}# Transfers", ""]
        out += md_table(["from", "to", "copies", "bytes", "time on link", "of makespan"],
                        [[md_code(r.src), md_code(r.dst), r.copies, r.size, r.time, r.busy_pct]
                         for r in links], "llrrrr")
        top = largest_transfers(part)
        n = len(part.transfers)
        out += [f"_The {len(top)} largest of {n:,} copies:_" if n > len(top)
                else "_Every copy, largest first:_", ""]
        out += md_table(["tensor", "from", "to", "size", "start", "time"],
                        [[md_code(t), md_code(a), md_code(b), size, start, dur]
                         for t, a, b, size, start, dur in top], "lllrrr")
    return out
