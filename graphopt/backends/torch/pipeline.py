"""``graphopt.optimize``: trace, plan, rewrite pass by pass, verify numbers, report.

Each pass rewrites a private copy of the traced module. The loop is
:func:`graphopt.backends.driver.run_passes`; this module is its torch backend: after each pass the
candidate is run on the example inputs and compared with the user's model, and a pass whose
result leaves the tolerance of its precision is reverted, and the report says so. The user's
model is never touched: it is traced, run and timed as private copies of every tensor it
reaches (:mod:`.isolation`), and the copy's tensors are cloned before any pass runs.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import fx

from graphopt.backends.driver import Pass, PassResult, ToleranceKind, measure_here, run_passes
from graphopt.backends.metric import MetricGoal
from graphopt.backends.timing import Measured
from graphopt.backends.torch.calibration import HeldOut, held_out, held_out_report
from graphopt.backends.torch.cleanup import fold_batchnorm_and_drop_dropout
from graphopt.backends.torch.context import RewriteContext
from graphopt.backends.torch.isolation import (
    clone_inputs,
    preserved_buffers,
    private_copy,
    run_isolated,
)
from graphopt.backends.torch.layout import channels_last
from graphopt.backends.torch.measure import faster_or_equal
from graphopt.backends.torch.padding import pad_channels
from graphopt.backends.torch.precision import reduce_precision
from graphopt.backends.torch.quantize import dynamic_int8, dynamic_int8_without_ends
from graphopt.backends.torch.result import TorchResult
from graphopt.backends.torch.strip import strip_unused
from graphopt.backends.torch.verify import compare_batches, compare_outputs
from graphopt.backends.torch.weight_quant import (
    host_dynamic_int8,
    low_bit_linears,
    quantize_tolerance,
)
from graphopt.decisions.memory_runtime.memory import memory_plan
from graphopt.decisions.planner import build_plan
from graphopt.decisions.precision.format import choose_precision
from graphopt.decisions.quant_formats import int4_bits_per_weight
from graphopt.decisions.rewrites import HostFacts, decide_run_layout
from graphopt.decisions.tolerance import Tolerance, tolerance_for
from graphopt.errors import GraphoptError
from graphopt.frontends.range_inputs import range_points
from graphopt.frontends.torch_frontend import trace_torch
from graphopt.frontends.torch_inputs import without_cache
from graphopt.hardware import get_target
from graphopt.hardware.profile import HardwareProfile
from graphopt.ir.decision_details import FoldDetail, WeightQuantDetail
from graphopt.ir.options import Options
from graphopt.ir.plan import Plan, mark_reverted
from graphopt.ir.plan_memory import MemoryPlan
from graphopt.ir.plan_run import PassReverted, RangeCheck, TorchGuard, TorchOptimization

__all__ = ["NOTHING_APPLIED", "decide_run", "default_passes", "optimize_torch", "prepare",
           "strip_unused"]

logger = logging.getLogger(__name__)


def _as_args(example_inputs: Any) -> tuple[Any, ...]:
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)
    if isinstance(example_inputs, (list, tuple)):
        return tuple(example_inputs)
    raise GraphoptError("optimize needs example inputs as a tensor or a tuple of tensors",
                        "pass example_inputs=(tensor, ...) shaped like a real batch")


def prepare(model: torch.nn.Module, example_inputs: Any, target: str | HardwareProfile,
            options: Options | None = None, dynamic_shapes: Any = None
            ) -> tuple[fx.GraphModule, RewriteContext]:
    """Trace ``model`` (over the shape range ``dynamic_shapes`` gives, torch.export's argument),
    plan it, and return a private rewritable copy plus the pass context."""
    if not isinstance(model, torch.nn.Module):
        raise GraphoptError(f"optimize takes a torch.nn.Module, got {type(model).__name__}",
                            "pass a torch.nn.Module with example inputs, or an .onnx path or "
                            "onnx.ModelProto (optimized at the ONNX level)")
    meta = next((n for n, t in (*model.named_parameters(), *model.named_buffers())
                 if t.is_meta), None)
    if meta is not None:
        raise GraphoptError(f"{type(model).__name__} has weights on the meta device (e.g. "
                            f"{meta}): optimize runs the model to check every rewrite, so it "
                            "needs real weights",
                            "load the weights (e.g. model.to_empty(device='cpu') and "
                            "load_state_dict), or use graphopt.plan, which takes meta models")
    if model.training:
        raise GraphoptError(f"{type(model).__name__} is in training mode: graphopt optimizes "
                            "for inference (BatchNorm folding, no dropout)",
                            "call model.eval() before graphopt.optimize")
    options = (options or Options()).check_backend("torch")
    args = clone_inputs(_as_args(example_inputs))  # passes and checks never see the user's
    profile = target if isinstance(target, HardwareProfile) else get_target(target)
    graph = trace_torch(model, args, dynamic_shapes=dynamic_shapes)
    ep = graph.source_model
    if not isinstance(ep, torch.export.ExportedProgram):
        cause = getattr(ep, "meta", {}).get("export_error")  # torch's reason, first
        raise GraphoptError(f"{type(model).__name__} could not be captured by torch.export"
                            + (f": {cause}" if cause else "") + "; it was only traced by make_fx,"
                            " whose graph cannot be re-run like the module",
                            "make forward() exportable (see the plan's warnings) to optimize it")
    plan = build_plan(graph, profile)
    gm = private_copy(ep.module())  # cloned tensors: passes may never alias the user's
    ctx = RewriteContext(plan=plan, target=profile, options=options,
                         example_inputs=args, shape_range=graph.shape_range)
    ctx.input_names = list(ep.graph_signature.user_inputs)
    ctx.range_points = range_points(args, ctx.input_names, graph.shape_range)
    decide_run(ctx)
    return gm, ctx


def decide_run(ctx: RewriteContext, compute_dtype: str | None = None) -> None:
    """The decisions made once per run, before any pass: the compute dtype (the user's
    precision on the target, or ``compute_dtype`` given), then the layout at that dtype, with
    this machine's oneDNN as the host fact."""
    if compute_dtype is None:
        ctx.compute_dtype, why = choose_precision(ctx.target, ctx.options.precision)
        ctx.notes["precision_choice"] = {"requested": ctx.options.precision,
                                         "chosen": ctx.compute_dtype, "reason": why}
    else:
        ctx.compute_dtype = compute_dtype
    ctx.layout = decide_run_layout(ctx.plan, ctx.options, ctx.compute_dtype,
                                   HostFacts(onednn=torch.backends.mkldnn.is_available()))


def quantize(gm: fx.GraphModule, ctx: RewriteContext) -> bool | PassResult[fx.GraphModule]:
    """The quantize pass: the host CPU's dynamic INT8, or the plan's (or the named) low-bit
    format per Linear, guarded node by node (:mod:`.weight_quant`)."""
    return dynamic_int8(gm, ctx) if host_dynamic_int8(ctx) else low_bit_linears(gm, ctx)


def _quantize_without_ends(gm: fx.GraphModule, ctx: RewriteContext) -> bool:
    """The host INT8 pass's second try (the low-bit pass's guard chooses its own set)."""
    return host_dynamic_int8(ctx) and dynamic_int8_without_ends(gm, ctx)


def _quantize_budget(ctx: RewriteContext) -> str:
    return "int8" if host_dynamic_int8(ctx) else quantize_tolerance(ctx)


def default_passes() -> list[Pass]:
    """Cleanup, padding, layout (exact), then precision and quantize (lossy, verified)."""
    return [Pass("cleanup", fold_batchnorm_and_drop_dropout),
            Pass("padding", pad_channels, option="pad"),
            Pass("layout", channels_last, option="layout"),
            Pass("precision", reduce_precision, ToleranceKind.COMPUTE, option="precision"),
            Pass("quantize", quantize, _quantize_budget, option="quantize"),
            Pass("quantize_without_ends", _quantize_without_ends, "int8",
                 option="quantize")]


def _run(gm: torch.nn.Module, args: tuple[Any, ...]) -> Any:
    """Run graphopt's own module; it keeps the state it had (a buffer written by forward)."""
    with torch.no_grad(), preserved_buffers(gm):
        return gm(*clone_inputs(args))


@dataclass
class _TorchBackend:
    """The driver's torch backend: passes edit a private fx copy in place; checks run it on
    clones of the example inputs (and at the shape range's min and max: ``ctx.references``),
    timings at opt."""

    ctx: RewriteContext
    #: the calibration batches held out, and the metric goal (:mod:`.calibration`)
    held: HeldOut = field(default_factory=HeldOut)

    def snapshot(self, gm: fx.GraphModule) -> fx.GraphModule:
        # the parameters are shared, not copied (a copy per pass was 0.15-0.25 s on
        # ResNet-50): a pass registers new tensors (fx_utils.new_param) and never writes
        # one it found in place (tests/test_optimize_steps_once.py)
        return private_copy(gm, share_parameters=True)

    def apply(self, p: Pass, gm: fx.GraphModule, tol: Tolerance) -> PassResult[fx.GraphModule]:
        self.ctx.tolerance = tol
        done = p.run(gm, self.ctx)
        if isinstance(done, PassResult):  # a pass that checked itself (the quantize guard)
            if done.declined is not None or not done.modified:
                return done
        elif not done:
            return PassResult(gm, False)
        gm.graph.lint()
        gm.recompile()
        return PassResult(gm, True)

    def check(self, p: Pass, gm: fx.GraphModule, tol: Tolerance) -> str | None:
        for i, (args, reference) in enumerate(self.ctx.references):
            at = "" if i == 0 else f" at {_shapes(args)}"
            try:
                result = compare_outputs(reference, _run(gm, args), tol)
            except Exception as e:  # a pass produced a graph that does not run: revert it
                logger.warning("pass %s produced a module that fails%s: %s", p.name, at, e)
                return f"reverted, outputs out of tolerance: fails to run{at}"
            if not all(c.within for c in result):
                return (f"reverted, outputs out of tolerance{at}: "
                        + "; ".join(c.describe() for c in result if not c.within))
        return self.held.problem(lambda args: _run(gm, args), tol, p.name) if p.lossy else None

    def time(self, before: fx.GraphModule, after: fx.GraphModule) -> Measured:
        with preserved_buffers(before, after):
            return faster_or_equal(before, after, clone_inputs(self.ctx.example_inputs))


def optimize_torch(model: torch.nn.Module, example_inputs: Any,
                   target: str | HardwareProfile = "h100",
                   options: Options | None = None,
                   passes: Sequence[Pass] | None = None, *, dynamic_shapes: Any = None,
                   calibration: Any = None, metric: MetricGoal | None = None,
                   ) -> TorchResult:
    """Run the passes with a numeric check after each; returns the module, the plan with its
    decisions and the run report.

    The module is the rewritten graph, or, on the host CPU when even the rewritten graph
    measures slower than the user's model (tiny models where no rewrite pays), a copy of
    the model itself: never slower on the target it was optimized for. ``calibration``:
    real batches (:mod:`.calibration`) the lossy passes are chosen and checked on;
    ``metric``: the task metric they must keep (``graphopt.backends.metric``).
    """
    gm, ctx = prepare(model, example_inputs, target, options, dynamic_shapes)
    traced = without_cache(model, {})[0]  # as trace_torch ran it: no KV cache among outputs
    reference = run_isolated(traced, ctx.example_inputs)
    references = [(ctx.example_inputs, reference)] + [
        (args, run_isolated(traced, args)) for _, _, args in ctx.range_points]
    held, chosen = held_out(traced, ctx, calibration, metric)
    ctx.references = chosen + references  # the guard ranks on the first
    measure = measure_here(ctx.options, ctx.target)
    passes = default_passes() if passes is None else passes
    done = run_passes(_TorchBackend(ctx, held), gm, passes, measure=measure)
    gm, applied, reverted, final_tol = done.model, done.applied, done.reverted, done.tolerance
    # a pass the user forced (quantize="int8"...) is theirs: never timed away, alone or whole
    forced = [p.name for p in passes if p.name in applied and p.option is not None
              and getattr(ctx.options, p.option) != "auto"]
    portable = strip_unused(gm)
    if any(portable.values()):
        ctx.notes["portable"] = portable
    module: torch.nn.Module = gm
    fallback = None
    if measure and not forced:  # nothing that can change the speed: nothing to time
        fallback = _slower_than_original(model, gm, ctx) if _may_be_faster(applied, ctx) \
            else NOTHING_APPLIED
    if fallback is not None:  # nothing graphopt does pays here: hand back the model itself
        module = private_copy(model)
        reverted.append(PassReverted("all", fallback))
        ctx.decisions = mark_reverted({}, ctx.decisions, fallback)
        applied, final_tol = [], tolerance_for("fp32")
    final = compare_batches(held.reference, [_run(module, a) for a in held.batches],
                            final_tol) if held.batches else \
        compare_outputs(reference, _run(module, ctx.example_inputs), final_tol)
    guard = _guard_notes(ctx.notes.pop("guard", []), applied, reverted)
    info = TorchOptimization(
        tuple(applied), tuple(reverted), ctx.compute_dtype, dict(ctx.notes), final_tol.budget(),
        tuple(c.record() for c in final), guard=guard,
        **_range_checks(module, ctx, references[1:], final_tol), **held_out_report(held, ctx))
    plan = ctx.plan.with_decisions(ctx.decisions)
    memory = (_artifact_memory(plan, ctx.compute_dtype) if fallback is None
              else memory_plan(plan))  # the model itself: its own dtypes
    plan = replace(plan, optimization=info, memory=memory,
                   warnings=(*plan.warnings, *held.warnings))
    flags = ctx.notes.get("precision", {}).get("runtime", {})
    return TorchResult(module, plan, info, tuple(ctx.example_inputs), ctx.shape_range,
                       tuple(ctx.input_names), dict(flags))


def _guard_notes(guard: list[TorchGuard], applied: list[str],
                 reverted: list[PassReverted]) -> tuple[TorchGuard, ...]:
    """The guard's section as the module is: a pass the driver reverted after its guard kept
    some layers lowered (a timing, a later check) lowered none of them."""
    return tuple(_reverted_guard(g, reverted) if g.name not in applied and not g.declined
                 else g for g in guard)


def _reverted_guard(entry: TorchGuard, reverted: list[PassReverted]) -> TorchGuard:
    why = next((r.reason for r in reverted if r.name == entry.name), "reverted")
    sens = entry.sensitivity
    return replace(entry, declined=f"the pass was reverted after the guard: {why}",
                   sensitivity=replace(sens, kept=sens.nodes,
                                       top=tuple(replace(r, kept=True) for r in sens.top)))


def _artifact_memory(plan: Plan, compute_dtype: str) -> MemoryPlan:
    """The memory plan of what the module carries: each weight GEMM at the format the
    quantize pass applied (INT4 at its group's bits, scales and zeros in the activations'
    dtype), the other weights at the compute dtype
    (the plan's own section assumed its formats, some of which a pass may not apply)."""
    formats: dict[str, str | float] = {}
    for n in plan.nodes:
        if not any(t is not None and t.kind in ("param", "constant") for t in n.inputs):
            continue
        q = n.decisions.get("quantize")
        fmt = q.detail.format if q is not None and q.applied else None
        group = q.detail.group if q is not None and isinstance(q.detail, WeightQuantDetail) \
            else None
        scale_bits = 32 if compute_dtype == "fp32" else 16
        formats[n.name] = (int4_bits_per_weight(int(group), scale_bits)
                           if fmt == "int4" and group else str(fmt) if fmt else compute_dtype)
    return memory_plan(plan, formats)


def _shapes(args: tuple[Any, ...]) -> str:
    return ", ".join(str(tuple(a.shape)) for a in args if isinstance(a, torch.Tensor))


def _range_checks(module: torch.nn.Module, ctx: RewriteContext,
                  references: list[tuple[tuple[Any, ...], Any]], tol: Tolerance
                  ) -> dict[str, Any]:
    """The final module's numbers at the range's min and max: ``TorchOptimization``'s
    ``shape_range`` and ``range_checks``, none without a range."""
    if not ctx.shape_range:
        return {}
    checks = []
    for (point, values, _), (args, reference) in zip(ctx.range_points, references,
                                                     strict=True):
        result = compare_outputs(reference, _run(module, args), tol)
        dims = {d.name: values[d.name] for d in ctx.shape_range.dims}
        own = {d.name: d.at(point) for d in ctx.shape_range.dims}
        checks.append(RangeCheck(point, dims, dims != own, _shapes(args),
                                 all(c.within for c in result),
                                 tuple(c.record() for c in result)))
    return {"shape_range": ctx.shape_range, "range_checks": tuple(checks)}


#: why the host gets the model itself when no pass changed its compute (the traced graph is
#: not timed: issue 34, item 3, the timing was 4.5 s of GPT-2's optimize)
NOTHING_APPLIED = ("no pass changed the model's compute on this machine (at most eval-mode "
                   "dropouts, identities, were dropped): returning the original model, the "
                   "simpler (nothing to time)")


def _may_be_faster(applied: list[str], ctx: RewriteContext) -> bool:
    """A pass changed what the model computes: any but the cleanup, or the cleanup folding a
    BatchNorm (dropping an eval dropout removes an identity)."""
    return any(p != "cleanup" for p in applied) or any(
        d.applied for per_node in ctx.decisions.values()
        for kind, d in per_node.items() if kind == FoldDetail.KIND)


def _slower_than_original(model: torch.nn.Module, gm: fx.GraphModule,
                          ctx: RewriteContext) -> str | None:
    shadow = private_copy(model)  # timing runs forward many times: never on the user's model
    with preserved_buffers(gm):
        result = faster_or_equal(shadow, gm, clone_inputs(ctx.example_inputs))
    del shadow
    keep, t_model, t_graph = result
    ctx.notes.setdefault("measured", {})["whole_model"] = {
        "original_s": t_model, "optimized_s": t_graph, "kept": keep,
        **({"verdict": result.verdict, "speedup_low": result.low, "speedup_high": result.high}
           if isinstance(result, Measured) else {})}
    if keep:
        return None
    said = f"{t_graph * 1e3:.3g} ms vs {t_model * 1e3:.3g} ms"
    if isinstance(result, Measured) and result.verdict == "tie":
        return (f"the optimized graph is a tie with the original on this machine ({said}; "
                f"speedup {result.interval()}): returning the original model, the simpler")
    return (f"the optimized graph measured slower than the original on this machine "
            f"({said}): returning the original model")
