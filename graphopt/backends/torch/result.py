"""What the torch backend hands the face: one typed record, not a dict to take apart."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from graphopt.ir.plan import Plan
from graphopt.ir.plan_run import TorchOptimization
from graphopt.ir.shape_range import ShapeRange

__all__ = ["TorchResult"]


@dataclass(frozen=True)
class TorchResult:
    """The torch backend's output for :func:`graphopt.optimize`.

    Attributes:
        module: the rewritten graph (an ``fx.GraphModule``), or a copy of the user's model when
            even the rewritten graph measured slower on the host (nothing graphopt does pays).
        plan: the plan with every decision the passes applied or declined; its
            ``optimization`` section is ``report``.
        report: the run report (passes applied and reverted, tolerance, numerics per output,
            notes): the plan's ``optimization`` record, what ``Optimized.info`` holds.
        example_inputs: the positional inputs the passes checked with (clones of the user's).
        shape_range: the range the module accepts, or None for the example's shapes.
        input_names: forward's name for each positional input (None where the example passed a
            non-tensor value there).
        runtime_flags: the CUDA backend flags the module sets per call (TF32, reduced-precision
            reductions), as the precision pass asked.
    """

    module: torch.nn.Module
    plan: Plan
    report: TorchOptimization
    example_inputs: tuple[Any, ...]
    shape_range: ShapeRange | None
    input_names: tuple[str | None, ...]
    runtime_flags: dict[str, Any] = field(default_factory=dict)
