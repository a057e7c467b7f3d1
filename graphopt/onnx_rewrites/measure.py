"""Measured profitability on this machine, for ONNX models: time an auto-decided pass's result
in ONNX Runtime and keep it only when it is not slower (the torch path's ``rewrites.measure``).

Used only when the target is this machine's CPU (target ``"cpu"``): elsewhere a measurement
says nothing about the target. The cost model decides first; the measurement catches where
its constants are wrong for the CPU at hand (dynamic INT8 pays only on large enough GEMMs:
per-call activation quantization is what the roofline under-counts).
"""

from __future__ import annotations

import logging
import time

import numpy as np
import onnx

from graphopt.onnx_rewrites.ort_runner import OrtModel

__all__ = ["faster_or_equal", "time_model"]

logger = logging.getLogger(__name__)

_BUDGET_S = 0.25  # per candidate and round: keeps optimize fast for big models
_MIN_RUNS, _MAX_RUNS = 5, 200
_ROUNDS = 5  # interleaved rounds, so drift from other jobs hits both candidates
#: a change must not be more than this much slower (timer and scheduler noise)
_NOISE = 0.03


def _session(model: onnx.ModelProto, threads: int | None) -> OrtModel:
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    return OrtModel(model, what="a timing candidate", options=options)


def time_model(sess: OrtModel, feeds: dict[str, np.ndarray], budget_s: float = _BUDGET_S
               ) -> float:
    """Best-of-n seconds per call (the minimum is the least noisy estimate on a busy host)."""
    sess.run(feeds)  # warm-up: allocator, prepacked weights, thread pool
    best, spent = float("inf"), 0.0
    for i in range(_MAX_RUNS):
        t = time.perf_counter()
        sess.run(feeds)
        dt = time.perf_counter() - t
        best, spent = min(best, dt), spent + dt
        if i + 1 >= _MIN_RUNS and spent > budget_s:
            break
    return best


def _interleaved(a: OrtModel, b: OrtModel, feeds: dict[str, np.ndarray]) -> tuple[float, float]:
    ta = tb = float("inf")
    for _ in range(_ROUNDS):
        ta = min(ta, time_model(a, feeds))
        tb = min(tb, time_model(b, feeds))
    return ta, tb


def faster_or_equal(before: onnx.ModelProto, after: onnx.ModelProto,
                    feeds: dict[str, np.ndarray], threads: int | None = None
                    ) -> tuple[bool, float, float]:
    """(keep, t_before, t_after): is ``after`` at most ``_NOISE`` slower than ``before``?"""
    tb, ta = _interleaved(_session(before, threads), _session(after, threads), feeds)
    return ta <= tb * (1 + _NOISE), tb, ta
