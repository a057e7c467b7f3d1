"""Measure an ONNX model per plan node with ONNX Runtime's own profiler.

Graph optimizations are off, so ORT runs the nodes of the file one for one; the session is
built from the ONNX frontend's copy of the model (``Graph.source_model``), in which every node
carries the name the plan gives it (unnamed nodes named by index, the same on every load). The
trace's ``<node>_kernel_time`` events are summed per node and ``model_run``; the first
``warmup`` runs are dropped. The whole model is timed apart, in a session without profiling.
"""

from __future__ import annotations

import bisect
import json
import logging
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from graphopt.backends.onnx.ort_runner import OrtModel, sample_feeds
from graphopt.errors import GraphoptError
from graphopt.ir.graph import Graph
from graphopt.measure.stats import Measured

__all__ = ["measure_onnx", "node_times_per_run", "profile_options"]

logger = logging.getLogger(__name__)

_SUFFIX = "_kernel_time"


def profile_options(profile_prefix: str | None, threads: int | None) -> Any:
    """Session options as profile and calibrate run ONNX Runtime: graph optimizations off (one
    kernel per node of the file), its profiler on when given a file prefix."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if profile_prefix:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    return options


def node_times_per_run(trace: list[dict[str, Any]], warmup: int) -> list[dict[str, float]]:
    """Per profiled run: node name -> seconds (a node run several times in a run is summed)."""
    runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in trace
                  if e.get("cat") == "Session" and e.get("name") == "model_run")
    starts = [s for s, _ in runs]
    out: list[dict[str, float]] = [defaultdict(float) for _ in runs]
    for e in trace:
        name = str(e.get("name", ""))
        if e.get("cat") != "Node" or not name.endswith(_SUFFIX):
            continue
        i = bisect.bisect_right(starts, e["ts"]) - 1
        if i >= 0 and e["ts"] <= runs[i][1]:
            out[i][name[:-len(_SUFFIX)]] += e["dur"] * 1e-6
    return out[warmup:]


def measure_onnx(graph: Graph, *, runs: int, warmup: int,
                 threads: int | None = None) -> Measured:
    """Per-node medians from ORT's profiler and the whole model's best wall time, on
    ``threads`` intra-op threads (ORT's default, one per physical core, when None)."""
    model = graph.source_model
    if model is None:  # pragma: no cover - the ONNX frontend always sets it
        raise GraphoptError("the ONNX frontend kept no model to run")
    rng = graph.shape_range
    feeds = sample_feeds(model, 1, dims=rng.values("opt") if rng else None)[0]
    with tempfile.TemporaryDirectory() as tmp:
        profiled = OrtModel(model, what="the model (profiled)",
                            options=profile_options(str(Path(tmp) / "ort"), threads))
        for _ in range(warmup + runs):
            profiled.run(feeds)
        trace = json.loads(Path(profiled.session.end_profiling()).read_text())
    per_run = node_times_per_run(trace, warmup)
    names = {k for r in per_run for k in r}
    per_node = {k: statistics.median(r.get(k, 0.0) for r in per_run) for k in names}
    plain = OrtModel(model, what="the model", options=profile_options(None, threads))
    for _ in range(warmup):
        plain.run(feeds)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        plain.run(feeds)
        times.append(time.perf_counter() - t)
    logger.info("profiled %d ONNX nodes over %d runs", len(per_node), len(per_run))
    return Measured(per_node, min(times), len(per_run), warmup,
                    "ONNX Runtime profiler (CPU EP, graph optimizations off), per node "
                    "kernel_time (median of the runs); whole model timed without the profiler "
                    "(best of the runs)", threads)
