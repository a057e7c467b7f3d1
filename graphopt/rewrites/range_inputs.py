"""Inputs at the ends of a shape range, made from the example inputs, for the numeric checks.

Every rewrite is checked at min and max as well as at opt: a rewrite that is right at one size
and wrong at another (a reshape that baked a size in) must be caught. The new inputs are the
example's own values tiled or cropped along each dynamic dim
(:meth:`~graphopt.shape_range.ShapeRange.sized_inputs`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from graphopt.shape_range import ShapeRange

__all__ = ["range_points"]


def range_points(args: tuple[Any, ...], names: Sequence[str], rng: ShapeRange | None
                 ) -> list[tuple[str, dict[str, int], tuple[Any, ...]]]:
    """(point, dim sizes, inputs) for min and max, each different from opt; ``names`` are the
    graph input names of the tensor ``args`` in order."""
    if not rng:
        return []
    opt = rng.values("opt")
    tensors = dict(zip(names, (a for a in args if isinstance(a, torch.Tensor)), strict=False))
    out = []
    for point in ("min", "max"):
        values = rng.check_values(point)
        if values == opt:
            continue
        sized = rng.sized_inputs(values, tensors, lambda t, reps: t.repeat(*reps))
        moved = iter(sized.values())
        inputs = tuple(next(moved).contiguous() if isinstance(a, torch.Tensor) else a
                       for a in args)
        out.append((point, values, inputs))
    return out
