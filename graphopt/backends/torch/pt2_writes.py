"""What a graph read from a file may write, checked on the graph the reader built (issue 30).

Why: an allowed in-place op (``copy_``, ``index_put_``: a saved KV-cache step writes its cache
buffer that way) writes whatever tensor it is handed, and a file may hand it the caller's own
input, or a weight. So each write is followed back to the tensors its target may share memory
with (:func:`sources`: through the schema's alias marks, and through every argument of an op
that :func:`.pt2_ops.returns_input` says may return one unmarked), and only the graph's
buffers and its own intermediates may be written. A buffer that is written must own its bytes:
no two of its elements at one address (a zero stride), no byte shared with another weight of
the file. An op that returns uninitialized memory (``empty_like``, which a MoE's routing fills
in) gets a ``zero_`` after it (:func:`zero_fill`), so no byte of the process's heap reaches an
output.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from operator import attrgetter
from typing import Any

import torch
from torch import fx

from graphopt.backends.torch.pt2_ops import (
    UNINITIALIZED,
    Refused,
    qualified,
    returns_input,
    written_args,
)

__all__ = ["check", "overlaps", "sources", "zero_fill"]

_ZERO = torch.ops.aten.zero_.default


def overlaps(sizes: tuple[int, ...] | list[int], strides: tuple[int, ...] | list[int]) -> bool:
    """Whether two indices of a view may reach one element (a conservative test: each stride,
    smallest first, must pass every element the smaller ones reach)."""
    if 0 in sizes:
        return False
    reach = 0
    for stride, size in sorted((s, n) for n, s in zip(sizes, strides, strict=True) if n > 1):
        if stride <= reach:
            return True
        reach += (size - 1) * stride
    return False


def _nodes(value: Any) -> Iterator[fx.Node]:
    if isinstance(value, fx.Node):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _nodes(v)


def _bound(node: fx.Node) -> dict[str, Any]:
    """The node's arguments by their schema names."""
    names = [a.name for a in node.target._schema.arguments]
    return {**dict(zip(names, node.args, strict=False)), **node.kwargs}


def sources(graph: fx.Graph) -> dict[fx.Node, frozenset[fx.Node]]:
    """Each node -> the placeholders and get_attrs whose memory its value may share."""
    out: dict[fx.Node, frozenset[fx.Node]] = {}
    for node in graph.nodes:
        if node.op in ("placeholder", "get_attr"):
            out[node] = frozenset({node})
        elif node.op == "call_function" and node.target is operator.getitem:
            out[node] = out.get(node.args[0], frozenset())
        elif node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            every = returns_input(node.target)
            marked = {a.name for a in node.target._schema.arguments if a.alias_info is not None}
            found: set[fx.Node] = set()
            for name, value in _bound(node).items():
                if every or name in marked:
                    for arg in _nodes(value):
                        found |= out.get(arg, frozenset())
            out[node] = frozenset(found)
        else:
            out[node] = frozenset()
    return out


def zero_fill(graph: fx.Graph) -> int:
    """A ``zero_`` after each op that returns uninitialized memory, its users reading that;
    the count."""
    count = 0
    for node in list(graph.nodes):
        op = node.target
        if node.op != "call_function" or not isinstance(op, torch._ops.OpOverload) or \
                op.namespace != "aten" or op._schema.name.split("::")[1] not in UNINITIALIZED:
            continue
        with graph.inserting_after(node):
            zeroed = graph.call_function(_ZERO, (node,))
        zeroed.meta.update(node.meta)
        node.replace_all_uses_with(zeroed, delete_user_cb=lambda user, z=zeroed: user is not z)
        count += 1
    return count


def _span(t: torch.Tensor) -> tuple[int, int, int]:
    """(storage address, first byte, byte past the last) a tensor's elements reach."""
    size = t.element_size()
    start = t.storage_offset() * size
    reach = sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
    return t.untyped_storage().data_ptr(), start, start + (reach + 1) * size


def _lifted(gm: fx.GraphModule) -> set[str]:
    """The qualified names of the module's non-persistent buffers (the archive's constants)."""
    return {f"{prefix}.{b}" if prefix else b for prefix, m in gm.named_modules()
            for b in m._non_persistent_buffers_set}


def _own_bytes(gm: fx.GraphModule, name: str, writer: fx.Node) -> None:
    """The written buffer ``name``: no two elements at one address, no byte of a weight, and
    no byte of another buffer unless it is the same tensor, once as a buffer and once as a
    lifted constant (export lifts a StaticCache's step counter so: one state, two names)."""
    t = attrgetter(name)(gm)
    what = f"{writer.name} ({qualified(writer.target)}) writes the buffer {name}"
    if overlaps(tuple(t.shape), t.stride()):
        raise Refused(f"{what}, whose strides {tuple(t.stride())} put two of its elements at "
                      "one address")
    if t.numel() == 0:
        return
    home, start, end = _span(t)
    params = {n for n, _ in gm.named_parameters()}
    lifted = _lifted(gm)  # export's constants: non-persistent buffers
    for other, u in [*gm.named_parameters(), *gm.named_buffers()]:
        if other == name or u.numel() == 0:
            continue
        where, first, last = _span(u)
        same = other not in params and (name in lifted or other in lifted) and \
            u.dtype == t.dtype and u.shape == t.shape and u.stride() == t.stride() and \
            (where, first) == (home, start)
        if where == home and first < end and start < last and not same:
            raise Refused(f"{what}, which shares its bytes with {other}")


def check(graph: fx.Graph, gm: fx.GraphModule) -> set[str]:
    """Refused unless every write of ``graph`` (weights as get_attrs of ``gm``) lands on a
    buffer that owns its bytes or on an intermediate; the buffers written."""
    params = {name for name, _ in gm.named_parameters()}
    roots = sources(graph)
    written: dict[str, fx.Node] = {}
    for node in graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        args = _bound(node)
        for arg in written_args(node.target):
            for value in _nodes(args.get(arg)):
                for root in roots.get(value, ()):
                    what = f"{node.name} ({qualified(node.target)}) writes its argument {arg}"
                    if root.op == "placeholder":
                        raise Refused(f"{what}, which is (or views) the model's input "
                                      f"{root.name}")
                    if str(root.target) in params:
                        raise Refused(f"{what}, which is (or views) the weight {root.target}")
                    written.setdefault(str(root.target), node)
    for name, writer in written.items():
        _own_bytes(gm, name, writer)
    return set(written)
