"""Measured profitability on this machine, for ONNX models: time an auto-decided pass's result
in ONNX Runtime and keep it only when it is not slower (the torch path's ``rewrites.measure``).

Used only when the target is this machine's CPU (target ``"cpu"``): elsewhere a measurement
says nothing about the target. The cost model decides first; the measurement catches where
its constants are wrong for the CPU at hand (dynamic INT8 pays only on large enough GEMMs:
per-call activation quantization is what the roofline under-counts).
"""

from __future__ import annotations

import numpy as np
import onnx

from graphopt.backends.onnx.ort_runner import OrtModel
from graphopt.backends.timing import Measured, not_slower

__all__ = ["faster_or_equal"]

_BUDGET_S = 0.25  # per candidate and round: keeps optimize fast for big models
_MIN_RUNS = 5
_ROUNDS = 5  # interleaved rounds, so drift from other jobs hits both candidates


def _session(model: onnx.ModelProto | OrtModel, threads: int | None) -> OrtModel:
    import onnxruntime as ort

    if isinstance(model, OrtModel):  # a session the caller has (default options)
        return model
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    return OrtModel(model, what="a timing candidate", options=options)


def faster_or_equal(before: onnx.ModelProto | OrtModel, after: onnx.ModelProto | OrtModel,
                    feeds: dict[str, np.ndarray], threads: int | None = None
                    ) -> Measured:
    """(keep, t_before, t_after) and the speedup's interval: is ``after`` faster than
    ``before`` with confidence (``backends/timing``)? Either may be a session already made
    with ORT's default options (``threads`` applies to the ones made here)."""
    a, b = _session(before, threads), _session(after, threads)
    return not_slower(lambda: a.run(feeds), lambda: b.run(feeds), rounds=_ROUNDS,
                      budget_s=_BUDGET_S, min_runs=_MIN_RUNS)
