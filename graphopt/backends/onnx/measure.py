"""Measured profitability on this machine, for ONNX models: time an auto-decided pass's result
in ONNX Runtime and keep it only when it is not slower (the torch path's ``rewrites.measure``).

Used only when the target is this machine's CPU (target ``"cpu"``): elsewhere a measurement
says nothing about the target. The cost model decides first; the measurement catches where
its constants are wrong for the CPU at hand (dynamic INT8 pays only on large enough GEMMs:
per-call activation quantization is what the roofline under-counts).

The sessions timed here do not spin (:func:`timing_options`). ORT's intra-op threads spin
after each run by default, waiting for the next; timed by turns, one session's spinning threads
take the cores from the other's next run. On the 2-vCPU EPYC the log speedup of Llama's INT8
export over its float one spread with a standard deviation of 0.53 from one round to the next
(the INT8 pass measured a tie in 1 run of 2, and was reverted), 0.04-0.05 without spinning,
at the same best times (within 4%).
"""

from __future__ import annotations

import numpy as np
import onnx

from graphopt.backends.onnx.ort_runner import OrtModel, quiet_options
from graphopt.backends.timing import Measured, not_slower

__all__ = ["faster_or_equal", "timing_options"]

_BUDGET_S = 0.25  # per candidate and round: keeps optimize fast for big models
_MIN_RUNS = 5
_ROUNDS = 5  # interleaved rounds, so drift from other jobs hits both candidates


def timing_options() -> object:
    """ORT session options for a session timed against another: quiet, and no spinning
    (module doc)."""
    options = quiet_options()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


def _session(model: onnx.ModelProto | OrtModel, threads: int | None) -> OrtModel:
    if isinstance(model, OrtModel):  # a session the caller has (made with timing_options)
        return model
    options = timing_options()
    if threads:
        options.intra_op_num_threads = threads
    return OrtModel(model, what="a timing candidate", options=options)


def faster_or_equal(before: onnx.ModelProto | OrtModel, after: onnx.ModelProto | OrtModel,
                    feeds: dict[str, np.ndarray], threads: int | None = None
                    ) -> Measured:
    """(keep, t_before, t_after) and the speedup's interval: is ``after`` faster than
    ``before`` with confidence (``backends/timing``)? Either may be a session already made
    with :func:`timing_options` (``threads`` applies to the ones made here)."""
    a, b = _session(before, threads), _session(after, threads)
    return not_slower(lambda: a.run(feeds), lambda: b.run(feeds), rounds=_ROUNDS,
                      budget_s=_BUDGET_S, min_runs=_MIN_RUNS)
