"""Real batches for the torch module's lossy passes (``optimize(module, ..., calibration=[...])``):
the forms accepted, and the split into the batches that choose and those that check.

Forms (the ONNX path's list form, ``graphopt.backends.onnx.calibration``), a list of batches:

1. each a tuple (or list) of tensors or numpy arrays in ``forward``'s order;
2. each a dict ``{input name: tensor or array}`` (``forward``'s argument names);
3. each a single tensor or array, for a model with one input.

Each input must have the example's rank, shape (or lie in the shape range) and dtype kind
(float to float, int to int: converted to the example's dtype). Anything else is a
GraphoptError naming the batch and the expected form.

Split (the ONNX path's, ``backends/onnx/holdout.py``): the torch backend chooses from data
only in the low-bit Linear guard (which layers stay float). When that guard runs, the first
half of two or more batches chooses with it and the second half checks; else every given batch
is held out, since nothing is chosen from them. Every lossy pass is checked on the held-out
batches, and the error the report states is theirs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from graphopt.backends.held_out import split
from graphopt.backends.metric import NOT_HELD_OUT, MetricGoal
from graphopt.backends.torch.context import RewriteContext
from graphopt.backends.torch.isolation import run_isolated
from graphopt.backends.torch.verify import compare_batches
from graphopt.backends.torch.weight_quant import guard_chooses
from graphopt.decisions.tolerance import Tolerance
from graphopt.errors import GraphoptError

__all__ = ["HELD_MAX", "ONE_BATCH", "HeldOut", "held_out", "held_out_report", "load_batches",
           "split_batches"]

#: at most this many held-out batches (each lossy pass runs them all): the ONNX guard's
#: ``GUARD_SAMPLES``
HELD_MAX = 8
ONE_BATCH = ("one calibration batch: the quantize guard chooses which layers stay float on it, "
             "so its error is not measured on unseen inputs; give two or more batches (half "
             "are held out for the check)")
_FIX = ("give calibration= a list of batches, each a tuple of tensors in forward's order, a "
        "dict {input name: tensor}, or one tensor for a one-input model, shaped like the "
        "example inputs")


def _tensor(value: Any, example: torch.Tensor, where: str) -> torch.Tensor:
    """``value`` as a tensor of ``example``'s dtype, or a GraphoptError saying why not."""
    if isinstance(value, np.ndarray):
        value = torch.from_numpy(np.ascontiguousarray(value))
    if not isinstance(value, torch.Tensor):
        raise GraphoptError(f"{where} is a {type(value).__name__}, not a tensor or array", _FIX)
    if value.dtype != example.dtype:
        if value.is_floating_point() != example.is_floating_point() or \
                value.is_complex() or example.dtype == torch.bool:
            raise GraphoptError(f"{where} is {value.dtype}; the example input is "
                                f"{example.dtype}", _FIX)
        value = value.to(example.dtype)
    return value.detach().to(example.device).clone()


def _values(batch: Any, i: int, example: tuple[Any, ...], names: Sequence[str]
            ) -> list[Any]:
    """Batch ``i``'s values in ``forward``'s order (forms 1-3)."""
    if isinstance(batch, Mapping):
        missing = [n for n in names if n not in batch]
        extra = sorted(str(k) for k in batch if k not in names)
        if missing or extra:
            raise GraphoptError(f"calibration batch {i} is a dict with keys "
                                f"{sorted(map(str, batch))}; the model's inputs are "
                                f"{list(names)}", _FIX)
        return [batch[n] for n in names]
    if isinstance(batch, (tuple, list)):
        if len(batch) != len(example):
            raise GraphoptError(f"calibration batch {i} has {len(batch)} value(s); the model "
                                f"takes {len(example)} input(s)", _FIX)
        return list(batch)
    if isinstance(batch, (torch.Tensor, np.ndarray)) and len(example) == 1:
        return [batch]
    raise GraphoptError(f"calibration batch {i} is a {type(batch).__name__}", _FIX)


def load_batches(source: Any, example: tuple[Any, ...], names: Sequence[str],
                 shape_range: Any = None) -> list[tuple[Any, ...]]:
    """The batches of ``source`` (forms 1-3) as ``forward``'s positional inputs, checked
    against ``example`` and the shape range."""
    if isinstance(source, (str, bytes)) or not isinstance(source, Sequence) or \
            isinstance(source, (torch.Tensor, np.ndarray)):
        raise GraphoptError(f"calibration= for a torch module is a list of batches, got "
                            f"{type(source).__name__} (.npz files are read for ONNX models)",
                            _FIX)
    if not source:
        raise GraphoptError("calibration= holds no batches", _FIX)
    names = list(names) or [f"input_{k}" for k in range(len(example))]
    batches = []
    for i, batch in enumerate(source):
        values = _values(batch, i, example, names)
        args = tuple(_tensor(v, e, f"calibration batch {i}, input {n!r}")
                     if isinstance(e, torch.Tensor) else v
                     for v, e, n in zip(values, example, names, strict=True))
        shapes = {n: tuple(a.shape) for n, a in zip(names, args, strict=True)
                  if isinstance(a, torch.Tensor)}
        wrong = shape_range.check(shapes) if shape_range else next(
            (f"input {n!r} has shape {list(a.shape)}, the example {list(e.shape)}"
             for n, a, e in zip(names, args, example, strict=True)
             if isinstance(e, torch.Tensor) and a.shape != e.shape), None)
        if wrong:
            raise GraphoptError(f"calibration batch {i}: {wrong}", _FIX + (
                f"; the module takes {shape_range.describe()}" if shape_range else ""))
        batches.append(args)
    return batches


def split_batches(batches: list[tuple[Any, ...]], chooses: bool
                  ) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """(the batches that choose, at most ``HELD_MAX`` held out): the first half chooses when
    a pass chooses from data, else none does and all are held out."""
    if not chooses:
        return [], batches[:HELD_MAX]
    return split(batches, HELD_MAX)


@dataclass
class HeldOut:
    """The batches a lossy pass is checked on beyond the references, with the original model's
    outputs on them, and the user's metric goal."""

    batches: list[tuple[Any, ...]] = field(default_factory=list)
    reference: list[Any] = field(default_factory=list)
    goal: MetricGoal | None = None
    #: (inputs, reference) the metric runs on: the held-out batches, else what there is
    metric_on: list[tuple[tuple[Any, ...], Any]] = field(default_factory=list)
    #: the batches the quantize guard chose with (0 when no pass chooses from data)
    chosen: int = 0
    #: what the plan's warnings say about these checks
    warnings: list[str] = field(default_factory=list)

    def problem(self, run: Callable[[tuple[Any, ...]], Any], tol: Tolerance,
                pass_name: str) -> str | None:
        """Why a lossy pass's module (run by ``run``) is reverted: out of ``tol`` on the
        held-out batches, or below the metric's floor; None when it passes."""
        outputs: dict[int, Any] = {}

        def output(args: tuple[Any, ...]) -> Any:
            if id(args) not in outputs:
                outputs[id(args)] = run(args)
            return outputs[id(args)]

        try:
            why = self._held(output, tol, pass_name)
            below = None if self.goal is None else self.goal.check(  # measured either way
                pass_name, [(ref, output(args)) for args, ref in self.metric_on])
        except GraphoptError:
            raise
        except Exception as e:  # the pass's module fails on a real batch: revert it
            return f"reverted: the {pass_name} pass's module fails on a calibration batch: {e}"
        return why or below

    def _held(self, output: Callable[[tuple[Any, ...]], Any], tol: Tolerance,
              pass_name: str) -> str | None:
        if not self.batches:
            return None
        result = compare_batches(self.reference, [output(a) for a in self.batches], tol)
        bad = [c for c in result if not c.within]
        if not bad:
            return None
        return (f"reverted: the {pass_name} pass is within budget on the batches it was "
                f"checked with, not on the {len(self.batches)} held-out calibration batch(es): "
                + "; ".join(c.describe() for c in bad))


def held_out(traced: torch.nn.Module, ctx: RewriteContext, calibration: Any,
             goal: MetricGoal | None) -> tuple[HeldOut, list[tuple[tuple[Any, ...], Any]]]:
    """(the held-out checks, the (inputs, reference) pairs the quantize guard chooses with):
    the user's batches split (:func:`split_batches`) and the original ``traced`` run on them."""
    held = HeldOut(goal=goal)
    if calibration is None:
        batches: list[tuple[Any, ...]] = []
    else:
        batches = load_batches(calibration, ctx.example_inputs, ctx.input_names,
                               ctx.shape_range)
    choose, held.batches = split_batches(batches, guard_chooses(ctx))
    if choose and not held.batches:
        held.warnings.append(ONE_BATCH)
    held.reference = [run_isolated(traced, a) for a in held.batches]
    chosen = [(a, run_isolated(traced, a)) for a in choose]
    held.chosen = len(chosen)
    if goal is not None:
        held.metric_on = list(zip(held.batches, held.reference, strict=True)) or \
            chosen or [(ctx.example_inputs, run_isolated(traced, ctx.example_inputs))]
        goal.on = ("held-out calibration batches" if held.batches else
                   "the calibration batch the guard chose with" if chosen else
                   "the example inputs")
        if not held.batches:
            held.warnings.append(NOT_HELD_OUT.format(what=goal.on))
    return held, chosen


def held_out_report(held: HeldOut, ctx: RewriteContext) -> dict[str, Any]:
    """``TorchOptimization``'s fields (the ONNX path's names): batches that chose, held out,
    and how they were used; the metric's value per lossy pass when one was given."""
    given = held.chosen + len(held.batches)
    use = ("none given: the passes are checked on the example inputs" if not given else
           "split: the first half chose (the quantize guard's ranking), the rest checked"
           if held.chosen and held.batches else
           "one batch: the quantize guard chose with it, nothing is held out"
           if held.chosen else
           "all held out: no torch pass chooses from data in this run, every given batch "
           "checks the lossy passes")
    return {"calibration_batches": held.chosen, "held_out_batches": len(held.batches),
            "calibration_use": use,
            **({"metric": held.goal.record()} if held.goal is not None else {})}
