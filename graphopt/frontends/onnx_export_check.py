"""What an ONNX export is checked against before graphopt keeps it: the model has no state of
its own to lose, and ONNX Runtime reproduces torch's outputs at the example and at the range's
min and max (:mod:`graphopt.frontends.onnx_export`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import torch

from graphopt.decisions.tolerance import same_nonfinite
from graphopt.errors import GraphoptError, first_line
from graphopt.files.ort_load import in_memory_session
from graphopt.frontends.onnx_export_range import ExportRange
from graphopt.frontends.user_state import run_and_watch

__all__ = ["mismatch_all", "stateless_run"]

#: the export must reproduce torch within this fraction of each output's largest magnitude
#: (fp32 reorders sums at most; verify.py's fp32 budget)
_EXPORT_RTOL = 1e-5


def stateless_run(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
                   ) -> Any:
    """``model``'s outputs, refusing a forward that writes its own tensors (a static KV cache,
    a call counter): an ONNX model has no state, so its export would drop the write."""
    out, written = run_and_watch(model, args, kwargs)
    if written:
        raise GraphoptError(f"{type(model).__name__}.forward writes its own tensors "
                            f"({', '.join(written[:3])}{' ...' if len(written) > 3 else ''}): "
                            "an ONNX model has no state, so the export would drop that write",
                            "deploy the torch artifact (opt.save), which keeps it; or export a "
                            "step that takes the state as inputs and returns the new state")
    return out


def _mismatch(proto: onnx.ModelProto, feeds: dict[str, np.ndarray],
              expected: list[np.ndarray]) -> str | None:
    """Why the exported model does not reproduce torch (None when it does)."""
    import onnxruntime as ort

    try:
        options = ort.SessionOptions()  # no graph rewrites: check the export as written,
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # fast
        options.log_severity_level = 4  # a failed run is a reason returned here, not a log
        sess = in_memory_session(proto, options, ["CPUExecutionProvider"])
        wanted = {i.name for i in sess.get_inputs()}
        got = sess.run(None, {k: v for k, v in feeds.items() if k in wanted})
    except Exception as e:  # ORT raises its own types: fail over, never crash here
        return f"the exported model does not run in ONNX Runtime ({first_line(e)})"
    if len(got) != len(expected):
        return f"the exported model has {len(got)} outputs, torch {len(expected)}"
    for i, (r, o) in enumerate(zip(expected, got, strict=True)):
        if r.shape != np.shape(o):
            return f"output {i} has shape {np.shape(o)}, torch {r.shape}"
        if r.dtype.kind == "f":  # torch's own inf/NaN, matched, count as equal
            o, ok = np.asarray(o), np.isfinite(r)
            if not same_nonfinite(r, o):
                return f"output {i} has inf or NaN where torch's has none or another"
            r, o = r[ok].astype(np.float64), o[ok]
            scale, err = (np.abs(r).max(), np.abs(r - o).max()) if r.size else (0.0, 0.0)
            if not err <= _EXPORT_RTOL * max(scale, 1e-30):
                return f"output {i} differs from torch by {err:.3g} (scale {scale:.3g})"
        elif not np.array_equal(r, o):
            return f"output {i} differs from torch"
    return None


def mismatch_all(proto: onnx.ModelProto, feeds: dict[str, np.ndarray],
                  expected: list[np.ndarray], dyn: ExportRange | None) -> str | None:
    """:func:`_mismatch` at the example, then at the range's min and max."""
    problem = _mismatch(proto, feeds, expected)
    for point_feeds, point_expected in (dyn.checks if dyn and problem is None else ()):
        problem = _mismatch(proto, point_feeds, point_expected)
        if problem is not None:
            shapes = ", ".join(str(a.shape) for a in point_feeds.values())
            return f"at input shapes {shapes}: {problem}"
    return problem
