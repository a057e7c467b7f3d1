"""Per-op fixed costs in OpenVINO's CPU plugin, for the deploy choice's OpenVINO estimate.

The deploy choice predicts each runtime from the plan with that runtime's fixed cost per node
(``decisions/deploy/artifact.py``, case 3); OpenVINO's is its own (a compiled graph of JIT
kernels: 1-5 us a node here, like ONNX Runtime's). Calibration compiles ONNX Runtime's bench
model (``calibrate_ort.bench_model``: a few independent copies of each common op on small
inputs) with OpenVINO's per-node counters on (``PERF_COUNT``) and takes each op type's median
node time over the runs. A node OpenVINO keeps but never runs (a reshape done in place) costs
0; one it folds away is not timed, and the op type takes the table's median. Beside them,
``ov:@call``: what one call of a compiled model costs around its nodes (feeding the request,
waking its threads, copying the outputs out; ~20 us here against ONNX Runtime's few), timed on
a one-node model through the deployed artifact's own call path. Without ``openvino`` installed
the table is empty and the OpenVINO estimate says it was not made.

The host calibration (``measure.host_cache``) adds them (:func:`with_openvino_costs`) and
records which OpenVINO it timed, so installing or upgrading it remakes the calibration.
``graphopt calibrate -o FILE.json`` (``graphopt.calibrate``) adds them the same way.
"""

from __future__ import annotations

import logging
import statistics
from collections import defaultdict
from dataclasses import replace
from importlib import metadata
from typing import Any

import numpy as np
from onnx import TensorProto, helper

from graphopt.backends.openvino.config import CompileConfig
from graphopt.backends.openvino.runner import OpenVinoModel, openvino_module
from graphopt.cost.calibrated import CALL_KEY, OV_PREFIX
from graphopt.errors import GraphoptError
from graphopt.hardware.profile import HardwareProfile
from graphopt.measure.calibrate_ort import bench_model
from graphopt.measure.calibrate_rates import time_call

__all__ = ["ov_fixed_costs", "openvino_installed", "with_openvino_costs"]

logger = logging.getLogger(__name__)


def openvino_installed() -> str | None:
    """The installed ``openvino``'s version (read without importing it), or None."""
    try:
        return metadata.version("openvino")
    except metadata.PackageNotFoundError:
        return None


def with_openvino_costs(profile: HardwareProfile, threads: int | None, *, rounds: int = 60
                        ) -> HardwareProfile:
    """A calibrated ``profile`` with OpenVINO's fixed costs added (unchanged without it)."""
    costs = ov_fixed_costs(rounds=rounds, threads=threads)
    if not costs:
        return profile
    return replace(profile, op_overhead_s={**profile.op_overhead_s, **costs},
                   source=f"{profile.source}; OpenVINO {openvino_installed()}'s per-node cost "
                          "of each op type (ov:*, its PERF_COUNT) and per call (ov:@call)")


def ov_fixed_costs(rounds: int = 60, warmup: int = 5, threads: int | None = None
                   ) -> dict[str, float]:
    """``ov:<OpType>`` -> median seconds of one node in OpenVINO (f32, ``threads`` threads),
    and ``ov:@call``; {} when ``openvino`` is not installed or fails on the bench (logged)."""
    try:
        costs = _node_costs(rounds, warmup, threads)
        call = _call_cost(threads) - costs.get("Relu", 0.0)
    except GraphoptError as e:
        logger.info("no OpenVINO fixed costs: %s", e.problem)
        return {}
    except Exception as e:  # an OpenVINO failure: the estimate is left out, never a crash
        logger.warning("no OpenVINO fixed costs: OpenVINO failed on the bench model: %s",
                       " ".join(str(e).split())[:200])
        return {}
    return {OV_PREFIX + op: v for op, v in sorted({**costs, CALL_KEY: max(call, 0.0)}.items())}


def _node_costs(rounds: int, warmup: int, threads: int | None) -> dict[str, float]:
    """op type -> median seconds of its nodes, from OpenVINO's per-node counters."""
    ov = openvino_module()
    model, feeds = bench_model()
    core = ov.Core()
    request = core.compile_model(core.read_model(model.SerializeToString()), "CPU",
                                 {**_properties(threads), "PERF_COUNT": True}
                                 ).create_infer_request()
    names = {n.name: n.name.rpartition("_")[0] for n in model.graph.node}
    samples: dict[str, list[float]] = defaultdict(list)
    kept: set[str] = set()
    for run in range(warmup + rounds):
        request.infer(feeds)
        if run < warmup:
            continue
        for info in request.profiling_info:
            op = names.get(info.node_name)
            if op is None:  # a layout reorder or a node OpenVINO made: no node of ours
                continue
            kept.add(op)
            if info.status == info.Status.EXECUTED:
                samples[op].append(info.real_time.total_seconds())
    return {op: statistics.median(samples[op]) if samples[op] else 0.0 for op in kept}


def _properties(threads: int | None) -> dict[str, Any]:
    props: dict[str, Any] = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"}
    if threads:
        props["INFERENCE_NUM_THREADS"] = threads
    return props


def _call_cost(threads: int | None) -> float:
    """Seconds of one call of a one-Relu model (1 x 64) through :class:`OpenVinoModel` (the
    deployed artifact's path), its node included: the best loop, as a fixed cost is a floor
    that a neighbour's work only ever raises."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "call", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = min(model.ir_version, 9)
    compiled = OpenVinoModel(model, CompileConfig("f32", threads), "the call-cost bench")
    feeds = {"x": np.ones((1, 64), np.float32)}
    return time_call(lambda: compiled.run(None, feeds), budget_s=0.01, repeats=5,
                     best=True)
