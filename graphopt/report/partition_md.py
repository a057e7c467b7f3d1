"""The ``partition`` section of a plan (a model split across devices) as markdown; the fact and
row functions here are shared with the HTML renderer (``partition_html``).

The section comes from :meth:`graphopt.partition.Partition.to_dict`: the strategy, the makespan,
per-device memory and busy time, one schedule row per node, the copies between devices and, for
a pipeline, its stages. Both renderers print the same values from the same functions; the facts
are plain text and each renderer escapes them its own way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from graphopt.report.format import (
    finite,
    fmt_bytes,
    fmt_count,
    fmt_seconds,
    md_code,
    md_table,
    md_text,
)

__all__ = [
    "TOP_TRANSFERS",
    "DeviceRow",
    "LinkRow",
    "StageRow",
    "device_rows",
    "items",
    "largest_transfers",
    "link_rows",
    "partition_facts",
    "partition_md",
    "partition_of",
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


def partition_of(plan: Mapping[str, Any]) -> Mapping[str, Any]:
    part = plan.get("partition")
    return part if isinstance(part, Mapping) else {}


def items(part: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    """The dict entries of one list of the section (devices, schedule, transfers)."""
    value = part.get(key)
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes)):
        return []
    return [x for x in value if type(x) is dict or isinstance(x, Mapping)]


def span_s(part: Mapping[str, Any]) -> float:
    """The chart's time range: the makespan, or the last finish if a row ends later."""
    ends = [finite(x.get("finish_s")) or 0.0
            for key in ("schedule", "transfers") for x in items(part, key)]
    return max([finite(part.get("makespan_s")) or 0.0, *ends])


def _duration(x: Mapping[str, Any]) -> float:
    a, b = finite(x.get("start_s")), finite(x.get("finish_s"))
    return max(b - a, 0.0) if a is not None and b is not None else 0.0


def _pct(frac: float | None) -> str:
    return "—" if frac is None else f"{100.0 * frac:.1f}%"


def _ratio(part: Any, whole: Any) -> float | None:
    p, w = finite(part), finite(whole)
    return p / w if p is not None and w else None


def device_rows(part: Mapping[str, Any]) -> list[DeviceRow]:
    """One row per device in the report's order: memory used of usable, busy time, nodes."""
    makespan = finite(part.get("makespan_s"))
    counts: dict[str, int] = {}
    for s in items(part, "schedule"):
        counts[str(s.get("device"))] = counts.get(str(s.get("device")), 0) + 1
    rows = []
    for d in items(part, "devices"):
        used, usable, busy = d.get("memory_used_bytes"), d.get("memory_bytes"), d.get("busy_s")
        mem, util = _ratio(used, usable), _ratio(busy, makespan)
        rows.append(DeviceRow(str(d.get("name", "?")), str(d.get("target") or "—"),
                              fmt_bytes(used), fmt_bytes(usable), _pct(mem), fmt_seconds(busy),
                              _pct(util), fmt_count(counts.get(str(d.get("name")), 0)),
                              min(max(mem or 0.0, 0.0), 1.0), min(max(util or 0.0, 0.0), 1.0)))
    return rows


def link_rows(part: Mapping[str, Any]) -> list[LinkRow]:
    """Copies per link direction, in device order: count, bytes, time on the link."""
    order = {str(d.get("name")): i for i, d in enumerate(items(part, "devices"))}
    sums: dict[tuple[str, str], list[float]] = {}
    for t in items(part, "transfers"):
        acc = sums.setdefault((str(t.get("src", "?")), str(t.get("dst", "?"))), [0, 0.0, 0.0])
        acc[0] += 1
        acc[1] += finite(t.get("bytes")) or 0.0
        acc[2] += _duration(t)
    makespan = finite(part.get("makespan_s"))
    keys = sorted(sums, key=lambda k: (order.get(k[0], len(order)), order.get(k[1], len(order)),
                                       k))
    return [LinkRow(s, d, fmt_count(sums[s, d][0]), fmt_bytes(sums[s, d][1]),
                    fmt_seconds(sums[s, d][2]), _pct(_ratio(sums[s, d][2], makespan)))
            for s, d in keys]


def largest_transfers(part: Mapping[str, Any], k: int = TOP_TRANSFERS
                      ) -> list[tuple[str, str, str, str, str, str]]:
    """(tensor, from, to, size, start, time) of the ``k`` largest copies, largest first."""
    rows = sorted(items(part, "transfers"),
                  key=lambda t: (-(finite(t.get("bytes")) or 0.0),
                                 finite(t.get("start_s")) or 0.0, str(t.get("tensor"))))
    return [(str(t.get("tensor", "?")), str(t.get("src", "?")), str(t.get("dst", "?")),
             fmt_bytes(t.get("bytes")), fmt_seconds(t.get("start_s")), fmt_seconds(_duration(t)))
            for t in rows[:k]]


def stage_rows(part: Mapping[str, Any]) -> list[StageRow]:
    """Pipeline stages in order; a stage's time is the notes' (else the sum of its nodes)."""
    stages = [s for s in part.get("stages") or [] if isinstance(s, Sequence)
              and not isinstance(s, (str, bytes))]
    if not stages:
        return []
    devs = list(part.get("stage_devices") or [])
    notes = part.get("notes") if isinstance(part.get("notes"), Mapping) else {}
    given = notes.get("stage_times_s") if isinstance(notes.get("stage_times_s"), list) else []
    dur = {str(s.get("node")): _duration(s) for s in items(part, "schedule")}
    times = [finite(given[i]) if i < len(given) else None for i in range(len(stages))]
    times = [t if t is not None else sum(dur.get(str(n), 0.0) for n in st)
             for t, st in zip(times, stages, strict=True)]
    slowest = max(times, default=0.0)
    return [StageRow(str(i + 1), str(devs[i]) if i < len(devs) else "?", fmt_count(len(st)),
                     str(st[0]) if st else "—", str(st[-1]) if st else "—", fmt_seconds(t),
                     t / slowest if slowest > 0 else 0.0)
            for i, (st, t) in enumerate(zip(stages, times, strict=True))]


def _candidates(notes: Mapping[str, Any]) -> str:
    cands = notes.get("candidates_s")
    if not isinstance(cands, Mapping) or not cands:
        return ""
    order = sorted(cands, key=lambda k: (finite(cands[k]) is None, finite(cands[k]) or 0.0,
                                         str(k)))
    return ", ".join(f"{k} {fmt_seconds(cands[k]) if finite(cands[k]) else 'does not fit'}"
                     for k in order)


def partition_facts(part: Mapping[str, Any]) -> list[Fact]:
    """Strategy, devices, makespan (vs one device), transfers and the strategy's own notes."""
    notes = part.get("notes") if isinstance(part.get("notes"), Mapping) else {}
    strategy = str(part.get("strategy") or "?")
    makespan = finite(part.get("makespan_s"))
    detail = ""
    if strategy == "heft" and notes.get("chosen"):
        moves = finite(notes.get("refined_moves"))
        detail = f"the {notes['chosen']} schedule" + (
            f", then {int(moves):,} refinement moves" if moves else "")
    elif strategy == "pipeline":
        detail = f"{len(stage_rows(part))} contiguous stages in execution order"
    elif strategy == "tensor":
        detail = "tensor parallel: every node on every device, split blocks 1/t, the rest whole"
    elif strategy == "2d":
        detail = (f"{len(stage_rows(part))} pipeline stages, each tensor parallel within its "
                  "NVLink group")
    devices = items(part, "devices")
    out: list[Fact] = [
        ("strategy", strategy, detail),
        ("devices", fmt_count(len(devices)),
         ", ".join(f"{d.get('name', '?')} ({d.get('target') or '?'})" for d in devices)),
    ]
    single = finite(notes.get("best_single_device_s"))
    vs = f"{single / makespan:.2f}× faster than the best single device ({fmt_seconds(single)})" \
        if single and makespan else ""
    if strategy in ("pipeline", "tensor", "2d") and notes.get("makespan_is"):
        vs = str(notes["makespan_is"])
    out.append(("makespan", fmt_seconds(makespan), vs))
    if finite(notes.get("bottleneck_s")) is not None:
        tput = finite(notes.get("throughput_per_s"))
        out.append(("slowest stage", fmt_seconds(notes["bottleneck_s"]),
                    f"{tput:,.1f} batches/s when stages overlap" if tput else ""))
    xfers = items(part, "transfers")
    total = sum(finite(t.get("bytes")) or 0.0 for t in xfers)
    out.append(("transfers", f"{len(xfers):,} cop{'y' if len(xfers) == 1 else 'ies'}",
                f"{fmt_bytes(total)} in {fmt_seconds(sum(_duration(t) for t in xfers))} "
                f"on links" if xfers else ""))
    colls = items(part, "collectives")
    if colls:
        out.append(("collectives", f"{len(colls):,}",
                    f"{fmt_seconds(sum(_duration(c) for c in colls))} on the critical path, "
                    "drawn on every device of their group"))
    if _candidates(notes):
        out.append(("schedules tried", _candidates(notes), ""))
    if notes.get("link_model"):
        out.append(("link model", str(notes["link_model"]), ""))
    return out


def partition_md(plan: Mapping[str, Any], h: str) -> list[str]:
    """The "Partition across devices" section, or nothing for a plan that is not split."""
    part = partition_of(plan)
    if not part:
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
        n = len(items(part, "transfers"))
        out += [f"_The {len(top)} largest of {n:,} copies:_" if n > len(top)
                else "_Every copy, largest first:_", ""]
        out += md_table(["tensor", "from", "to", "size", "start", "time"],
                        [[md_code(t), md_code(a), md_code(b), size, start, dur]
                         for t, a, b, size, start, dur in top], "lllrrr")
    return out
