"""``graphopt.optimize`` and what it returns: the optimized module, its plan, its exports."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graphopt.api.deploy import choose_deploy, deployed
from graphopt.api.deploy_folder import stage_deploy
from graphopt.backends.metric import MetricGoal, metric_goal
from graphopt.backends.onnx.pipeline import optimize_onnx, save_onnx
from graphopt.decisions.decide import plan_runtime_settings
from graphopt.decisions.memory_runtime.runtime import apply_runtime_settings
from graphopt.errors import GraphoptError
from graphopt.files.inputs import input_files
from graphopt.files.outputs import OutputSet
from graphopt.files.progress import progress
from graphopt.frontends import is_onnx_proto
from graphopt.frontends.onnx_safety import default_opset
from graphopt.frontends.python_spec import (
    is_python_spec,
    load_python_spec,
    names_python_file,
    needs_function_error,
)
from graphopt.frontends.torch_inputs import positional_inputs
from graphopt.hardware.profile import HardwareProfile
from graphopt.hardware.registry import DEFAULT_TARGET
from graphopt.ir.kinds import REWRITE_KINDS
from graphopt.ir.options import Options
from graphopt.ir.plan import Plan
from graphopt.ir.plan_deploy import DeployChoice
from graphopt.ir.plan_run import OnnxExport, OnnxOptimization, TorchOptimization
from graphopt.measure.host_cache import host_target

if TYPE_CHECKING:  # torch is imported only where a torch model is optimized
    import torch

__all__ = ["Optimized", "TorchSource", "optimize"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TorchSource:
    """What optimize ran on for a torch model: :meth:`Optimized.ensure_onnx` exports it
    again, and a save never overwrites the file its class came from."""

    model: Any
    example_inputs: Any
    options: Options
    dynamic_shapes: Any


class Optimized:
    """The result of :func:`optimize`: ``.module``, ``.plan`` and the emitters."""

    def __init__(self, module: torch.nn.Module | None, plan: Plan,
                 example_inputs: tuple[Any, ...], info: TorchOptimization | OnnxOptimization, *,
                 onnx_model: Any = None, torch_source: TorchSource | None = None,
                 onnx_path: str | os.PathLike[str] | None = None, session: Any = None) -> None:
        self.module = module
        self.plan = plan
        self.example_inputs = example_inputs
        #: the backend's run report, the plan's ``optimization`` record (passes applied and
        #: reverted, tolerance, numerics per output, notes)
        self.info = info
        #: the ONNX artifact's run report (:meth:`ensure_onnx`: the plan's ``onnx_optimization``)
        #: for a torch model once exported; None before, and for an ONNX input (see :attr:`info`)
        self.onnx_info: OnnxExport | None = None
        #: the optimized ``onnx.ModelProto`` (ONNX input, or after :meth:`export_onnx`) and its
        #: ONNX Runtime session settings (``decisions.ort_session.SessionConfig``)
        self.onnx_model, self.onnx_session = onnx_model, session
        #: what optimize ran on: the torch model and its inputs (for export_onnx), or the
        #: ONNX input's path (None for an ``onnx.ModelProto``), never both
        self.torch_source, self.onnx_path = torch_source, onnx_path
        #: the shape range the module accepts (``graphopt.ir.shape_range.ShapeRange``), or None
        self.shape_range: Any = None
        #: the model's input names, which key the shape range; kept here for every module,
        #: the plain copy of the model included, so that save() exports over the range
        self.input_names: list[str] = []
        #: which artifact to deploy and why: measured on this machine's CPU, else predicted;
        #: the report's "Deploy" section
        self.deploy: DeployChoice | None = None
        #: artifact -> ``graphopt.api.deploy.Deployed`` built while measuring (reused)
        self.deployed_runners: dict[str, Any] = {}
        #: an ONNX input's options (a torch input's are in :attr:`torch_source`)
        self.onnx_options: Options | None = None

    @property
    def source_model(self) -> Any:
        """The user's torch model (never modified), or None for an ONNX input."""
        return None if self.torch_source is None else self.torch_source.model

    @property
    def source_options(self) -> Any:
        """The ``graphopt.ir.options.Options`` optimize ran with (None only for a result
        built by hand)."""
        return self.onnx_options if self.torch_source is None else self.torch_source.options

    def deployed(self) -> Any:
        """The recommended artifact (:attr:`deploy`), ready to run: a
        ``graphopt.api.deploy.Deployed`` with ``.module`` (torch, torch.compile) or
        ``.session`` (an ONNX Runtime session, or the OpenVINO runner shaped like one); call
        it with the model's inputs."""
        return deployed(self)

    def save_deploy(self, folder: str | os.PathLike[str]) -> list[Path]:
        """Write the recommended artifact into ``folder`` with ``deploy.json`` (the choice and
        how to load it), all or nothing; ``graphopt.load(folder)`` loads it ready to run."""
        with OutputSet(self.input_files) as outputs:  # a failed stage leaves no temp file
            stage_deploy(self, outputs, folder)
            return outputs.commit()

    @property
    def runtime_settings(self) -> Any:
        """The torch runtime settings for running this module on its target (issue 4 rules)."""
        return plan_runtime_settings(self.plan, self.info.compute_dtype,
                                     self.plan.memory)

    def runtime(self) -> contextlib.AbstractContextManager[dict[str, str]]:
        """``with opt.runtime(): ...`` applies :attr:`runtime_settings` and restores the
        previous torch state on exit (also after an exception)."""
        return apply_runtime_settings(self.runtime_settings)

    @property
    def numerics(self) -> list[dict[str, Any]]:
        """Measured error of each output against the original model (and its tolerance), as
        the report writes it."""
        return [n.to_json() for n in self.info.numerics]

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the optimized module to one ``.pt2`` file (torch.export's archive, with the plan,
        runtime settings and shape range inside), whole or not at all; ``graphopt.load(path)``
        reads it back in a process that never saw the model (``graphopt.backends.torch.saved``)."""
        from graphopt.backends.torch.saved import save

        with progress(f"saving {os.fspath(path)}"):
            return save(self, path, protect=self.input_files)

    def save_report(self, json: str | None = None, md: str | None = None,
                    html: str | None = None) -> list[str]:
        """Write the reports (all whole or none), never over :attr:`input_files`; an empty
        path is refused (it would name the current folder), None skips that report."""
        for name, path in (("json", json), ("md", md), ("html", html)):
            if path is not None and not str(path):
                raise GraphoptError(f"the {name} report path is empty",
                                    f"give {name}= a file path, or leave it out")
        return self.plan.save(json=json, md=md, html=html, protect=self.input_files)

    def export_onnx(self, path: str | os.PathLike[str], opset: int | None = None) -> Path:
        """Write the optimized ONNX model, and its session config ``<name>.graphopt.json``
        (load both with ``graphopt.ort_session(path)``); written whole or not at all.

        From a torch model the original is exported once per opset
        (``graphopt.frontends.onnx_export``:
        the fast TorchScript exporter, ``dynamo=True`` with the ``dynamic_shapes`` given to
        optimize if that fails or does not hold at the shape range's min, opt and max in ONNX
        Runtime; ``opset=None`` takes the exporter's own) and graphopt's decisions are
        applied at the ONNX level (``backends.onnx.pipeline``), checked in ONNX Runtime. An ONNX
        input keeps its opset.
        """
        self.ensure_onnx(opset)
        return save_onnx(self.onnx_model, path, self.onnx_session, protect=self.input_files)

    def ensure_onnx(self, opset: int | None = None) -> Any:
        """The optimized ``onnx.ModelProto`` (see :meth:`export_onnx`), exported and optimized
        on first use (once per opset) and kept on :attr:`onnx_model`."""
        if self.torch_source is None:
            have = default_opset(self.onnx_model)
            if opset is not None and opset != have:
                raise GraphoptError(f"the optimized model keeps its input's opset {have}; "
                                    f"opset={opset} was asked for",
                                    "convert the input model first (onnx.version_converter), "
                                    "or leave opset out")
        elif self.onnx_info is None or opset not in (None, self.onnx_info.opset):
            from graphopt.backends.torch.isolation import clone_inputs
            from graphopt.frontends.onnx_export import export_torch

            src = self.torch_source
            model, inputs, opts, dynamic_shapes = (src.model, src.example_inputs, src.options,
                                                   src.dynamic_shapes)
            # exporters run forward on real tensors: never on the user's model or inputs;
            # dynamo=True (the fallback) gets the user's own spec, which torch.export took
            with progress("exporting to ONNX"):
                exported = export_torch(model, clone_inputs(inputs), opset=opset,
                                        shape_range=self.shape_range,
                                        dynamic_shapes=dynamic_shapes)
            done = optimize_onnx(exported.model, self.plan.target, opts,
                                 samples=[exported.feeds], dynamic_shapes=exported.dim_sizes)
            self.onnx_model, self.onnx_session, onnx_plan = done.model, done.session, done.plan
            # the report keeps each artifact's own decisions and numerics: the torch module's
            # under "optimization", the ONNX file's here (its nodes are the ONNX graph's)
            # its kernels are ONNX Runtime's, fused for the target's EP (cost/ort_fusion.py)
            self.onnx_info = OnnxExport.of(
                done.report, exporter=exported.exporter, export_s=exported.seconds,
                opset=default_opset(self.onnx_model), decisions=_rewrite_decisions(onnx_plan),
                fusion=onnx_plan.fusion)
            self.plan = replace(self.plan, onnx_optimization=self.onnx_info)
        return self.onnx_model

    @property
    def input_files(self) -> list[Path]:
        """The files this result was read from (an ONNX model and its external data): no
        export or report may overwrite them."""
        return [] if self.torch_source is not None else input_files(self.onnx_path)


def _rewrite_decisions(plan: Plan) -> dict[str, dict[str, Any]]:
    """ONNX node -> {kind: decision} for the kinds the passes decide, in graph order."""
    return {n.name: {k: n.decisions[k].to_dict() for k in REWRITE_KINDS if k in n.decisions}
            for n in plan.nodes if any(k in n.decisions for k in REWRITE_KINDS)}


def optimize(model: Any, example_inputs: Any = None,
             target: str | HardwareProfile = DEFAULT_TARGET, *,
             kwargs: Mapping[str, Any] | None = None, precision: str = "auto",
             pad: str = "auto", layout: str = "auto", quantize: str = "auto",
             measure: bool | None = None, calibration: Any = None,
             tolerance: float | None = None, dynamic_shapes: Any = None,
             metric: Callable[[Any, Any], float] | None = None,
             min_metric: float | None = None) -> Optimized:
    """Optimize ``model`` for ``target``; its outputs stay equal within the reported tolerance.

    Args:
        model: a ``torch.nn.Module`` in eval mode (never modified), or ``"file.py:function"``
            returning ``(module, example_inputs[, dynamic_shapes])`` as ``plan`` takes it.
        example_inputs: a tensor or tuple of tensors shaped like the batches you will run
            (a dict: keyword inputs).
        target: a target name (``graphopt targets``) or a ``HardwareProfile``.
        kwargs: keyword inputs, as ``torch.export.export`` takes them; they are bound to
            ``forward``'s positions, and the returned module takes them by name too.
        precision: "auto" | "fp32" | "tf32" | "bf16" | "fp16".
        pad: tensor-core padding, "auto" (cost model) | "always" | "never".
        layout: "auto" (cost model) | "channels_last" | "keep".
        quantize: "auto" (the plan's format per node: dynamic INT8 Linear on the host CPU
            where its cost beats float; FP8, INT8 or 4-bit weights on a GPU where the plan
            picks them) | a format for every eligible Linear: "int8" (dynamic), "fp8",
            "int4" (group-wise weight-only), "int8_weight_only" | "none"; ONNX also
            "int8_static" (:mod:`graphopt.ir.options`). The guard keeps the most sensitive
            layers in float until the outputs are within the format's budget.
        measure: time each auto-decided pass and revert it if slower; default: only when the
            target is this machine's CPU ("cpu").
        calibration: real batches for the lossy passes: of two or more, the first half
            chooses (ranges, which nodes stay float) and the rest checks; all check where
            nothing is chosen from data. The stated error is the held-out batches'. A list of
            batches (torch: tuples of tensors, {input: tensor} or one tensor, see
            ``backends.torch.calibration``; ONNX: {input: array}, or an .npz file or folder).
        tolerance: the budget of the lossy passes (precision, quantize), max |ref - out| <=
            tolerance * max |ref| per output; default: each format's own.
        dynamic_shapes: a shape range, torch.export's own argument (``torch.export.Dim`` with
            min/max, ``Dim.AUTO``, ``Dim.DYNAMIC``); the example inputs are the opt point. The
            module then accepts every shape in the range (checked at min, opt and max) and
            raises a GraphoptError outside it. For ONNX: symbolic dim name -> opt size or
            ``(min, opt, max)``.
        metric: a task metric ``metric(reference_outputs, outputs) -> float``, higher is
            better, called per check batch: for a torch module with the outputs as
            ``forward`` returns them (tensors), for ONNX with the list of output arrays (numpy)
            in graph order. Each lossy pass is kept only if the metric's mean over the
            held-out batches (else the batches there are, with a warning) is at least
            ``min_metric``, on top of the output budget ``tolerance``; the report's
            ``optimization.metric`` gives each lossy pass's value. Give both or neither.
        min_metric: the lowest metric value a lossy pass may reach.

    An ``.onnx`` path or ``onnx.ModelProto`` is optimized at the ONNX level (``quantize`` also
    takes "int8_dynamic" | "int8_static" | "fp8" | "int4" there): ``.module`` is None and
    :meth:`Optimized.export_onnx` writes the result.
    """
    if isinstance(model, (str, os.PathLike)) and is_python_spec(os.fspath(model)):
        model, inputs, dynamic = load_python_spec(os.fspath(model))  # as plan() reads it
        if example_inputs is None and not kwargs:
            example_inputs, dynamic_shapes = inputs, dynamic_shapes or dynamic
    elif isinstance(model, (str, os.PathLike)) and names_python_file(os.fspath(model)):
        raise needs_function_error(os.fspath(model))
    goal = metric_goal(metric, min_metric)
    target = host_target(target)  # "cpu": this host, calibrated and cached
    options = Options(precision=precision, pad=pad, layout=layout, quantize=quantize,
                      tolerance=tolerance, measure=measure)
    if _is_onnx(model):
        if example_inputs is not None or kwargs:
            raise GraphoptError("an ONNX model is optimized from its own input shapes: "
                                "example inputs and kwargs are for a torch module",
                                "leave them out; give symbolic dims' sizes with "
                                "dynamic_shapes={'batch': 8}")
        return _optimize_onnx_model(model, target, options, calibration, dynamic_shapes,
                                    goal)
    if kwargs or isinstance(example_inputs, Mapping):
        example_inputs = positional_inputs(model, example_inputs, kwargs)
    from graphopt.frontends.user_state import user_state_guard

    # every run is on private copies; the guard puts back and names anything changed anyway
    with user_state_guard(model, example_inputs, "graphopt.optimize"):
        return _optimize_torch_module(model, example_inputs, target, options, dynamic_shapes,
                                      calibration, goal)


def _is_onnx(model: Any) -> bool:
    """An ``.onnx`` path or an ``onnx.ModelProto``."""
    return isinstance(model, (str, os.PathLike)) or is_onnx_proto(model)


def _optimize_onnx_model(model: Any, target: str | HardwareProfile, options: Any,
                         calibration: Any, dynamic_shapes: Any,
                         goal: MetricGoal | None = None) -> Optimized:
    done = optimize_onnx(model, target, options, calibration, dynamic_shapes=dynamic_shapes,
                         metric=goal)
    result = Optimized(None, done.plan, (), done.report, onnx_model=done.model,
                       session=done.session,
                       onnx_path=model if isinstance(model, (str, os.PathLike)) else None)
    result.onnx_options = options
    # the guard's run (its feeds, the original's outputs, the original model) serves the
    # deploy choice only: not kept on the result
    return _with_deploy(result, done)


def _with_deploy(result: Optimized, onnx_run: Any = None) -> Optimized:
    """The deploy choice (``api/deploy.py``), on the result and in its report."""
    result.deploy = choose_deploy(result, onnx_run)
    result.plan = replace(result.plan, deploy=result.deploy)
    return result


def _optimize_torch_module(model: Any, example_inputs: Any, target: str | HardwareProfile,
                           options: Any, dynamic_shapes: Any, calibration: Any = None,
                           goal: MetricGoal | None = None) -> Optimized:
    import torch
    from torch import fx

    from graphopt.backends.torch.optimized_module import OptimizedModule
    from graphopt.backends.torch.pipeline import optimize_torch

    done = optimize_torch(model, example_inputs, target, options, dynamic_shapes=dynamic_shapes,
                          calibration=calibration, metric=goal)
    args, names = done.example_inputs, list(done.input_names)
    shapes = [tuple(a.shape) if isinstance(a, torch.Tensor) else None for a in args]
    # the pipeline hands back a plain copy of the model when nothing it does pays on this
    # machine: return that copy as is, with no wrapper cost on every call
    module = (OptimizedModule(done.module, shapes, done.runtime_flags,
                              shape_range=done.shape_range, input_names=names)
              if isinstance(done.module, fx.GraphModule) else done.module)
    result = Optimized(module, done.plan, args, done.report,
                       torch_source=TorchSource(model, example_inputs, options,
                                                dynamic_shapes))
    result.shape_range, result.input_names = done.shape_range, names
    # the report shows the settings for the precision actually applied, not the planner's guess
    result.plan = replace(done.plan, runtime_settings=result.runtime_settings)
    return _with_deploy(result)
