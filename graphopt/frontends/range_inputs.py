"""Inputs at the ends of a shape range, made from the example inputs, for the numeric checks.

Every rewrite is checked at min and max as well as at opt: a rewrite that is right at one size
and wrong at another (a reshape that baked a size in) must be caught. The new inputs are the
example's own values tiled or cropped along each dynamic dim
(:meth:`~graphopt.ir.shape_range.ShapeRange.sized_inputs`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from graphopt.ir.shape_range import ShapeRange

__all__ = ["range_points"]


def range_points(args: tuple[Any, ...], names: Sequence[str], rng: ShapeRange | None
                 ) -> list[tuple[str, dict[str, int], tuple[Any, ...]]]:
    """(point, dim sizes, inputs) for min and max, each different from opt; ``names`` are the
    graph input names of the tensor ``args`` in order."""
    if not rng:
        return []
    where = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    named = list(zip(names, where, strict=False))
    tensors = {name: args[i] for name, i in named}
    out = []
    for point, values in rng.end_points():
        sized = rng.sized_inputs(values, tensors, lambda t, reps: t.repeat(*reps))
        inputs = list(args)
        for name, i in named:
            inputs[i] = sized[name].contiguous()
        out.append((point, values, tuple(inputs)))
    return out
