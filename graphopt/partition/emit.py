"""Run a partition: the traced model cut into one submodule per run of nodes on one device.

``split_module(model, inputs, partition)`` exports the model, assigns every fx node a device
(from ``partition.assignment``, whose names are the fx node names), cuts the graph into parts
and emits a top-level ``GraphModule`` that calls the parts in order with an explicit
``.to(device)`` on every tensor that crosses from one partition device to another:

1. Nodes the plan does not name (``getitem`` of a multi-output op, shape arithmetic, asserts)
   run where their latest input runs; a ``getitem`` always stays with its producer, so only
   tensors, never tuples, cross devices. Nodes with no placed input follow their first user.
2. Parameters, buffers and constants are copied into every part that reads them, on that
   part's device (tied weights used on two devices are replicated, not transferred).
3. Parts are the maximal runs of a device-affine topological order: among the ready nodes the
   one on the current device goes first, so a HEFT schedule that interleaves branches in the
   graph's order still gives one part per device switch, not one per node.
4. A tensor crossing to a device is moved once per destination device and reused there.

``torch.fx.passes.split_module`` is not used: it passes parameters into each part as inputs
from the root module, so they would stay on the root's device and cross on every call.
The user's model is never changed: parameters are copied, even onto the same device.
"""

from __future__ import annotations

import copy
import heapq
import logging
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from graphopt.errors import GraphoptError, TraceError
from graphopt.frontends.torch_frontend import _quiet_torch, _split_inputs
from graphopt.frontends.user_state import private_copy
from graphopt.partition.result import Partition

__all__ = ["CutPart", "DeviceTransfer", "PartInfo", "cut_graph", "export_graph_module",
           "node_devices", "resolve_device", "split_module"]

logger = logging.getLogger(__name__)

_COMPUTE_OPS = ("call_function", "call_method", "call_module")


@dataclass(frozen=True, slots=True)
class DeviceTransfer:
    """One ``.to(device)`` the split module runs: ``tensor`` is the fx node name of the value;
    ``src_device`` is ``"input"`` for a model input moved to the part that first reads it."""

    tensor: str
    src_device: str
    dst_device: str
    dst_part: str
    nbytes: int


@dataclass(frozen=True, slots=True)
class PartInfo:
    """One submodule of the split: its device and the fx nodes, inputs and outputs it holds."""

    name: str
    device: str
    nodes: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CutPart:
    """A part as :func:`cut_graph` builds it: the record and its module (None if not built)."""

    info: PartInfo
    module: fx.GraphModule | None


def resolve_device(name: str, device_map: Mapping[str, torch.device | str] | None
                   ) -> torch.device:
    """The torch device a partition device name runs on: ``device_map[name]``, else the name
    itself (``cuda:1``); ``cpu:N`` names are all the host CPU."""
    if device_map and name in device_map:
        return torch.device(device_map[name])
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise GraphoptError(f"partition device {name!r} is not a torch device name",
                            f"pass device_map={{{name!r}: 'cuda:0', ...}}") from None
    return torch.device("cpu") if dev.type == "cpu" else dev


def export_graph_module(model: nn.Module, example_inputs: Any) -> fx.GraphModule:
    """``torch.export`` the model (as the torch frontend does, so node names match the plan's)
    and return a private copy of ``ep.module()`` without its input-shape guard."""
    args, kwargs = _split_inputs(model, example_inputs)
    model = private_copy(model, share_parameters=True)  # ep.module() shares its buffers
    try:
        with _quiet_torch():
            ep = torch.export.export(model, args, kwargs, strict=False)
    except Exception as err:  # noqa: BLE001 - any export failure means: cannot split
        raise TraceError(f"{type(model).__name__} could not be captured by torch.export: "
                         f"{str(err).splitlines()[0] if str(err) else type(err).__name__}",
                         "make forward() exportable (see `graphopt plan` warnings)") from None
    gm = ep.module()
    for node in list(gm.graph.nodes):
        if node.op == "call_module" and node.target == "_guards_fn" and not node.users:
            gm.graph.erase_node(node)
    gm.recompile()
    return gm


def node_devices(gm: fx.GraphModule, assignment: Mapping[str, str], default: str
                 ) -> dict[fx.Node, str]:
    """Device of every compute node (cases 1 of the module docstring)."""
    dev: dict[fx.Node, str] = {}
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    pending: list[fx.Node] = []
    for node in gm.graph.nodes:
        if node.op not in _COMPUTE_OPS:
            continue
        placed = [a for a in node.all_input_nodes if a in dev]
        if node.target is operator.getitem and placed:
            dev[node] = dev[placed[0]]
        elif node.name in assignment:
            dev[node] = assignment[node.name]
        elif placed:
            dev[node] = dev[max(placed, key=order.__getitem__)]
        else:
            pending.append(node)
    for node in reversed(pending):  # no placed input: follow the first placed user
        users = sorted((u for u in node.users if u in dev), key=order.__getitem__)
        dev[node] = dev[users[0]] if users else default
    return dev


def _device_affine_order(gm: fx.GraphModule, dev: Mapping[fx.Node, str]) -> list[fx.Node]:
    """Topological order of the compute nodes that stays on one device while it can (case 3)."""
    nodes = [n for n in gm.graph.nodes if n.op in _COMPUTE_OPS]
    index = {n: i for i, n in enumerate(nodes)}
    indeg = {n: sum(1 for a in n.all_input_nodes if a in index) for n in nodes}
    ready: dict[str, list[int]] = {}
    for n in nodes:
        if indeg[n] == 0:
            heapq.heappush(ready.setdefault(dev[n], []), index[n])
    order: list[fx.Node] = []
    current = dev[nodes[0]] if nodes else ""
    while len(order) < len(nodes):
        if not ready.get(current):
            current = min((q[0], d) for d, q in ready.items() if q)[1]
        node = nodes[heapq.heappop(ready[current])]
        order.append(node)
        for user in node.users:
            if user in index:
                indeg[user] -= 1
                if indeg[user] == 0:
                    heapq.heappush(ready.setdefault(dev[user], []), index[user])
    return order


def _nbytes(node: fx.Node) -> int:
    v = node.meta.get("val")
    if not isinstance(v, torch.Tensor):
        return 0
    try:
        return int(v.numel()) * v.element_size()
    except (TypeError, RuntimeError):  # symbolic sizes
        return 0


def _is_tensor(node: fx.Node) -> bool:
    return isinstance(node.meta.get("val"), torch.Tensor)


def _fetch(gm: nn.Module, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _place(obj: Any, device: torch.device) -> Any:
    """A private copy of a parameter, buffer, constant or module on ``device`` (case 2)."""
    if isinstance(obj, nn.Parameter):
        return nn.Parameter(obj.detach().to(device, copy=True), requires_grad=obj.requires_grad)
    if isinstance(obj, torch.Tensor):
        return obj.detach().to(device, copy=True)
    if isinstance(obj, nn.Module):
        return copy.deepcopy(obj).to(device)
    return obj


def _build_part(gm: fx.GraphModule, nodes: Sequence[fx.Node], inputs: Sequence[fx.Node],
                outputs: Sequence[fx.Node], device: torch.device, name: str) -> fx.GraphModule:
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for v in inputs:
        env[v] = graph.placeholder(v.name)
        env[v].meta = dict(v.meta)
    root = nn.Module()
    attrs: dict[str, Any] = {}
    for node in nodes:
        for a in node.all_input_nodes:
            if a.op == "get_attr" and a not in env:
                env[a] = graph.get_attr(str(a.target))
                env[a].meta = dict(a.meta)
                attrs[str(a.target)] = _fetch(gm, str(a.target))
        if node.op == "call_module":
            attrs[str(node.target)] = _fetch(gm, str(node.target))
        env[node] = graph.node_copy(node, env.__getitem__)
    graph.output(tuple(env[v] for v in outputs))
    for target, obj in attrs.items():
        owner_name, _, attr = target.rpartition(".")
        owner = root
        for piece in owner_name.split(".") if owner_name else ():
            if not hasattr(owner, piece):
                owner.add_module(piece, nn.Module())
            owner = getattr(owner, piece)
        placed = _place(obj, device)
        if isinstance(placed, nn.Parameter | nn.Module):
            setattr(owner, attr, placed)
        else:
            owner.register_buffer(attr, placed)
    return fx.GraphModule(root, graph, class_name=name)


def cut_graph(gm: fx.GraphModule, groups: Sequence[tuple[str, Sequence[fx.Node]]],
              device_of: Callable[[str], torch.device], *, carry: bool = False,
              build: Callable[[int], bool] = lambda i: True) -> list[CutPart]:
    """Cut ``gm`` into parts, one per ``(device name, nodes)`` group, in order.

    A part's inputs are the outside values it reads and its outputs the values read outside
    it. With ``carry`` (pipeline stages, which only talk to their neighbours) part ``i`` takes
    every value still needed from ``i`` on, the first part takes all model inputs, and the last
    part returns the model's flat outputs; values a part does not use pass through it.
    """
    part_of = {n: i for i, (_, nodes) in enumerate(groups) for n in nodes}
    pos = {n: k for k, n in enumerate(gm.graph.nodes)}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    flat_out = list(out_node.args[0]) if isinstance(out_node.args[0], (tuple, list)) else []
    last_use: dict[fx.Node, int] = {}  # value -> last part (len(groups) = the output) using it
    reads: list[dict[fx.Node, None]] = [{} for _ in groups]
    for i, (_, nodes) in enumerate(groups):
        for node in nodes:
            for a in node.all_input_nodes:
                if a.op == "get_attr":
                    continue
                if part_of.get(a) != i:
                    reads[i].setdefault(a)
                last_use[a] = max(last_use.get(a, -1), i)
    for v in out_node.all_input_nodes:
        last_use[v] = len(groups)
    if carry and not all(isinstance(v, fx.Node) for v in flat_out):
        raise GraphoptError("the model returns a non-tensor value; a pipeline's last stage "
                            "can only return tensors", "return tensors only from forward()")
    parts: list[CutPart] = []
    for i, (device, nodes) in enumerate(groups):
        if carry:
            inputs = placeholders if i == 0 else sorted(
                (v for v in last_use if _defined_before(v, i, part_of) and last_use[v] >= i),
                key=pos.__getitem__)
            outputs = flat_out if i == len(groups) - 1 else sorted(
                (v for v in last_use if _defined_before(v, i + 1, part_of) and last_use[v] > i),
                key=pos.__getitem__)
        else:
            inputs = list(reads[i])
            outputs = [n for n in nodes if any(part_of.get(u, -1) != i for u in n.users)]
        name = f"part_{i}"
        info = PartInfo(name, device, tuple(n.name for n in nodes),
                        tuple(v.name for v in inputs), tuple(v.name for v in outputs))
        module = (_build_part(gm, nodes, inputs, outputs, device_of(device), f"Part{i}")
                  if build(i) else None)
        parts.append(CutPart(info, module))
    return parts


def _defined_before(v: fx.Node, i: int, part_of: Mapping[fx.Node, int]) -> bool:
    return v.op == "placeholder" or part_of.get(v, i) < i


def split_module(model: nn.Module, example_inputs: Any, partition: Partition,
                 device_map: Mapping[str, torch.device | str] | None = None,
                 *, output_device: torch.device | str | None = None) -> fx.GraphModule:
    """The model as one submodule per device run, called like the model itself.

    The result's ``transfers`` lists the crossings between partition devices (one per tensor
    and destination device), ``input_moves`` the model inputs moved to their first part, and
    ``parts`` the :class:`PartInfo` of each submodule. Outputs stay on the device that made
    them unless ``output_device`` is given.
    """
    gm = export_graph_module(model, example_inputs)
    names = [d.name for d in partition.devices.devices]
    default = partition.stage_devices[0] if partition.stage_devices else names[0]
    dev = node_devices(gm, partition.assignment, default)
    order = _device_affine_order(gm, dev)
    groups: list[tuple[str, list[fx.Node]]] = []
    for node in order:
        if not groups or groups[-1][0] != dev[node]:
            groups.append((dev[node], []))
        groups[-1][1].append(node)

    def device_of(name: str) -> torch.device:
        return resolve_device(name, device_map)

    parts = cut_graph(gm, groups, device_of)
    top = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            env[node] = top.node_copy(node, env.__getitem__)
    moved: dict[tuple[fx.Node, str], fx.Node] = {}
    transfers: list[DeviceTransfer] = []
    input_moves: list[DeviceTransfer] = []
    root = nn.Module()
    by_name = {n.name: n for n in gm.graph.nodes}
    for part, (device, _) in zip(parts, groups, strict=True):
        args = []
        for name in part.info.inputs:
            v = by_name[name]
            src = "input" if v.op == "placeholder" else dev[v]
            if src == device or not _is_tensor(v):  # same device, or an int/shape value
                args.append(env[v])
                continue
            key = (v, device)
            if key not in moved:
                tag = re.sub(r"\W", "_", device)
                moved[key] = top.create_node("call_method", "to", (env[v], str(device_of(
                    device))), name=f"{v.name}_to_{tag}")
                moved[key].meta = dict(v.meta)
                record = DeviceTransfer(v.name, src, device, part.info.name, _nbytes(v))
                (input_moves if src == "input" else transfers).append(record)
                logger.debug("transfer %s: %s -> %s", v.name, src, device)
            args.append(moved[key])
        assert part.module is not None
        root.add_module(part.info.name, part.module)
        call = top.call_module(part.info.name, tuple(args))
        for k, name in enumerate(part.info.outputs):
            env[by_name[name]] = top.create_node("call_function", operator.getitem, (call, k),
                                                 name=name)
            env[by_name[name]].meta = dict(by_name[name].meta)
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    result = fx.map_arg(out_node.args[0], env.__getitem__)
    if output_device is not None:
        target = str(torch.device(output_device))
        result = fx.map_arg(result, lambda n: top.call_method("to", (n, target))
                            if _is_tensor(n) else n)
    top.output(result)
    top._codegen = gm.graph._codegen  # same call signature and output pytree as the model
    split = fx.GraphModule(root, top, class_name="SplitModule")
    split.transfers = transfers
    split.input_moves = input_moves
    split.parts = [p.info for p in parts]
    logger.info("split %s into %d parts on %d devices with %d transfers",
                type(model).__name__, len(parts), len({g[0] for g in groups}), len(transfers))
    return split
