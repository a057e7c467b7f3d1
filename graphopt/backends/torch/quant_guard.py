"""The torch quantize pass's accuracy guard: each lowered Linear's share of the output error,
measured with torch's real kernels on this CPU, and the most sensitive ones kept in float until
the outputs are within the budget.

Measured per lowered node ``n`` on the example inputs (errors are ``max |ref - x| / max |ref|``
over the outputs, the verifier's measure):

- ``local``: the error ``n`` adds by itself: its low-bit kernel on the exact float input,
  against the float Linear (teacher forcing; one float run records every input);
- ``contribution``: the model's output error with only ``n``'s group lowered. The lowered
  nodes in graph order are cut into at most ``GROUPS`` contiguous groups, one run each, and a
  group's error is shared among its nodes in proportion to their local errors (the scheme of
  the ONNX guard, ``backends/onnx/sensitivity.py``); with at most ``GROUPS`` nodes each node is
  measured alone;
- ``share``: its contribution over the sum of all contributions.

Steps:

1. Every node lowered: within the budget, all stay lowered.
2. Else the nodes are ranked by contribution (local error breaks ties) and a bisection finds
   the fewest top-ranked nodes to keep in float for the rest to be within the budget
   (assuming fewer kept never helps more). Keeping all of them: the pass declines.

Runs of the model, each one forward pass of the example: one float run, one with every node
lowered, ``min(N, GROUPS)`` group runs, and ``ceil(log2(N)) + 1`` at most for the bisection.
The ranking is measured on the example inputs; every "within the budget" is checked on every
reference point (the example and the shape range's min and max), as the pipeline checks a pass.
The budget is the loosest of the formats lowered (the driver's, if tighter: a user's
``tolerance``), not of every format the plan named.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import fx
from torch.utils import _pytree as pytree

from graphopt.backends.driver import PassResult
from graphopt.backends.torch.context import RewriteContext
from graphopt.backends.torch.isolation import clone_inputs, preserved_buffers
from graphopt.backends.torch.verify import compare_outputs
from graphopt.decisions.tolerance import Tolerance, loosest, tolerance_for
from graphopt.errors import GraphoptError
from graphopt.files.progress import progress
from graphopt.ir.decision_details import WeightQuantDetail
from graphopt.ir.plan_run import TorchGuard, TorchSensitivity, TorchSensitivityRow

__all__ = ["GROUPS", "guard"]

logger = logging.getLogger(__name__)

#: group runs at most (the ONNX guard's ``GROUPS``: beyond a few groups the ranking is noise)
GROUPS = 8
#: the nodes listed in the report's sensitivity table (each node's numbers are on its decision)
REPORT_TOP = 25


def _switch(gm: fx.GraphModule, forms: dict[str, dict[str, Any]], lowered: set[str]) -> None:
    """Put each node in its low-bit form if named in ``lowered``, else in its float form."""
    by_name = {n.name: n for n in gm.graph.nodes}
    for name, form in forms.items():
        node = by_name[name]
        node.target, node.args, node.kwargs = form["low" if name in lowered else "float"]
    gm.recompile()


def _output_error(gm: fx.GraphModule, args: tuple[Any, ...], reference: Any,
                  tol: Tolerance) -> tuple[float, bool]:
    """(max over the outputs of max abs error / scale, within ``tol``)."""
    with torch.no_grad(), preserved_buffers(gm):
        out = gm(*clone_inputs(args))
    result = compare_outputs(reference, out, tol)
    err = max((c.max_abs / c.scale if c.scale > 0 else (0.0 if c.max_abs == 0 else math.inf))
              if c.same_shape_dtype else math.inf for c in result)
    return err, all(c.within for c in result)


class _Inputs(fx.Interpreter):
    """A float run that also runs each lowered node's kernel on the node's exact input."""

    def __init__(self, gm: fx.GraphModule, forms: dict[str, dict[str, Any]]) -> None:
        super().__init__(gm)
        self.forms = forms
        self.local: dict[str, float] = {}

    def run_node(self, n: fx.Node) -> Any:
        out = super().run_node(n)
        form = self.forms.get(n.name)
        if form is not None:
            target, args, kwargs = form["low"]

            def value(a: fx.Node) -> Any:
                return self.fetch_attr(str(a.target)) if a.op == "get_attr" else self.env[a]

            low = target(*fx.node.map_arg(args, value), **fx.node.map_arg(kwargs, value))
            ref = out.float()
            scale = ref.abs().max().item()
            diff = (low.float() - ref).abs().max().item()
            self.local[n.name] = diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf)
        return out


def _local_errors(gm: fx.GraphModule, forms: dict[str, dict[str, Any]],
                  args: tuple[Any, ...]) -> dict[str, float]:
    _switch(gm, forms, set())
    interp = _Inputs(gm, forms)
    with torch.no_grad(), preserved_buffers(gm):
        interp.run(*clone_inputs(args))
    return interp.local


def _groups(order: Sequence[str]) -> list[list[str]]:
    size = math.ceil(len(order) / min(GROUPS, len(order)))
    return [list(order[i:i + size]) for i in range(0, len(order), size)]


def _contributions(gm: fx.GraphModule, forms: dict[str, dict[str, Any]], order: list[str],
                   local: dict[str, float], args: tuple[Any, ...], reference: Any,
                   tol: Tolerance) -> dict[str, float]:
    out: dict[str, float] = {}
    for group in _groups(order):
        _switch(gm, forms, set(group))
        err, _ = _output_error(gm, args, reference, tol)
        total = sum(local[n] for n in group)
        for n in group:
            out[n] = err * (local[n] / total if total > 0 else 1 / len(group))
    return out


def _budget(ctx: RewriteContext, formats: set[str]) -> Tolerance:
    """The loosest budget of the formats lowered, or the driver's where that is tighter."""
    own = ctx.options.lossy_budget(tolerance_for(loosest(formats)))
    if ctx.tolerance is not None and ctx.tolerance.rel_to_scale < own.rel_to_scale:
        return ctx.tolerance
    return own


def _within_elsewhere(gm: fx.GraphModule, ctx: RewriteContext, tol: Tolerance) -> bool:
    """Within ``tol`` at every reference point but the example (the shape range's ends)."""
    return all(_output_error(gm, args, ref, tol)[1] for args, ref in ctx.references[1:])


def guard(gm: fx.GraphModule, ctx: RewriteContext,
          lowered: dict[str, tuple[Any, dict[str, Any]]]) -> bool | PassResult:
    """Steps 1-2 over ``lowered`` (node -> (its ``Lowering``, its float and low-bit forms));
    leaves ``gm`` with the kept set lowered and records every node's decision and numbers."""
    with progress(f"accuracy guard on {len(lowered)} low-bit Linear layers"):
        return _guard(gm, ctx, lowered)


def _guard(gm: fx.GraphModule, ctx: RewriteContext,
           lowered: dict[str, tuple[Any, dict[str, Any]]]) -> bool | PassResult:
    if not ctx.references:
        raise ValueError("the quantize guard needs the original model's outputs "
                         "(RewriteContext.references)")
    tol = _budget(ctx, {low.fmt for low, _ in lowered.values()})
    args, reference = ctx.references[0]
    forms = {name: form for name, (_, form) in lowered.items()}
    order = [n.name for n in gm.graph.nodes if n.name in forms]
    if not _measurable(reference):
        _switch(gm, forms, set())
        return _unmeasurable(gm, ctx, lowered, order)
    local = _local_errors(gm, forms, args)
    _switch(gm, forms, set(order))
    err, ok = _output_error(gm, args, reference, tol)
    ok = ok and _within_elsewhere(gm, ctx, tol)
    runs = 2
    contribution = _contributions(gm, forms, order, local, args, reference, tol)
    runs += len(_groups(order))
    ranked = sorted(order, key=lambda n: (-contribution[n], -local[n], order.index(n)))
    kept: list[str] = []
    if not ok:
        def within(k: int) -> bool:  # the top ``k`` kept in float, the rest lowered
            nonlocal runs
            runs += 1
            _switch(gm, forms, set(ranked[k:]))
            return _output_error(gm, args, reference, tol)[1] and _within_elsewhere(gm, ctx,
                                                                                   tol)

        lo, hi = 1, len(ranked) - 1
        if hi < lo or not within(hi):
            _switch(gm, forms, set())
            rest = ("" if len(order) == 1 else f" even with all but the least sensitive of the "
                    f"{len(order)} kept in float")
            reason = (f"declined: the outputs leave the {tol.rel_to_scale:g} budget (every "
                      f"low-bit Linear lowered: {err:.3g} of the output scale){rest}")
            _record(ctx, lowered, set(), local, contribution, ranked, runs, declined=reason)
            return PassResult(gm, False, declined=reason)
        while lo < hi:
            mid = (lo + hi) // 2
            if within(mid):
                hi = mid
            else:
                lo = mid + 1
        kept = ranked[:lo]
    on = set(order) - set(kept)
    _switch(gm, forms, on)
    _record(ctx, lowered, on, local, contribution, ranked, runs)
    logger.info("quantize: %d of %d Linear layers lowered, %d kept in float (%d runs)",
                len(on), len(order), len(kept), runs)
    return True


def _measurable(reference: Any) -> bool:
    """Whether the example's outputs hold a floating value to measure an error on."""
    return any(isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() > 0
               for t in pytree.tree_leaves(reference))


def _unmeasurable(gm: fx.GraphModule, ctx: RewriteContext,
                  lowered: dict[str, tuple[Any, dict[str, Any]]], order: list[str]
                  ) -> PassResult:
    """A named format on an example with no values is the user's to fix; ``auto`` declines
    (a format the guard cannot measure is not applied)."""
    shapes = ", ".join(str(tuple(a.shape)) for a in ctx.references[0][0]
                       if isinstance(a, torch.Tensor))
    problem = (f"the example's outputs hold no values to measure the low-bit error on "
               f"(example input shapes {shapes})")
    if ctx.options.quantize != "auto":
        raise GraphoptError(f"quantize={ctx.options.quantize!r}: the accuracy guard measures "
                            f"each lowered layer on the example inputs, and {problem}",
                            "give an example batch with at least one row (the module still "
                            "runs a batch of 0 where its shape range allows it), or "
                            "quantize='none'")
    reason = f"declined: {problem}"
    _record(ctx, lowered, set(), {}, {}, order, 0, declined=reason)
    return PassResult(gm, False, declined=reason)


def _record(ctx: RewriteContext, lowered: dict[str, tuple[Any, dict[str, Any]]], on: set[str],
            local: dict[str, float], contribution: dict[str, float], ranked: list[str],
            runs: int, declined: str | None = None) -> None:
    """Each node's decision with its numbers, and the guard's section for the report."""
    total = sum(v for v in contribution.values() if math.isfinite(v))
    rank = {n: i + 1 for i, n in enumerate(ranked)}
    rows = []
    for name, (low, form) in lowered.items():
        numbers = {"local": local.get(name), "contribution": contribution.get(name),
                   "share": (contribution[name] / total) if name in contribution and total > 0
                   else None}
        said = "" if name not in local else (
            f"; measured: local error {local[name]:.3g}, share of the output error "
            f"{numbers['share']:.1%}" if numbers["share"] is not None else "")
        op = str(form["low"][0]).removesuffix(".default")
        detail = WeightQuantDetail(low.fmt, low.kernel, low.group, numbers["local"],
                                   numbers["contribution"], numbers["share"])
        if name in on:
            ctx.decide(name, detail, f"{low.fmt} ({op}): {low.why}{said}")
        else:
            why = declined or (f"kept in {ctx.compute_dtype}: among the most sensitive "
                               f"(rank {rank.get(name)} of {len(ranked)}); the rest are within "
                               "the budget")
            ctx.decide(name, detail, f"{low.fmt} not applied: {why}{said}", applied=False)
        rows.append({"rank": rank.get(name), "node": name, "format": low.fmt,
                     "local": numbers["local"], "contribution": numbers["contribution"],
                     "share": numbers["share"], "kept": name not in on})
    rows.sort(key=lambda r: r["rank"] or 0)
    top = tuple(TorchSensitivityRow(**_plain(r)) for r in rows[:REPORT_TOP])
    ctx.notes.setdefault("guard", []).append(TorchGuard("quantize", TorchSensitivity(
        len(local), runs, 1 if local else 0, sum(r["kept"] for r in rows), "torch", top),
        declined or None))


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    """JSON-safe numbers (an infinite error as "inf")."""
    return {k: ("inf" if isinstance(v, float) and math.isinf(v) else v) for k, v in row.items()}
