"""The ``strategy`` and ``tensor_parallel`` sections of a plan as markdown; the row functions
are shared with the HTML renderer (``tp_html``).

``strategy`` (:func:`graphopt.partition.strategies.run_strategy`): the winner, why, and every
candidate's latency and throughput (or why it could not run). ``tensor_parallel``
(:meth:`TensorParallel.to_dict` or the 2-D one): per device memory, busy and collective time,
each block's split (degree, dims), the stages of a 2-D split, and the ``parallelize_module``
plan; for a 2-D split, its run (micro-batches, schedule, stage modules, moved and uneven cuts)
and the emitted code (:mod:`graphopt.partition.two_d_emit`) or why it is not emitted. Both
renderers print the same values from the same functions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from graphopt.report.format import finite, fmt_bytes, fmt_seconds, md_code, md_table, md_text
from graphopt.report.partition_md import items

__all__ = ["TPDeviceRow", "candidate_rows", "split_rows", "stage2d_rows", "strategy_of",
           "tp_device_rows", "tp_md", "tp_of", "two_d_code", "two_d_facts"]


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


def _section(plan: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = plan.get(key)
    return value if isinstance(value, Mapping) else {}


def strategy_of(plan: Mapping[str, Any]) -> Mapping[str, Any]:
    return _section(plan, "strategy")


def tp_of(plan: Mapping[str, Any]) -> Mapping[str, Any]:
    return _section(plan, "tensor_parallel")


def _rate(x: Any) -> str:
    v = finite(x)
    return "—" if v is None else f"{v:,.1f}/s"


def candidate_rows(st: Mapping[str, Any]) -> list[list[str]]:
    """strategy, latency, throughput, fits, note: the winner first, then by latency."""
    win = str(st.get("winner"))
    cands = items(st, "candidates")
    cands.sort(key=lambda c: (str(c.get("strategy")) != win, finite(c.get("latency_s")) is None,
                              finite(c.get("latency_s")) or 0.0, str(c.get("strategy"))))
    return [[str(c.get("strategy", "?")) + (" (picked)" if str(c.get("strategy")) == win else ""),
             fmt_seconds(c.get("latency_s")) if finite(c.get("latency_s")) else "—",
             _rate(c.get("throughput_per_s")),
             "yes" if c.get("feasible") else "no",
             str(c.get("why_not") or (f"not emitted, never picked: {c['not_emitted']}; "
                                      if c.get("not_emitted") else "")
                 + str(c.get("detail") or ""))] for c in cands]


def tp_device_rows(tp: Mapping[str, Any]) -> list[TPDeviceRow]:
    out = []
    for d in items(tp, "devices"):
        used, usable = finite(d.get("memory_used_bytes")), finite(d.get("memory_bytes"))
        group = d.get("group")
        out.append(TPDeviceRow(
            str(d.get("name", "?")), "—" if group is None else str(group), fmt_bytes(used),
            fmt_bytes(usable), fmt_bytes(d.get("param_bytes")),
            fmt_bytes(d.get("activation_bytes")), fmt_seconds(d.get("busy_s")),
            fmt_seconds(d.get("collective_s")),
            min(max(used / usable, 0.0), 1.0) if used is not None and usable else 0.0))
    return out


def split_rows(tp: Mapping[str, Any]) -> list[list[str]]:
    """block, kind, degree, column dims, row dims, stage, compute (split / whole), and the
    collective after it (an all-reduce, or the LM head's all-gather)."""
    out = []
    for s in items(tp, "splits"):
        dims = s.get("dims") if isinstance(s.get("dims"), Mapping) else {}
        stage = s.get("stage")
        out.append([str(s.get("block", "?")), str(s.get("kind", "?")), str(s.get("degree", "?")),
                    str(dims.get("column", "—")), str(dims.get("row", "—")),
                    "—" if stage is None else str(int(stage) + 1),
                    f"{fmt_seconds(s.get('compute_s'))} / {fmt_seconds(s.get('unsplit_s'))}",
                    f"{s.get('collective') or 'all-reduce'} "
                    f"{fmt_bytes(s.get('allreduce_bytes'))} in "
                    f"{fmt_seconds(s.get('allreduce_s'))}"])
    return out


def stage2d_rows(tp: Mapping[str, Any]) -> list[list[str]]:
    """stage, group, nodes, first … last, compute, collectives, transfer, stage time."""
    return [[str(int(s.get("stage", 0)) + 1), "+".join(str(x) for x in s.get("group") or []),
             f"{int(s.get('nodes') or 0):,}", f"{s.get('first', '?')} … {s.get('last', '?')}",
             fmt_seconds(s.get("compute_s")), fmt_seconds(s.get("collective_s")),
             (f"{fmt_bytes(s.get('send_bytes'))} in {fmt_seconds(s.get('send_s'))}"
              if finite(s.get("send_bytes")) else "—"), fmt_seconds(s.get("stage_s"))]
            for s in items(tp, "stages")]


def _pipeline(tp: Mapping[str, Any]) -> Mapping[str, Any]:
    value = tp.get("pipeline") if tp.get("strategy") == "2d" else None
    return value if isinstance(value, Mapping) else {}


def two_d_facts(tp: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(label, text) lines of a 2-D split's run: micro-batches and schedule, each stage's
    modules, an uneven split and every cut moved onto a module boundary."""
    pipe = _pipeline(tp)
    if not pipe:
        return []
    out = [("run", f"{pipe.get('micro_batches', '?')} micro-batches, "
                   f"{pipe.get('schedule', '?')}"
                   f"{', sequence parallel in each stage' if pipe.get('sequence_parallel') else ''}"
                   f": {pipe.get('schedule_why', '')}")]
    emitted = pipe.get("emitted") if isinstance(pipe.get("emitted"), Mapping) else {}
    for st in items(emitted, "stages"):
        out.append((f"stage {int(st.get('stage', 0)) + 1}",
                    ", ".join(str(m) for m in st.get("modules") or []) or "—"))
    notes = tp.get("notes") if isinstance(tp.get("notes"), Mapping) else {}
    if notes.get("uneven"):
        out.append(("uneven", str(notes["uneven"])))
    for c in items(pipe, "moved_cuts"):
        pair = "–".join(str(x) for x in c.get("between_stages") or [])
        out.append(("moved cut", f"stages {pair}: planned after {c.get('planned_after')} "
                                 f"({c.get('why')}), moved {c.get('at')} (after "
                                 f"{c.get('moved_after')}); re-costed: latency "
                                 f"{fmt_seconds(tp.get('makespan_s'))}, planned "
                                 f"{fmt_seconds(notes.get('planned_latency_s'))}"))
    if pipe.get("not_emitted"):
        out.append(("not emitted", str(pipe["not_emitted"])))
    return out


def two_d_code(tp: Mapping[str, Any]) -> str:
    """The emitted 2-D code ("" when there is none)."""
    emitted = _pipeline(tp).get("emitted")
    return str(emitted.get("code") or "") if isinstance(emitted, Mapping) else ""


def _two_d_md(tp: Mapping[str, Any], h: str) -> list[str]:
    facts = two_d_facts(tp)
    if not facts:
        return []
    out = [f"{h}# 2-D plan (pipeline stages x tensor parallel)", ""]
    out += [f"- **{label}:** {md_text(text)}" for label, text in facts] + [""]
    code = two_d_code(tp)
    return out + (["```python", code, "```", ""] if code else [])


def _strategy_md(st: Mapping[str, Any], h: str) -> list[str]:
    out = [f"{h} Strategy", "",
           f"- **picked:** {md_code(st.get('winner', '?'))} — by "
           f"{md_text(st.get('picked_by', '?'))}",
           f"- **why:** {md_text(st.get('why', ''))}", ""]
    return out + md_table(["strategy", "latency (one request)", "throughput (stream)",
                           "fits memory", "note"],
                          [[md_code(r[0]), r[1], r[2], r[3], md_text(r[4])]
                           for r in candidate_rows(st)], "lrrll")


def tp_md(plan: Mapping[str, Any], h: str) -> list[str]:
    """The "Strategy" and "Tensor parallelism" sections, or nothing."""
    st, tp = strategy_of(plan), tp_of(plan)
    out = _strategy_md(st, h) if st else []
    if not tp:
        return out
    groups = [g for g in tp.get("groups") or [] if isinstance(g, list)]
    out += [f"{h} Tensor parallelism", "",
            f"- **strategy:** {md_code(tp.get('strategy', '?'))}, degree "
            f"{md_text(tp.get('degree', '?'))}, groups "
            + ", ".join(md_code("+".join(map(str, g))) for g in groups),
            f"- **latency (one request):** {fmt_seconds(tp.get('makespan_s'))}",
            f"- **throughput (stream of micro-batches):** {_rate(tp.get('throughput_per_s'))}"]
    link = tp.get("link") if isinstance(tp.get("link"), Mapping) else None
    if link:
        out.append(f"- **collective link:** {md_code(link.get('name', '?'))}")
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
    fallbacks = [str(f) for f in tp.get("fallbacks") or []]
    if fallbacks:
        out += [f"_Not split:_ {md_text('; '.join(fallbacks))}", ""]
    pm = tp.get("parallelize_module") if isinstance(tp.get("parallelize_module"),
                                                     Mapping) else {}
    if tp.get("strategy") == "2d":
        out += _two_d_md(tp, h)
    elif pm.get("code"):
        out += [f"{h}# parallelize_module plan", "", "```python", str(pm["code"]), "```", ""]
    elif pm.get("unavailable"):
        out += [f"_No parallelize\\_module plan:_ {md_text(pm['unavailable'])}", ""]
    return out
