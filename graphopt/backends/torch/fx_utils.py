"""Small helpers for editing the fx graphs the rewrite passes work on."""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import torch
from torch import fx

__all__ = ["aten_name", "get_tensor", "is_aten", "new_param", "users_of", "val"]

_counter = itertools.count()


def aten_name(node: fx.Node) -> str | None:
    """``"conv2d"`` for ``aten.conv2d.default``; None for non-ATen nodes."""
    if node.op != "call_function":
        return None
    packet = getattr(node.target, "overloadpacket", None)
    if packet is None:
        return None
    return getattr(packet, "__name__", str(packet)).split(".")[-1]


def is_aten(node: fx.Node, *names: str) -> bool:
    return aten_name(node) in names


def val(node: fx.Node) -> torch.Tensor | None:
    """The example value (FakeTensor) export recorded for ``node``."""
    v = node.meta.get("val")
    return v if isinstance(v, torch.Tensor) else None


def get_tensor(gm: fx.GraphModule, node: fx.Node | None) -> torch.Tensor | None:
    """The real tensor behind a ``get_attr`` node (a parameter, buffer or constant)."""
    if node is None or node.op != "get_attr":
        return None
    obj: object = gm
    for part in str(node.target).split("."):
        obj = getattr(obj, part)
    return obj if isinstance(obj, torch.Tensor) else None


_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def float_linear(gm: fx.GraphModule, node: fx.Node
                 ) -> tuple[torch.Tensor, torch.Tensor] | str:
    """(weight, input value) of an ``aten.linear`` whose weight is a constant 2-D float matrix
    and whose input is a float tensor, else why it is not one (the quantize passes' common
    legality)."""
    w = get_tensor(gm, node.args[1] if len(node.args) > 1 else None)
    if w is None or w.dim() != 2 or w.dtype not in _FLOATS:
        return "the weight is not a constant float matrix"
    x = val(node.args[0]) if isinstance(node.args[0], fx.Node) else None
    if x is None or x.dtype not in _FLOATS:
        return "the input is not a float tensor"
    return w, x


def new_param(gm: fx.GraphModule, base: str, tensor: torch.Tensor,
              before: fx.Node) -> fx.Node:
    """Register ``tensor`` as a frozen parameter of ``gm`` and return a get_attr node for it."""
    name = f"_graphopt_{base.replace('.', '_')}_{next(_counter)}"
    gm.register_parameter(name, torch.nn.Parameter(tensor.detach(), requires_grad=False))
    with gm.graph.inserting_before(before):
        node = gm.graph.get_attr(name)
    node.meta["val"] = tensor
    return node


def users_of(nodes: Iterable[fx.Node]) -> list[fx.Node]:
    seen: dict[fx.Node, None] = {}
    for n in nodes:
        for u in n.users:
            seen.setdefault(u, None)
    return list(seen)
