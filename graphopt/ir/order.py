"""Small graph utilities shared by the ONNX frontend and the ONNX passes."""

from __future__ import annotations

import heapq
from collections.abc import Sequence, Set

__all__ = ["stable_topo_order", "unique_name"]


def stable_topo_order(deps: Sequence[Set[int]]) -> list[int]:
    """Kahn's algorithm over ``deps[i]`` (the indices node ``i`` reads from), always taking the
    smallest ready index so the order stays as close to the original as possible. Nodes on a
    cycle are left out: the caller decides whether that is an error."""
    users: list[list[int]] = [[] for _ in deps]
    for i, ds in enumerate(deps):
        for d in ds:
            users[d].append(i)
    indegree = [len(d) for d in deps]
    ready = [i for i, d in enumerate(indegree) if d == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            indegree[u] -= 1
            if indegree[u] == 0:
                heapq.heappush(ready, u)
    return order


def unique_name(hint: str, used: set[str]) -> str:
    """``hint``, or ``hint_1``, ``hint_2``... whichever is not in ``used``; records it there."""
    name, k = hint, 0
    while name in used:
        k += 1
        name = f"{hint}_{k}"
    used.add(name)
    return name
