"""Which artifact :func:`graphopt.optimize` recommends, measured on this machine's CPU, and the
artifact ready to run (:class:`Deployed`).

On the host CPU with ``measure`` on, the candidates are built and timed interleaved
(:mod:`graphopt.measure.deploy_runs`, within its time budget) beside the user's own model:
the torch module (under its runtime settings), an ONNX Runtime session of the optimized ONNX
export (in its session config), OpenVINO compiling that same ONNX model (``backends/openvino``;
bf16 where the CPU computes it natively, checked at bf16's budget then; without ``openvino``
installed its row says so and names the fix), and ``torch.compile`` of the module, built only
where a probe of the others says it could win (``api/compile_reach``: it compiles for seconds
to minutes). An ONNX input has two candidates, its optimized model in ONNX Runtime and in
OpenVINO, timed beside the original file. Each candidate's outputs are compared with the
original model's first; the choice itself is
:func:`graphopt.decisions.deploy.artifact.pick_measured`'s. Elsewhere the choice is predicted
(:func:`graphopt.decisions.deploy.artifact.predict_deploy`) and says so.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from graphopt.api.compile_reach import compile_out_of_reach
from graphopt.backends.driver import measure_here
from graphopt.backends.onnx.numerics import compare
from graphopt.backends.onnx.ort_runner import OrtModel, quiet_options
from graphopt.backends.onnx.session import session_settings
from graphopt.backends.openvino.config import CompileConfig
from graphopt.backends.openvino.runner import OpenVinoModel, cpu_capabilities, openvino_version
from graphopt.decisions.deploy.artifact import (
    ARTIFACTS,
    Artifact,
    ArtifactTiming,
    DeployChoice,
    pick_measured,
    predict_deploy,
    unsettled,
)
from graphopt.decisions.deploy.openvino import inference_precision, reduced_budget
from graphopt.decisions.tolerance import Tolerance
from graphopt.errors import GraphoptError, first_line
from graphopt.files.progress import progress
from graphopt.hardware.registry import is_this_machine
from graphopt.ir.plan_run import ToleranceBudget
from graphopt.measure.deploy_runs import MAX_TIMING_S, ORIGINAL, settled_rounds

__all__ = ["NO_DEPLOY_MEASURE_ENV", "Deployed", "choose_deploy", "deployed", "relaxed"]

logger = logging.getLogger(__name__)

#: set to 1 to predict the deploy choice instead of measuring it (the test suite: compiling and
#: exporting every model it optimizes for ``cpu`` would take many minutes)
NO_DEPLOY_MEASURE_ENV = "GRAPHOPT_NO_DEPLOY_MEASURE"
#: a compiler's or exporter's own float reordering: at least this much of an output's scale is
#: allowed whatever the artifact's own budget (fp32 rewrites are checked at 1e-5 of scale)
_REORDER_REL = 1e-4


class Deployed:
    """The recommended artifact, ready to run: ``module`` (torch, torch.compile) or ``session``
    (an ``onnxruntime.InferenceSession``, or the OpenVINO artifact's
    :class:`~graphopt.backends.openvino.runner.OpenVinoModel`, shaped like one). Calling it
    runs either on torch tensors; a session also on numpy arrays, and then returns numpy
    arrays."""

    def __init__(self, artifact: str, module: Any = None, session: Any = None,
                 input_names: list[str] | None = None) -> None:
        self.artifact, self.module, self.session = artifact, module, session
        self._names = list(input_names or [])

    def feeds(self, *inputs: Any) -> dict[str, np.ndarray]:
        """{session input name: numpy array} for the positional inputs (torch tensors or numpy
        arrays only, in the model's order, as the ONNX export named them)."""
        if self.session is None:
            raise GraphoptError(f"the deployed artifact is {self.artifact}, not an ONNX Runtime "
                                "session", "call it with torch tensors instead")
        wanted = [i.name for i in self.session.get_inputs()]
        tensors = [a for a in inputs if hasattr(a, "detach") or isinstance(a, np.ndarray)]
        named = dict(zip(self._names, inputs, strict=False)) if self._names else {}
        if all(n in named for n in wanted):
            return {n: _numpy(named[n]) for n in wanted}
        if len(tensors) != len(wanted):
            raise GraphoptError(f"the session takes {len(wanted)} input(s) ({', '.join(wanted)})"
                                f", {len(tensors)} tensor(s) were given",
                                "pass the model's inputs as it was optimized with")
        return {n: _numpy(t) for n, t in zip(wanted, tensors, strict=True)}

    def __call__(self, *inputs: Any) -> Any:
        if self.session is None:
            import torch

            with torch.inference_mode():
                return self.module(*inputs)
        outs = self.session.run(None, self.feeds(*inputs))
        if not (inputs and all(isinstance(a, np.ndarray) for a in inputs)):
            import torch

            outs = [torch.from_numpy(o) for o in outs]
        return outs[0] if len(outs) == 1 else tuple(outs)


def _numpy(value: Any) -> np.ndarray:
    return value if isinstance(value, np.ndarray) else value.detach().cpu().numpy()


def choose_deploy(opt: Any, onnx_run: Any = None) -> DeployChoice:
    """Measured on this machine's CPU when ``measure`` is on, else predicted (module doc);
    ``onnx_run``: an ONNX input's ``OnnxResult`` (the guard's feeds, the original's outputs on
    them, the original model), which its measurement checks and times on."""
    target = opt.plan.target
    torch_model = opt.module is not None
    options = opt.source_options
    why = None
    if not torch_model and onnx_run is None:
        why = "an ONNX model given as a plan result: nothing to compare its session with"
    elif not is_this_machine(target):
        why = (f"the target ({target.display_name}) is not this machine's CPU: a timing here "
               "says nothing about it")
    elif options is not None and not measure_here(options, target):
        why = "measure=False"
    elif os.environ.get(NO_DEPLOY_MEASURE_ENV, "") not in ("", "0"):
        why = f"{NO_DEPLOY_MEASURE_ENV} is set"
    if why is not None:
        return predict_deploy(opt.plan, torch_model=torch_model, not_measured=why)
    return _measure(opt) if torch_model else _measure_onnx(opt, onnx_run)


def relaxed(tol: ToleranceBudget) -> Tolerance:
    """``tol`` with at least a compiler's or exporter's own float reordering allowed."""
    return Tolerance(max(float(tol.rel_to_scale), _REORDER_REL),
                     min(float(tol.min_cosine), 0.9999))


def _check(reference: Any, outputs: Any, tol: Tolerance) -> tuple[bool, str]:
    """(within, the worst output's numbers) of ``outputs`` against the original's."""
    import torch
    from torch.utils import _pytree as pytree

    from graphopt.backends.torch.verify import compare_outputs

    ref = [t for t in pytree.tree_leaves(reference) if isinstance(t, torch.Tensor)]
    out = [t for t in pytree.tree_leaves(outputs) if isinstance(t, torch.Tensor)]
    return _verdict(compare_outputs(ref, out, tol))


def _verdict(errors: Sequence[Any]) -> tuple[bool, str]:
    """(every output within, the worst one's numbers) of per-output comparisons (torch's
    ``verify`` or ONNX's ``numerics``: both give ``within``, ``max_abs``, ``scale``)."""
    worst = max(errors, key=lambda e: e.max_abs / max(e.scale, 1e-30))
    return all(e.within for e in errors), worst.describe()


def _measure(opt: Any) -> DeployChoice:
    """Case 2 of ``decisions/deploy/artifact.py``: build, check and time every candidate;
    torch.compile (the slowest to build) only where a probe says it could win."""
    import torch

    from graphopt.backends.torch.isolation import clone_inputs, private_copy, run_isolated

    model, inputs = opt.source_model, opt.example_inputs
    reference = run_isolated(model, inputs)
    args = clone_inputs(inputs)
    calls: dict[str, Callable[[], Any]] = {"torch": lambda: opt.module(*args)}
    if not _is_the_model(opt):  # else the torch candidate's times are the original's
        shadow = private_copy(model)  # timing runs forward many times: never the user's model
        calls = {ORIGINAL: lambda: shadow(*args), **calls}
    rows = {Artifact.TORCH: ArtifactTiming(
        Artifact.TORCH, None, all(n.within for n in opt.info.numerics),
        note="the optimized module, under its runtime settings (checked by optimize)")}
    runners = {"torch": Deployed("torch", opt.module)}

    def check(runner: Deployed, tol: Tolerance) -> tuple[bool, str]:
        return _check(reference, runner(*args), tol)

    def call_of(runner: Deployed) -> Callable[[], Any]:
        return _call(runner, args)

    with opt.runtime():
        for artifact, build in ((Artifact.ONNXRUNTIME, _session), (Artifact.OPENVINO, _openvino)):
            _candidate(artifact, lambda b=build: b(opt, args), check, rows, runners, calls,
                       call_of)
        with torch.inference_mode():
            why_not = compile_out_of_reach(opt, calls, args)
        if why_not:
            rows[Artifact.TORCH_COMPILE] = ArtifactTiming(Artifact.TORCH_COMPILE, None, None,
                                                          error=why_not)
        else:
            _candidate(Artifact.TORCH_COMPILE, lambda: _compiled(opt, args), check, rows,
                       runners, calls, call_of)
        with torch.inference_mode():
            return _timed_choice(opt, calls, rows, runners, "",
                                 f", torch {torch.get_num_threads()} thread(s)")


def _is_the_model(opt: Any) -> bool:
    """The torch artifact is a plain copy of the user's model (nothing graphopt did paid)."""
    return any(r.name == "all" for r in opt.info.passes_reverted)


def _timed_choice(opt: Any, calls: dict[str, Callable[[], Any]],
                  rows: dict[str, ArtifactTiming], runners: dict[str, Deployed], against: str,
                  tail: str) -> DeployChoice:
    """Time the checked candidates (``measure/deploy_runs``), keep their runners, and pick."""
    with progress(f"timing {len(calls) - 1} candidate(s)"):
        settled = settled_rounds(calls, {a: rows[a] for a in ARTIFACTS if a in rows})
    opt.deployed_runners = runners
    method = (f"{settled.rounds} interleaved rounds in {settled.seconds:.1f} s on "
              f"{opt.plan.target.display_name}{against} (best of each, paired: a 95% interval "
              f"per choice){tail}")
    if unsettled(settled.rows):
        method += ("; the machine is too busy to separate the candidates in "
                   f"{settled.rounds} rounds ({MAX_TIMING_S:g} s at most): the simpler "
                   "artifact stays")
    original_s = settled.original_s if ORIGINAL in calls else \
        min(settled.per_round["torch"])  # the torch artifact is the model itself
    return pick_measured(settled.rows, method, original_s)


def _candidate(artifact: str, build: Callable[[], tuple[Deployed, str, Tolerance]],
               check: Callable[[Deployed, Tolerance], tuple[bool, str]],
               rows: dict[str, ArtifactTiming], runners: dict[str, Deployed],
               calls: dict[str, Callable[[], Any]],
               call_of: Callable[[Deployed], Callable[[], Any]]) -> None:
    """Build one candidate and check its outputs: its row says how it went; a candidate
    within tolerance joins the timed calls."""
    try:
        with progress(f"building the {artifact} candidate"):
            runner, note, tol = build()
            within, numbers = check(runner, tol)
    except GraphoptError as e:
        rows[artifact] = ArtifactTiming(artifact, None, None, error=e.problem[:300])
        return
    except Exception as e:  # a compiler or runtime failure: reported, never a crash
        rows[artifact] = ArtifactTiming(artifact, None, None, error=first_line(e)[:300])
        return
    rows[artifact] = ArtifactTiming(artifact, None, within, note=f"{note}; {numbers}")
    if within:
        runners[artifact] = runner
        calls[artifact] = call_of(runner)


def _measure_onnx(opt: Any, run: Any) -> DeployChoice:
    """Case 2 for an ONNX input: its optimized model in ONNX Runtime (the guard checked it)
    against OpenVINO compiling that model, checked on the guard's inputs against the original's
    outputs, both timed beside the original file in a default ONNX Runtime session."""
    feeds, reference = list(run.feeds), [list(r) for r in run.reference]
    names = [o.name for o in run.original.graph.output]
    info = opt.info
    rows = {Artifact.ONNXRUNTIME: ArtifactTiming(
        Artifact.ONNXRUNTIME, None, all(n.within for n in info.numerics),
        note="the optimized ONNX model in its session config (checked by optimize)")}
    runners = {Artifact.ONNXRUNTIME: _ort_runner(opt)}
    original = OrtModel(run.original, what="the original model", options=quiet_options())
    first = feeds[0]
    calls: dict[str, Callable[[], Any]] = {
        ORIGINAL: lambda: original.session.run(None, first),
        Artifact.ONNXRUNTIME: _call(runners[Artifact.ONNXRUNTIME], (), first)}

    def check(runner: Deployed, tol: Tolerance) -> tuple[bool, str]:
        got = [runner.session.run(None, f) for f in feeds]
        return _verdict(compare(reference, got, names, tol))

    # both runtimes are timed on the first of the guard's inputs
    _candidate(Artifact.OPENVINO, lambda: _openvino(opt, ()), check, rows, runners, calls,
               lambda runner: _call(runner, (), first))
    return _timed_choice(opt, calls, rows, runners, " against the original model in a default "
                         "ONNX Runtime session", ", on the first of the guard's inputs")


def _call(runner: Deployed, args: tuple[Any, ...],
          feeds: dict[str, np.ndarray] | None = None) -> Callable[[], Any]:
    if runner.session is None:
        return lambda: runner.module(*args)
    if feeds is None:
        feeds = runner.feeds(*args)  # made once: a deployed session is fed numpy arrays
    session, fed = runner.session, feeds
    return lambda: session.run(None, fed)


def _compiled(opt: Any, args: tuple[Any, ...]) -> tuple[Deployed, str, Tolerance]:
    """torch.compile of the module, in the plan's compile mode, compiled before any timing."""
    import torch

    compiled, mode = _compile(opt)
    start = time.perf_counter()
    with torch.inference_mode():
        compiled(*args)
    return (Deployed("torch.compile", compiled),
            f"mode {mode}, compiled in {time.perf_counter() - start:.1f} s",
            relaxed(opt.info.tolerance))


def _compile(opt: Any) -> tuple[Any, str]:
    """(``torch.compile`` of the module in the plan's compile mode, that mode); compiles lazily,
    at its first call."""
    import torch

    mode = opt.runtime_settings.compile_mode.value
    return torch.compile(opt.module, mode=None if mode == "default" else mode), mode


def _session(opt: Any, args: tuple[Any, ...]) -> tuple[Deployed, str, Tolerance]:
    """An ORT session of the optimized ONNX export, in its session config."""
    start = time.perf_counter()
    runner = _ort_runner(opt)
    onnx_info = _checked_onnx(opt)
    applied = ", ".join(onnx_info.passes_applied) or "none"
    return (runner, f"exported and optimized in {time.perf_counter() - start:.1f} s "
                    f"(passes: {applied})", relaxed(onnx_info.tolerance))


def _checked_onnx(opt: Any) -> Any:
    """The ONNX artifact's run record, once its guard kept it within tolerance."""
    onnx_info = opt.onnx_info or opt.info  # an ONNX input's run report is its info
    if not all(n.within for n in onnx_info.numerics):
        raise GraphoptError("the optimized ONNX model left its tolerance in the accuracy guard "
                            "(the report's ONNX optimization section says where)")
    return onnx_info


def _openvino(opt: Any, args: tuple[Any, ...]) -> tuple[Deployed, str, Tolerance]:
    """OpenVINO compiling the same optimized ONNX model; at bf16 inference precision it is
    checked at bf16's budget (``decisions/deploy/openvino``), and the note says so."""
    opt.ensure_onnx()  # the export is the ONNX Runtime candidate's: timed there, not here
    start = time.perf_counter()
    runner = _ov_runner(opt)
    onnx_info = _checked_onnx(opt)
    model = runner.session
    tol = relaxed(onnx_info.tolerance)
    note = (f"OpenVINO {openvino_version()} on the optimized ONNX model, {model.precision} "
            f"inference precision, compiled in {time.perf_counter() - start:.2f} s")
    if model.precision == "bf16":
        tol = reduced_budget(tol, opt.source_options)
        note += (f"; checked at bf16's budget ({tol.rel_to_scale:g} of scale, cosine >= "
                 f"{tol.min_cosine:g})")
    return runner, note, tol


def _ov_runner(opt: Any) -> Deployed:
    """The optimized ONNX model compiled by OpenVINO at the precision this CPU and the run's
    ``precision`` option allow (GraphoptError naming the fix without ``openvino``)."""
    model = opt.ensure_onnx()
    options = opt.source_options
    precision, why = inference_precision(cpu_capabilities(),
                                         None if options is None else options.precision)
    compiled = OpenVinoModel(model, CompileConfig(precision, reason=why))
    return Deployed("openvino", session=compiled, input_names=opt.input_names)


def _ort_runner(opt: Any) -> Deployed:
    model = opt.ensure_onnx()
    options, providers = session_settings(opt.onnx_session)
    session = OrtModel(model, providers, "the optimized ONNX model", options).session
    return Deployed("onnxruntime", session=session, input_names=opt.input_names)


def deployed(opt: Any) -> Deployed:
    """The recommended artifact, ready to run (built now if the choice was predicted)."""
    artifact = opt.deploy.artifact
    if artifact not in opt.deployed_runners:  # built once, like the measured ones
        opt.deployed_runners[artifact] = (
            Deployed("torch", opt.module) if artifact == "torch" else
            Deployed("torch.compile", _compile(opt)[0]) if artifact == "torch.compile" else
            _ov_runner(opt) if artifact == "openvino" else _ort_runner(opt))
    return opt.deployed_runners[artifact]
