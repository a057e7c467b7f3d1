"""The Python API: ``graphopt.plan(model, example_inputs, target=...)``."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from graphopt.backends.onnx.padding import padding_view as onnx_view
from graphopt.backends.onnx.session import record_layout
from graphopt.decisions.planner import build_plan
from graphopt.decisions.precision.format import choose_precision, onnx_precision
from graphopt.decisions.rewrites import HostFacts, with_rewrites
from graphopt.files.inputs import input_files
from graphopt.frontends import load_graph
from graphopt.frontends.python_spec import is_python_spec, load_python_spec
from graphopt.hardware.registry import DEFAULT_TARGET, TargetSpec, resolve_targets
from graphopt.ir.graph import Graph
from graphopt.ir.options import Options
from graphopt.ir.plan import Plan, PlanSet
from graphopt.measure.host_cache import host_target
from graphopt.partition import apply_partition, parse_devices, split
from graphopt.partition.result import Partition
from graphopt.partition.strategies import run_strategy
from graphopt.partition.tp_attach import attach_split

__all__ = ["dry_run", "plan", "with_partition"]


def plan(model: Any, example_inputs: Any = None, target: TargetSpec = DEFAULT_TARGET, *,
         devices: str | Sequence[str] | None = None, strategy: str = "heft",
         dynamic_shapes: Any = None) -> Plan | PlanSet:
    """Trace or load ``model`` once and plan it for each target.

    Args:
        model: a ``torch.nn.Module`` (with ``example_inputs``), an ``.onnx`` path, an
            ``onnx.ModelProto``, or ``"file.py:function"`` returning ``(module, inputs)``.
        example_inputs: a tensor, tuple of tensors, or dict of keyword inputs (torch only).
        target: a target name (``graphopt targets`` lists them), a ``HardwareProfile``, or
            several (``"a100,h100,b200"`` or a list): then a :class:`PlanSet` side by side.
        devices: split the model across devices (``"cuda:0=h100,cuda:1=a100:40GB,cpu:8GB"``,
            or those items as a list); each node's ``decisions.device`` and the report's
            ``partition`` section say where it runs. The plan itself is for ``target``.
        strategy: "heft" (list scheduling over the DAG), "pipeline" (contiguous stages),
            "tensor" (tensor parallelism over every device: the ``tensor_parallel`` section
            with the ``parallelize_module`` plan) or "auto" (compares those and, with several
            NVLink groups, tensor parallel per group with pipeline stages across groups; picks
            by latency, the ``strategy`` section keeps every candidate's numbers).
        dynamic_shapes: plan a shape range. For a torch module, torch.export's own argument
            (``torch.export.Dim("batch", min=1, max=64)``, ``Dim.AUTO``, ``Dim.DYNAMIC``): the
            example inputs are the opt point. For ONNX, symbolic dim name -> opt size or
            ``(min, opt, max)``. Each node then records its dims and cost at min, opt and max.
    """
    profiles = resolve_targets(host_target(target))  # "cpu": this host, calibrated and cached
    inputs = tuple(str(f) for f in input_files(model))  # plan.save never overwrites them
    if isinstance(model, (str, os.PathLike)) and is_python_spec(os.fspath(model)):
        # built once here, so the CLI's plan is the API's: the module reaches the strategies
        model, built, dynamic = load_python_spec(os.fspath(model))
        if example_inputs is None:
            example_inputs, dynamic_shapes = built, dynamic_shapes or dynamic
    graph = load_graph(model, example_inputs, dynamic_shapes)
    module = model if hasattr(model, "named_modules") else None  # the emitter's module paths
    plans = tuple(replace(with_partition(dry_run(build_plan(graph, p), graph), devices,
                                         strategy, source=graph, module=module), inputs=inputs)
                  for p in profiles)
    return plans[0] if len(plans) == 1 else PlanSet(plans)


def dry_run(plan_: Plan, graph: Graph, options: Options | None = None) -> Plan:
    """``plan_`` with the padding and layout decisions ``optimize`` would make with ``options``
    (:func:`graphopt.decisions.rewrites.with_rewrites`), asked of the backend that would run
    the model: its compute dtype, its legality and constants, this machine's oneDNN."""
    opts = options or Options()
    if graph.source == "onnx":

        dtype = onnx_precision(plan_.target, opts.precision)[0]
        return with_rewrites(plan_, graph, opts, dtype,
                             lambda ctx: onnx_view(graph.source_model, ctx),
                             record_layout=record_layout)
    import torch

    from graphopt.backends.torch.padding import padding_view as torch_view

    return with_rewrites(plan_, graph, opts, choose_precision(plan_.target, opts.precision)[0],
                         lambda ctx: torch_view(graph, ctx),
                         host=HostFacts(onednn=torch.backends.mkldnn.is_available()))


def with_partition(plan_: Plan, devices: str | Sequence[str] | None, strategy: str = "heft", *,
                   source: Any = None, module: Any = None) -> Plan:
    """``plan_`` with its nodes assigned to ``devices`` (unchanged when devices is None);
    ``source`` (the traced Graph or the module) names the layers of the tensor-parallel plan;
    ``module`` (the user's ``nn.Module``) lets it use sequence parallelism."""
    if not devices:
        return plan_

    ds = parse_devices(devices)
    if strategy in ("heft", "pipeline"):
        return apply_partition(plan_, split(plan_, ds, strategy=strategy))
    win, section = run_strategy(plan_, ds, strategy, source=source, module=module)
    if isinstance(win.result, Partition):
        out = apply_partition(plan_, win.result)
        return replace(out, strategy=section)
    assert win.result is not None
    return attach_split(plan_, win.result, section, source=source, module=module)
