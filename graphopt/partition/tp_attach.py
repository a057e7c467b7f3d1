"""Write a strategy's result onto the plan: node ``device`` decisions and the report sections.

Why apart from :func:`graphopt.partition.apply_partition`: under tensor parallelism a node runs
on every device of its group (1/t of it, or replicated), not on one device.

Sections written:

1. ``partition``: the timeline's shape (the same keys as :meth:`Partition.to_dict`), with every
   device of the group scheduled for each node, plus ``collectives`` (each with the devices it
   runs on) so the Gantt chart draws the all-reduces.
2. ``tensor_parallel``: :meth:`TensorParallel.to_dict` (or the 2-D one) and
   ``parallelize_module``: :func:`.tp_emit.describe_plan`'s plan and code, or why it is not
   available (no module paths: the plan did not come from a torch module).
3. ``strategy``: the comparison (:func:`.strategies.run_strategy`).
"""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType
from typing import Any

from graphopt.errors import GraphoptError
from graphopt.ir.plan import Decision, Plan
from graphopt.partition.result import ScheduledNode
from graphopt.partition.strategies import torch_module
from graphopt.partition.tensor_parallel import TensorParallel
from graphopt.partition.tp_blocks import find_tp_blocks
from graphopt.partition.tp_roles import Share
from graphopt.partition.two_d import TwoD

__all__ = ["attach_split", "parallelize_section"]


def parallelize_section(plan: Plan, degree: int, source: Any, *,
                        sequence_parallel: bool = False, module: Any = None,
                        split: set[str] | None = None) -> dict[str, Any]:
    """Case 2: the ``parallelize_module`` plan for the user's module (the sequence-parallel
    one when the result was costed with it), or why there is none. ``split``: the names of
    the blocks the cost model split (an LM head not worth its gather is left out); None
    emits every block that divides."""
    from graphopt.partition.tp_emit import describe_plan

    blocks, _ = find_tp_blocks(plan, degree, source=source)
    if split is not None:
        blocks = [b for b in blocks if b.name in split]
    mod = torch_module(getattr(source, "source_model", source), module)
    try:
        return describe_plan(blocks, degree, module=mod, sequence_parallel=sequence_parallel)
    except GraphoptError as e:
        return {"unavailable": e.problem, "fix": e.fix}


def _decisions(plan: Plan, rows: list[tuple[ScheduledNode, tuple[str, ...], int | None]]
               ) -> Plan:
    """Each node's ``device`` decision: the group it runs on, its share, start and finish."""
    first: dict[str, tuple[ScheduledNode, tuple[str, ...], int | None]] = {}
    for row in rows:
        first.setdefault(row[0].node, row)
    nodes = []
    for n in plan.nodes:
        if n.name not in first:
            nodes.append(n)
            continue
        s, group, stage = first[n.name]
        share = (s.share or Share.SPLIT).text(len(group))  # None: a node split 1/t
        fields: dict[str, Any] = {"device": ",".join(group), "devices": list(group),
                                  "share": share, "start_s": s.start_s, "finish_s": s.finish_s}
        if stage is not None:
            fields["stage"] = stage
        text = f"on all {len(group)} devices of {'+'.join(group)} ({share}): {s.reason}"
        nodes.append(replace(n, decisions=MappingProxyType(
            {**n.decisions, "device": Decision(text, MappingProxyType(fields))})))
    return replace(plan, nodes=tuple(nodes))


def _timeline(res: TensorParallel | TwoD, makespan: float) -> dict[str, Any]:
    """Case 1: the ``partition`` section of a tensor-parallel or 2-D result."""
    devs = res.devices.devices
    busy, coll, mem = res.busy_s, res.collective_s, res.memory_used
    out: dict[str, Any] = {
        "strategy": "tensor" if isinstance(res, TensorParallel) else "2d",
        "makespan_s": makespan,
        "devices": [{**d.to_dict(), "memory_used_bytes": mem.get(d.name, 0),
                     "busy_s": busy.get(d.name, 0.0), "collective_s": coll.get(d.name, 0.0)}
                    for d in devs],
        "schedule": [{"node": s.node, "device": s.device, "start_s": s.start_s,
                      "finish_s": s.finish_s} for s in res.schedule],
    }
    if isinstance(res, TensorParallel):
        names = [d.name for d in devs]
        out.update(transfers=[], stages=[], stage_devices=[], collectives=[
            {"kind": str(c.kind), "after": c.after, "bytes": c.nbytes, "start_s": c.start_s,
             "finish_s": c.finish_s, "devices": names} for c in res.collectives],
            notes={"throughput_per_s": res.throughput_per_s,
                   "makespan_is": "one request, every device working on every node"})
        return out
    out.update(
        transfers=[{"tensor": t.tensor, "src": t.src_device, "dst": t.dst_device,
                    "bytes": t.nbytes, "start_s": t.start_s, "finish_s": t.finish_s}
                   for t in res.transfers],
        stages=[list(res.node_names[s.first:s.end]) for s in res.stages],
        stage_devices=["+".join(s.group) for s in res.stages],
        collectives=res.collectives(),
        notes={**res.notes, "makespan_is": res.notes["latency_is"]})
    return out


def attach_split(plan: Plan, res: TensorParallel | TwoD, strategy: dict[str, Any], *,
                 source: Any = None, module: Any = None) -> Plan:
    """The plan with the node decisions and the three sections of a tensor-parallel or 2-D
    result."""
    if isinstance(res, TensorParallel):
        group = tuple(d.name for d in res.devices.devices)
        rows = [(s, group, None) for s in res.schedule]
        section = {**res.to_dict(), "groups": [list(group)]}
        section["devices"] = [{**d, "group": 0} for d in section["devices"]]
        makespan, degree = res.makespan_s, res.degree
        seq = bool(res.notes["sequence_parallel"]["enabled"])
        split = {b.block for b in res.splits}
    else:
        rows = [(s, st.group, st.index) for st in res.stages for s in st.tp.schedule]
        offset = dict(zip((st.index for st in res.stages), res.stage_starts(), strict=True))
        rows = [(replace(s, start_s=s.start_s + offset[i], finish_s=s.finish_s + offset[i],
                         reason=f"stage {i + 1}: {s.reason}"), g, i) for s, g, i in rows]
        section = res.to_dict()
        makespan, degree = res.latency_s, max(len(g) for g in res.groups)
        seq = res.sequence_parallel  # the 2-D split is costed plain and with SP
        split = {b.block for st in res.stages for b in st.tp.splits}
    section["parallelize_module"] = parallelize_section(plan, degree, source,
                                                        sequence_parallel=seq, module=module,
                                                        split=split)
    out = _decisions(plan, rows)
    return replace(out, partition=_timeline(res, makespan), tensor_parallel=section,
                   strategy=strategy)
