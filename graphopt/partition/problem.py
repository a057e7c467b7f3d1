"""The splitting problem in flat arrays: per-device node costs, tensors, parameters, links.

Every splitter and the schedule evaluator read this one record, so they agree on the clock:

1. Node cost on a device = the roofline ``estimate(analysis, device.profile).est_time_s``,
   computed once per (node, profile); the plan's own target reuses the plan's cost.
2. Tensors that move between devices are activations (node outputs) only. Graph inputs are
   taken as present at time 0 on every device that reads them (the caller feeds each device);
   parameters and constants are resident on each device that runs a node reading them, counted
   once per device (tied weights are shared).
3. A transfer takes ``latency + bytes / bandwidth`` of the link of that ordered pair.
4. Workspace: a device running any GEMM-like node also holds one GEMM workspace
   (:func:`graphopt.decisions.memory_runtime.memory.gemm_workspace_bytes`), as the single-device
   memory plan does.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from graphopt.analysis.kernel_class import GEMM_LIKE
from graphopt.analysis.record import NodeAnalysis
from graphopt.cost import estimate
from graphopt.decisions.memory_runtime.memory import gemm_workspace_bytes
from graphopt.decisions.planner import build_plan
from graphopt.ir.graph import Graph
from graphopt.ir.plan import NodePlan, Plan
from graphopt.partition.devices import DeviceSet

__all__ = ["Problem", "build_problem", "live_profile"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Problem:
    """Flat, index-based view of a plan on a device set (node i = ``plan.nodes[i]``)."""

    plan: Plan
    devices: DeviceSet
    names: tuple[str, ...]
    cost: tuple[tuple[float, ...], ...]  # [device][node] seconds
    node_inputs: tuple[tuple[int, ...], ...]  # activation/input tensor ids read, deduplicated
    node_outputs: tuple[tuple[int, ...], ...]
    node_params: tuple[tuple[int, ...], ...]  # param/constant ids read, deduplicated
    node_gemm: tuple[bool, ...]
    t_names: tuple[str, ...]
    t_bytes: tuple[int, ...]
    t_producer: tuple[int, ...]  # -1: a graph input (or a tensor no node writes)
    t_consumers: tuple[tuple[int, ...], ...]
    t_output: tuple[bool, ...]  # a graph output: lives to the end
    p_names: tuple[str, ...]
    p_bytes: tuple[int, ...]
    caps: tuple[int, ...]  # usable bytes per device
    workspace: tuple[int, ...]  # GEMM workspace bytes per device
    latency: tuple[tuple[float, ...], ...]  # [src][dst]
    inv_bw: tuple[tuple[float, ...], ...]  # seconds per byte [src][dst]

    @property
    def n(self) -> int:
        return len(self.names)

    @property
    def k(self) -> int:
        return len(self.devices.devices)

    @property
    def always_fits(self) -> bool:
        """Every parameter and every activation at once fits each device: any split is legal."""
        total = sum(self.p_bytes) + sum(self.t_bytes)
        return all(total + w <= c for w, c in zip(self.workspace, self.caps, strict=True))

    def transfer_s(self, nbytes: int, src: int, dst: int) -> float:
        return 0.0 if src == dst else self.latency[src][dst] + nbytes * self.inv_bw[src][dst]

    def device_label(self, d: int) -> str:
        dev = self.devices.devices[d]
        return dev.name if dev.name == dev.profile.name else f"{dev.name} ({dev.profile.name})"


def _as_plan(plan_or_graph: Plan | Graph, devices: DeviceSet) -> Plan:
    if isinstance(plan_or_graph, Plan):
        return plan_or_graph

    return build_plan(plan_or_graph, devices.devices[0].profile, decisions=False)


def _analysis_key(a: NodeAnalysis) -> tuple[Any, ...]:
    """Every field ``estimate`` may read: equal keys give equal costs (repeated layers)."""
    return (a.kernel_class, tuple(a.dims.items()), a.flops, a.bytes_read, a.bytes_written,
            a.param_count, a.dtype, a.pattern, a.flags)


def build_problem(plan_or_graph: Plan | Graph, devices: DeviceSet) -> Problem:
    """Flatten a plan (or a graph, planned on the first device) for the splitters."""
    plan = _as_plan(plan_or_graph, devices)
    nodes = plan.nodes
    cost = _costs(plan, devices)
    flow = _Flow(nodes)
    outputs = set(plan.model.output_names)
    lat, inv = _links(devices)
    return Problem(
        plan=plan, devices=devices, names=tuple(n.name for n in nodes),
        cost=cost, node_inputs=tuple(flow.node_inputs),
        node_outputs=tuple(flow.node_outputs), node_params=tuple(flow.node_params),
        node_gemm=tuple(n.analysis.kernel_class in GEMM_LIKE for n in nodes),
        t_names=tuple(flow.t_names), t_bytes=tuple(flow.t_bytes),
        t_producer=tuple(flow.t_producer),
        t_consumers=tuple(tuple(c) for c in flow.consumers),
        t_output=tuple(t in outputs for t in flow.t_names),
        p_names=tuple(flow.p_names), p_bytes=tuple(flow.p_bytes),
        caps=tuple(d.memory_bytes for d in devices.devices),
        workspace=tuple(gemm_workspace_bytes(d.profile)[0] for d in devices.devices),  # case 4
        latency=tuple(map(tuple, lat)), inv_bw=tuple(map(tuple, inv)))


def _costs(plan: Plan, devices: DeviceSet) -> tuple[tuple[float, ...], ...]:
    """Case 1: each device's node costs, one vector per profile (the plan's own target keeps
    the plan's costs)."""
    nodes = plan.nodes
    by_profile: dict[int, tuple[float, ...]] = {}
    cost = []
    keys: list[tuple[Any, ...]] | None = None
    for dev in devices.devices:
        pid = id(dev.profile)
        if pid not in by_profile:
            if dev.profile is plan.target or dev.profile == plan.target:
                by_profile[pid] = tuple(n.cost.est_time_s for n in nodes)
            else:
                keys = keys if keys is not None else [_analysis_key(n.analysis) for n in nodes]
                memo: dict[tuple[Any, ...], float] = {}
                times = []
                for n, key in zip(nodes, keys, strict=True):
                    t = memo.get(key)
                    if t is None:
                        t = memo[key] = estimate(n.analysis, dev.profile).est_time_s
                    times.append(t)
                by_profile[pid] = tuple(times)
        cost.append(by_profile[pid])
    return tuple(cost)


class _Flow:
    """Case 2: the nodes' activations and parameters as indices, in first-seen order."""

    def __init__(self, nodes: Sequence[NodePlan]) -> None:
        self.t_index: dict[str, int] = {}
        self.t_names: list[str] = []
        self.t_bytes: list[int] = []
        self.t_producer: list[int] = []
        self.consumers: list[list[int]] = []
        self.p_index: dict[str, int] = {}
        self.p_names: list[str] = []
        self.p_bytes: list[int] = []
        self.node_inputs: list[tuple[int, ...]] = []
        self.node_outputs: list[tuple[int, ...]] = []
        self.node_params: list[tuple[int, ...]] = []
        for i, n in enumerate(nodes):
            self._node(i, n)

    def _tensor(self, name: str, nbytes: int) -> int:
        i = self.t_index.get(name)
        if i is None:
            i = self.t_index[name] = len(self.t_names)
            self.t_names.append(name)
            self.t_bytes.append(nbytes)
            self.t_producer.append(-1)
            self.consumers.append([])
        return i

    def _node(self, i: int, n: NodePlan) -> None:
        ins: dict[int, None] = {}
        params: dict[int, None] = {}
        for t in n.inputs:
            if t is None:
                continue
            if t.kind in ("param", "constant"):  # case 2
                if t.name not in self.p_index:
                    self.p_index[t.name] = len(self.p_names)
                    self.p_names.append(t.name)
                    self.p_bytes.append(t.nbytes)
                params[self.p_index[t.name]] = None
            else:
                ins[self._tensor(t.name, t.nbytes)] = None
        outs: dict[int, None] = {}
        for t in n.outputs:
            if t is not None:
                j = self._tensor(t.name, t.nbytes)
                self.t_producer[j] = i
                outs[j] = None
        for j in ins:
            self.consumers[j].append(i)
        self.node_inputs.append(tuple(ins))
        self.node_outputs.append(tuple(outs))
        self.node_params.append(tuple(params))


def _links(devices: DeviceSet) -> tuple[list[list[float]], list[list[float]]]:
    """Case 3: each ordered pair's latency and inverse bandwidth."""
    k = len(devices.devices)
    lat = [[0.0] * k for _ in range(k)]
    inv = [[0.0] * k for _ in range(k)]
    for a, da in enumerate(devices.devices):
        for b, db in enumerate(devices.devices):
            if a != b:
                link = devices.link(da.name, db.name)  # case 3
                lat[a][b] = link.latency_s
                inv[a][b] = 1.0 / link.bandwidth_bytes_per_s
    return lat, inv


def live_profile(pb: Problem) -> list[int]:
    """Bytes of activations live at each step when all nodes run in plan order on one device.

    A tensor is live from its producer (graph inputs: step 0) to its last consumer; graph
    outputs to the end (the single-device memory plan's case 2, without view aliasing). The
    pipeline DP bounds a stage's activations by the maximum of this over its steps.
    """
    n = pb.n
    delta = [0] * (n + 1)
    for t, nbytes in enumerate(pb.t_bytes):
        p = pb.t_producer[t]
        cons = pb.t_consumers[t]
        start = max(p, 0)
        if pb.t_output[t]:
            end = n - 1
        elif cons:
            end = max(cons[-1], start)
        else:
            end = start
        if p < 0 and not cons:
            continue  # an unread graph input: nothing holds it
        delta[start] += nbytes
        delta[end + 1] -= nbytes
    live, out = 0, []
    for i in range(n):
        live += delta[i]
        out.append(live)
    return out
