"""Make an optimized ``fx.GraphModule`` run on any device, not only the one it was traced on.

torch.export traces on the example inputs' device and bakes it into the graph in two ways:

1. Tensor constants (``lifted_tensor_0``, ``_tensor_constant0``, a tensor kept as a plain
   module attribute) become plain attributes of the module, not buffers: ``.to(device)``
   does not move them, and the first op mixing one with a moved tensor fails.
2. Factory and copy ops (``aten.arange``, ``aten.full``, ``aten.ones``, ``aten.empty``,
   ``aten.scalar_tensor``, ``aten._to_copy``, ``aten.to``...) carry the trace-time device as
   an argument (``device=cpu``), so they keep making CPU tensors after the module moved.

:func:`make_portable` registers every such constant as a non-persistent buffer (it moves with
``.to()``, and stays out of the state dict like export's own constants), and rewrites every
baked-in device argument to the device of the graph's first tensor input, read once per call
(``getattr(x, "device")``, one node that fx, torch.export and torch.compile all trace).
``aten._assert_tensor_metadata``, which only checks a tensor the graph itself made, drops its
device check instead: every tensor now follows that one device.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import fx

__all__ = ["make_portable"]

logger = logging.getLogger(__name__)

_ASSERT_METADATA = torch.ops.aten._assert_tensor_metadata.default


def constants_to_buffers(gm: torch.nn.Module) -> list[str]:
    """Register every plain tensor attribute of ``gm`` and its submodules as a buffer.

    A plain attribute lives in the module's ``__dict__``; parameters and buffers do not.
    Returns the qualified names of the attributes turned into buffers.
    """
    moved = []
    for prefix, mod in gm.named_modules():
        for name, value in list(vars(mod).items()):
            if not isinstance(value, torch.Tensor) or isinstance(value, torch.nn.Parameter):
                continue
            delattr(mod, name)
            mod.register_buffer(name, value, persistent=False)
            moved.append(f"{prefix}.{name}" if prefix else name)
    return moved


def _device_slots(node: fx.Node) -> list[tuple[int | str, Any]]:
    """(position or keyword, value) of each constant device argument of an ATen call."""
    if node.op != "call_function":
        return []
    schema = getattr(node.target, "_schema", None)
    slots: list[tuple[int | str, Any]] = []
    if schema is None:  # a Python callable: only a ``device=`` keyword is known to be one
        value = node.kwargs.get("device")
        return [("device", value)] if isinstance(value, (torch.device, str)) else []
    for i, arg in enumerate(schema.arguments):
        if "Device" not in str(arg.type):
            continue
        if not arg.kwarg_only and i < len(node.args):
            slot, value = i, node.args[i]
        else:
            slot, value = arg.name, node.kwargs.get(arg.name)
        if isinstance(value, (torch.device, str)):
            slots.append((slot, value))
    return slots


def _first_tensor_input(graph: fx.Graph) -> fx.Node | None:
    for node in graph.nodes:
        if node.op == "placeholder" and isinstance(node.meta.get("val"), torch.Tensor):
            return node
    return None


def follow_input_device(gm: fx.GraphModule) -> dict[str, Any]:
    """Rewrite baked-in device arguments of ``gm``'s graph to its first tensor input's device.

    Returns ``{"rewritten": {op: count}, "asserts_relaxed": n, "left": [node names]}``; a
    graph with no tensor input keeps its devices (``left``): there is nothing to follow.
    """
    graph = gm.graph
    rewritten: dict[str, int] = {}
    relaxed, left = 0, []
    device: fx.Node | None = None
    for node in list(graph.nodes):
        slots = _device_slots(node)
        if not slots:
            continue
        if node.target is _ASSERT_METADATA:
            node.kwargs = {**node.kwargs, "device": None}
            relaxed += 1
            continue
        if device is None:
            source = _first_tensor_input(graph)
            if source is None:
                left.append(node.name)
                continue
            last = [n for n in graph.nodes if n.op == "placeholder"][-1]
            with graph.inserting_after(last):
                device = graph.call_function(getattr, (source, "device"))
            device.meta["val"] = source.meta["val"].device
        args, kwargs = list(node.args), dict(node.kwargs)
        for slot, _ in slots:
            if isinstance(slot, int):
                args[slot] = device
            else:
                kwargs[slot] = device
        node.args, node.kwargs = tuple(args), kwargs
        key = str(node.target)
        rewritten[key] = rewritten.get(key, 0) + 1
    return {"rewritten": rewritten, "asserts_relaxed": relaxed, "left": left}


def make_portable(gm: fx.GraphModule) -> dict[str, Any]:
    """Constants to buffers and factory devices to the input's, in ``gm`` and its subgraphs.

    Returns what changed: ``{"buffers": [...], "devices": {graph: follow_input_device(...)}}``
    (graphs with nothing rewritten left out). The caller recompiles ``gm``.
    """
    buffers = constants_to_buffers(gm)
    devices = {}
    for name, mod in gm.named_modules():
        if isinstance(mod, fx.GraphModule):
            done = follow_input_device(mod)
            if done["rewritten"] or done["asserts_relaxed"] or done["left"]:
                devices[name or "<root>"] = done
            if mod is not gm:
                mod.recompile()
    if buffers or devices:
        logger.debug("portable: %d constants to buffers, devices %s", len(buffers), devices)
    return {"buffers": buffers, "devices": devices}
