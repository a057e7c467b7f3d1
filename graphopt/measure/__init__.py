"""``graphopt.profile``: the plan's predictions checked against measurements on this machine.

Each plan node gets ``measured_s`` beside its ``cost.est_time_s`` and the summary gets
``prediction`` (``stats``). torch models run under torch.profiler (``torch_runs``), ONNX files
under ONNX Runtime's profiler (``ort_runs``). Only this machine can be measured, so the target
is pinned to its CPU (``"cpu"``) or one of its CUDA GPUs (``"gpu"``, torch models already on
it): a prediction for another chip is not checked by timing this one.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from graphopt.decisions.planner import build_plan
from graphopt.errors import GraphoptError
from graphopt.files.inputs import input_files
from graphopt.frontends import is_onnx_proto, load_graph
from graphopt.frontends.python_spec import is_python_spec, load_python_spec
from graphopt.hardware.detect import detect_gpus, gpu_profile_for
from graphopt.hardware.registry import is_this_machine, resolve_targets
from graphopt.ir.plan import Plan
from graphopt.measure.host_cache import host_target
from graphopt.measure.ort_runs import measure_onnx
from graphopt.measure.stats import Measured, spearman, with_measurements

__all__ = ["Measured", "profile", "spearman"]


def _measured_on(target: Any, threads: int | None) -> tuple[Any, str]:
    """(profile, device): this machine's CPU (``"cpu"``: its cached calibration with
    ``threads``, ``measure.host_cache``), or one of its CUDA GPUs; nothing else can be timed
    here."""
    profiles = resolve_targets(host_target(target, threads=threads))
    if len(profiles) == 1 and is_this_machine(profiles[0]):
        return profiles[0], "cpu"
    if len(profiles) == 1 and profiles[0].kind == "gpu":
        for info in detect_gpus():
            try:
                if gpu_profile_for(info).name == profiles[0].name:
                    return profiles[0], f"cuda:{info.index}"
            except GraphoptError:
                continue
    names = ", ".join(p.name for p in profiles)
    raise GraphoptError(f"profile measures on this machine's CPU (or its own GPU), so it "
                        f"cannot check a plan for {names}", "use target='cpu' (--target "
                        "cpu): this machine's detected CPU; 'gpu' for its CUDA device")


def _is_onnx(model: Any) -> bool:
    """An ONNX model or a path that is not ``file.py:function`` (``load_graph`` says what a
    bad path is)."""
    if is_onnx_proto(model):
        return True
    return isinstance(model, (str, os.PathLike)) and not is_python_spec(os.fspath(model))


def profile(model: Any, example_inputs: Any = None, target: Any = "cpu", *, runs: int = 10,
            warmup: int = 3, threads: int | None = None) -> Plan:
    """Plan ``model`` for this machine's CPU, run it, and put the measurements in the plan.

    Args:
        model: a ``torch.nn.Module`` (with ``example_inputs``), ``"file.py:function"``
            returning ``(module, inputs)``, an ``.onnx`` path or an ``onnx.ModelProto``.
        example_inputs: the inputs to run (torch only; ONNX inputs are generated at the
            plan's sizes).
        target: ``"cpu"`` (or ``"host"``: planned with this host's cached calibration for
            ``threads``, made on first use, ``measure.host_cache``), or a profile of it (used
            as is); on a CUDA machine ``"gpu"`` / ``"cuda:N"`` measures that device's kernels
            (model and inputs already on it).
        runs: profiled runs; each node's ``measured_s`` is its median over them.
        warmup: unprofiled runs first (caches, prepacked weights, thread pools).
        threads: intra-op threads while measuring (None: the runtime's default). On a host
            shared with other jobs, 1 avoids threads waiting on a descheduled peer (stalls of
            a scheduler tick per op); the plan still costs the whole CPU.

    Returns:
        The plan, with ``measured_s`` per measured node and ``summary.prediction``.
    """
    if not (isinstance(runs, int) and isinstance(warmup, int)) or runs < 1 or warmup < 0 \
            or not (threads is None or (isinstance(threads, int) and threads >= 1)):
        raise GraphoptError(f"runs={runs!r}, warmup={warmup!r}, threads={threads!r}: need "
                            "runs >= 1, warmup >= 0, threads None or >= 1",
                            "e.g. runs=10, warmup=3, threads=None")
    host, device = _measured_on(target, threads)
    if _is_onnx(model):
        if device != "cpu":
            raise GraphoptError("profiling an ONNX model measures ONNX Runtime's CPU "
                                "execution provider only", "use target='cpu'")

        graph = load_graph(model)
        measured = measure_onnx(graph, runs=runs, warmup=warmup, threads=threads)
    else:
        module, inputs = _torch_model(model, example_inputs)
        from graphopt.frontends.torch_frontend import _split_inputs
        from graphopt.measure.torch_runs import measure_torch

        graph = load_graph(module, inputs)
        args, kwargs = _split_inputs(module, inputs)
        measured = measure_torch(graph, module, args, kwargs, runs=runs, warmup=warmup,
                                 threads=threads, device=device)
    plan = replace(build_plan(graph, host), inputs=tuple(str(f) for f in input_files(model)))
    busy = _busy_note()
    return with_measurements(plan, replace(measured, notes=(*measured.notes, *busy)))


def _busy_note() -> tuple[str, ...]:
    """A warning when other jobs kept the CPUs busy: a runtime's threads then wait for a
    descheduled peer, a scheduler tick (ms) at a time, and small ops measure far too slow."""
    try:
        load, cpus = os.getloadavg()[0], os.cpu_count() or 1
    except OSError:  # not on every platform
        return ()
    if load <= cpus:
        return ()
    return (f"the host was busy while measuring (load {load:.1f} on {cpus} CPUs): the "
            "measured times include waits for other jobs; measure on an idle machine, or "
            "pass threads=1 (--threads 1)",)


def _torch_model(model: Any, example_inputs: Any) -> tuple[Any, Any]:
    """(module, inputs) from a module or a ``file.py:function`` spec."""
    if isinstance(model, str) and is_python_spec(model):
        module, inputs, _ = load_python_spec(model)
        return module, inputs if example_inputs is None else example_inputs
    import torch

    if not isinstance(model, torch.nn.Module):
        raise GraphoptError(f"cannot profile an object of type {type(model).__name__}",
                            "pass a torch.nn.Module with example inputs, 'file.py:function', "
                            "or an .onnx path")
    if example_inputs is None:
        raise GraphoptError(f"a torch module ({type(model).__name__}) needs example inputs "
                            "to be run", "pass example_inputs=(tensor, ...)")
    return model, example_inputs
