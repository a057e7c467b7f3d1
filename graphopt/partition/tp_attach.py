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
from graphopt.ir.decision_details import DeviceDetail
from graphopt.ir.plan import Decision, Plan
from graphopt.ir.plan_parallel import (
    ParallelizePlan,
    ParallelizeUnavailable,
    TensorParallelPlan,
    TwoDParallelPlan,
)
from graphopt.ir.plan_partition import (
    DeviceRow,
    PartitionPlan,
    Strategy,
    StrategyChoice,
    TensorNotes,
    TwoDNotes,
)
from graphopt.partition.result import ScheduledNode
from graphopt.partition.strategies import torch_module
from graphopt.partition.tensor_parallel import TensorParallel
from graphopt.partition.tp_blocks import find_tp_blocks
from graphopt.partition.tp_roles import Share
from graphopt.partition.two_d import TwoD

__all__ = ["attach_split", "parallelize_section"]


def parallelize_section(plan: Plan, degree: int, source: Any, *,
                        sequence_parallel: bool = False, module: Any = None,
                        split: set[str] | None = None
                        ) -> ParallelizePlan | ParallelizeUnavailable:
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
        described = describe_plan(blocks, degree, module=mod,
                                  sequence_parallel=sequence_parallel)
    except GraphoptError as e:
        return ParallelizeUnavailable(e.problem, e.fix)
    return ParallelizePlan.from_json(described)  # tp_emit's description, checked by type


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
        detail = DeviceDetail(",".join(group), s.start_s, s.finish_s, tuple(group), share, stage)
        text = f"on all {len(group)} devices of {'+'.join(group)} ({share}): {s.reason}"
        nodes.append(replace(n, decisions=MappingProxyType(
            {**n.decisions, "device": Decision(text, detail)})))
    return replace(plan, nodes=tuple(nodes))


def _timeline(res: TensorParallel | TwoD, makespan: float) -> PartitionPlan:
    """Case 1: the ``partition`` section of a tensor-parallel or 2-D result."""
    devs = res.devices.devices
    busy, coll, mem = res.busy_s, res.collective_s, res.memory_used
    devices = tuple(DeviceRow(d.name, d.profile.name, d.memory_bytes, mem.get(d.name, 0),
                              busy.get(d.name, 0.0), coll.get(d.name, 0.0)) for d in devs)
    schedule = tuple(s.row() for s in res.schedule)
    if isinstance(res, TensorParallel):
        names = tuple(d.name for d in devs)
        return PartitionPlan(
            Strategy.TENSOR, makespan, devices, schedule, transfers=(), stages=(),
            stage_devices=(), collectives=tuple(c.row(devices=names) for c in res.collectives),
            notes=TensorNotes(res.throughput_per_s,
                              "one request, every device working on every node"))
    return PartitionPlan(
        Strategy.TWO_D, makespan, devices, schedule,
        transfers=tuple(t.row() for t in res.transfers),
        stages=tuple(tuple(res.node_names[s.first:s.end]) for s in res.stages),
        stage_devices=tuple("+".join(s.group) for s in res.stages),
        collectives=res.collectives(),
        notes=TwoDNotes.from_json({**res.notes, "makespan_is": res.notes["latency_is"]}))


def attach_split(plan: Plan, res: TensorParallel | TwoD, strategy: StrategyChoice, *,
                 source: Any = None, module: Any = None) -> Plan:
    """The plan with the node decisions and the three sections of a tensor-parallel or 2-D
    result."""
    if isinstance(res, TensorParallel):
        group = tuple(d.name for d in res.devices.devices)
        rows = [(s, group, None) for s in res.schedule]
        makespan, degree = res.makespan_s, res.degree
        seq = bool(res.notes["sequence_parallel"]["enabled"])
        split = {b.block for b in res.splits}
    else:
        rows = [(s, st.group, st.index) for st in res.stages for s in st.tp.schedule]
        offset = dict(zip((st.index for st in res.stages), res.stage_starts(), strict=True))
        rows = [(replace(s, start_s=s.start_s + offset[i], finish_s=s.finish_s + offset[i],
                         reason=f"stage {i + 1}: {s.reason}"), g, i) for s, g, i in rows]
        makespan, degree = res.latency_s, max(len(g) for g in res.groups)
        seq = res.sequence_parallel  # the 2-D split is costed plain and with SP
        split = {b.block for st in res.stages for b in st.tp.splits}
    emitted = parallelize_section(plan, degree, source, sequence_parallel=seq, module=module,
                                  split=split)
    section: TensorParallelPlan | TwoDParallelPlan = res.to_record(emitted)
    out = _decisions(plan, rows)
    return replace(out, partition=_timeline(res, makespan), tensor_parallel=section,
                   strategy=strategy)
