"""The facts the layout rules read about one conv: from the plan's shapes (:func:`conv_facts`)
or, through the same :class:`ConvGroups` and :class:`ConvShape` views, from the torch backend's
conv records."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from graphopt.ir.plan import NodePlan

__all__ = ["CONVS", "ConvFacts", "ConvGroups", "ConvShape", "conv_facts", "static_dims"]

CONVS = ("Conv", "ConvTranspose")


class ConvShape(Protocol):
    """What :func:`cpu_class` reads (a :class:`ConvFacts` or the torch pass's ConvInfo)."""

    groups: int
    kernel: tuple[int, ...]
    out_spatial: int

    @property
    def channels_per_group(self) -> int: ...
    @property
    def depthwise(self) -> bool: ...
    @property
    def grouped(self) -> bool: ...


def static_dims(shape: tuple[int | str, ...] | None) -> tuple[int, ...] | None:
    """Dynamic dims count as 1 (as TensorInfo.numel does)."""
    return None if shape is None else tuple(d if type(d) is int else 1 for d in shape)


class ConvGroups:
    """Channels per group, depthwise, grouped: read from ``c_in`` and ``groups`` by the plan's
    conv facts and the torch backend's conv records alike."""

    c_in: int
    groups: int

    @property
    def channels_per_group(self) -> int:
        return self.c_in // max(1, self.groups)

    @property
    def depthwise(self) -> bool:
        return self.groups > 1 and self.channels_per_group == 1

    @property
    def grouped(self) -> bool:
        """Grouped with more than one channel per group (depthwise is not "grouped" here)."""
        return self.groups > 1 and self.channels_per_group > 1


@dataclass(frozen=True)
class ConvFacts(ConvGroups):
    """What the layout rules need to know about one conv of the plan."""

    name: str
    rank: int
    groups: int
    c_in: int
    c_out: int
    kernel: tuple[int, ...]
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    est_time_s: float
    transposed: bool = False
    weight_constant: bool = True

    @property
    def out_spatial(self) -> int:
        return math.prod(self.out_shape[2:])


def conv_facts(node: NodePlan) -> ConvFacts | None:
    """Conv facts from the plan's shapes; None when they are unknown or not 2-D/3-D."""
    if node.op_type not in CONVS or len(node.inputs) < 2 or not node.outputs:
        return None
    x, w, out = node.inputs[0], node.inputs[1], node.outputs[0]
    if any(t is None or t.shape is None or not all(isinstance(d, int) for d in t.shape[1:])
           for t in (x, out)):
        return None  # channel or spatial dims unknown (a batch dim may be symbolic)
    xs, ws, os_ = (static_dims(t.shape) if t is not None else None for t in (x, w, out))
    if xs is None or ws is None or os_ is None or len(os_) not in (4, 5) or len(xs) != len(os_):
        return None
    return ConvFacts(name=node.name, rank=len(os_),
                     groups=int(node.analysis.dims.get("groups", 1) or 1), c_in=xs[1],
                     c_out=os_[1], kernel=ws[2:], in_shape=xs, out_shape=os_,
                     est_time_s=node.cost.est_time_s, transposed=node.op_type == "ConvTranspose",
                     weight_constant=w is not None and w.kind in ("param", "constant"))
