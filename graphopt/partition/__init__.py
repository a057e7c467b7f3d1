"""Partition a model across devices: where each node runs, when, and what crosses links.

Pipeline: ``parse_devices``/``detect_devices`` -> :func:`split` (``"heft"`` or ``"pipeline"``)
-> :class:`Partition` -> :func:`apply_partition` writes each node's ``device`` decision and the
report's ``partition`` section. :func:`greedy_split` is the seed library's per-op splitter, kept
as the reference every strategy is tested against; :func:`evaluate_assignment` measures any
assignment on the same clock.

Beside them, :mod:`.strategies` (``--strategy tensor|auto``) runs tensor parallelism
(:mod:`.tensor_parallel`) and the 2-D split (:mod:`.two_d`: tensor parallel per NVLink group,
pipeline stages across groups), compares them with heft and pipeline, and :mod:`.tp_attach`
writes the winner onto the plan.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from types import MappingProxyType

from graphopt.ir.decision_details import DeviceDetail
from graphopt.ir.plan import Decision, Plan
from graphopt.partition.devices import Device, DeviceSet
from graphopt.partition.greedy import GreedyResult, evaluate_assignment, greedy_split
from graphopt.partition.parse import detect_devices, make_device_set, parse_devices, parse_size
from graphopt.partition.problem import Problem, build_problem
from graphopt.partition.result import Partition, ScheduledNode, Transfer
from graphopt.partition.simulate import Sim, simulate
from graphopt.partition.splitter import STRATEGIES, split

__all__ = [
    "STRATEGIES",
    "Device",
    "DeviceSet",
    "GreedyResult",
    "Partition",
    "Problem",
    "ScheduledNode",
    "Sim",
    "Transfer",
    "apply_partition",
    "build_problem",
    "detect_devices",
    "evaluate_assignment",
    "greedy_split",
    "make_device_set",
    "parse_devices",
    "parse_size",
    "simulate",
    "split",
]

logger = logging.getLogger(__name__)


def apply_partition(plan: Plan, partition: Partition) -> Plan:
    """The plan with each node's ``device`` decision (device, start, finish, reason) and the
    ``partition`` report section; nodes the partition does not cover are left as they are."""
    rows = {s.node: s for s in partition.schedule}
    stage_of = {name: i for i, stage in enumerate(partition.stages) for name in stage}
    nodes = []
    for n in plan.nodes:
        row = rows.get(n.name)
        if row is None:
            nodes.append(n)
            continue
        decision = Decision(row.reason, DeviceDetail(row.device, row.start_s, row.finish_s,
                                                     stage=stage_of.get(n.name)))
        nodes.append(replace(n, decisions=MappingProxyType({**n.decisions, "device": decision})))
    missing = len(plan.nodes) - sum(1 for n in plan.nodes if n.name in rows)
    if missing:
        logger.warning("partition covers %d of %d nodes", len(plan.nodes) - missing,
                       len(plan.nodes))
    return replace(plan, nodes=tuple(nodes),
                   partition=partition.to_record())
