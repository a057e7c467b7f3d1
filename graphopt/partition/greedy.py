"""The reference splitter: the seed library's greedy per-op split, and an honest evaluator.

The seed (Go ``autoopt``, ``WorkloadSplitter.Split``) walks the ops once and gives each op the
device that minimizes its own estimated time plus the transfer of its data, while the device's
memory account (every op's footprint added, never freed) stays under its limit. Its
``TotalEstimatedTimeNs`` assumes "operations on different devices run in parallel": the total
is the busiest device's summed time, which ignores that a consumer waits for its producer.

Here: :func:`greedy_split` reproduces that split and its naive total;
:func:`evaluate_assignment` puts any assignment (greedy's, HEFT's, a user's) on the same clock
-- the dependency-respecting list schedule of :mod:`graphopt.partition.simulate` -- so splitters
are compared on the makespan a real run would see.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from graphopt.errors import GraphoptError
from graphopt.ir.graph import Graph
from graphopt.ir.plan import Plan
from graphopt.partition.assemble import to_partition
from graphopt.partition.devices import DeviceSet
from graphopt.partition.problem import Problem, build_problem
from graphopt.partition.result import Partition
from graphopt.partition.simulate import Sim, simulate

__all__ = ["GreedyResult", "evaluate", "evaluate_assignment", "greedy_split"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GreedyResult:
    """The seed's assignment, its naive parallel total and its memory account per device."""

    assign: tuple[int, ...]
    naive_total_s: float
    memory_account: tuple[int, ...]


def greedy_split(pb: Problem) -> GreedyResult:
    """Each op, in order, to the device minimizing (its time + moving its inputs there) among
    devices whose running footprint (parameters once + every output, never freed) still fits;
    when none fits, the one with the most room left (the seed has no better fallback)."""
    k = pb.k
    assign: list[int] = []
    used = [0] * k
    seen: list[set[int]] = [set() for _ in range(k)]
    per_device = [0.0] * k
    for v in range(pb.n):
        out_bytes = sum(pb.t_bytes[t] for t in pb.node_outputs[v])
        best: tuple[float, int] | None = None
        needs = []
        for d in range(k):
            need = out_bytes + sum(pb.p_bytes[p] for p in pb.node_params[v] if p not in seen[d])
            needs.append(need)
            if used[d] + need > pb.caps[d]:
                continue
            xfer = sum(pb.transfer_s(pb.t_bytes[t], assign[pb.t_producer[t]], d)
                       for t in pb.node_inputs[v] if pb.t_producer[t] >= 0)
            total = pb.cost[d][v] + xfer
            if best is None or total < best[0]:
                best = (total, d)
        if best is None:
            d = max(range(k), key=lambda e: (pb.caps[e] - used[e], -e))
            xfer = sum(pb.transfer_s(pb.t_bytes[t], assign[pb.t_producer[t]], d)
                       for t in pb.node_inputs[v] if pb.t_producer[t] >= 0)
            best = (pb.cost[d][v] + xfer, d)
        total, d = best
        assign.append(d)
        used[d] += needs[d]
        seen[d].update(pb.node_params[v])
        per_device[d] += total
    return GreedyResult(tuple(assign), max(per_device, default=0.0), tuple(used))


def evaluate(pb: Problem, assign: tuple[int, ...] | list[int]) -> Sim:
    """Any assignment (device index per node) on the shared clock, in plan order."""
    return simulate(pb, assign)


def evaluate_assignment(plan: Plan | Graph, devices: DeviceSet,
                        assignment: Mapping[str, str]) -> Partition:
    """A user's (or another splitter's) node -> device map, scheduled and measured honestly."""
    pb = build_problem(plan, devices)
    index = {d.name: i for i, d in enumerate(devices.devices)}
    missing = [n for n in pb.names if n not in assignment]
    unknown = sorted({v for v in assignment.values() if v not in index})
    if missing or unknown:
        raise GraphoptError(
            f"assignment leaves {len(missing)} node(s) without a device"
            f"{' (e.g. ' + missing[0] + ')' if missing else ''}"
            f"{'; unknown devices: ' + ', '.join(unknown) if unknown else ''}",
            f"map every node to one of {', '.join(index)}")
    sim = simulate(pb, [index[assignment[n]] for n in pb.names])
    reasons = ["given assignment"] * pb.n
    return to_partition(pb, sim, "given", reasons, {})
