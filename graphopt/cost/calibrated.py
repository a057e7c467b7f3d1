"""What a profile measured by ``graphopt calibrate`` changes in the roofline.

1. **Fixed cost per node.** On a datasheet profile it is one number per target
   (``launch_overhead_s``: a CUDA launch, a CPU runtime's per-op cost) and a view costs
   nothing (no kernel). A calibrated profile knows each op type's own fixed cost in eager
   torch, views included: dispatching ``view`` or ``transpose`` takes microseconds even
   though no kernel runs. Convolutions are keyed by variant (1x1, depthwise, other), and a
   reshape that copies apart from one that is a view. An op
   type calibration did not time gets the median of its elementwise ops
   (``launch_overhead_s``).
2. **The runtime.** The table is eager torch's; ONNX Runtime's own per-node costs sit beside
   it under ``ort:<OpType>``, and :func:`for_runtime` makes them the table for a plan of an
   ONNX graph; OpenVINO's (where ``openvino`` was installed at calibration) under
   ``ov:<OpType>``, for the deploy choice's OpenVINO estimate, with its fixed cost per call
   (``ov:@call``: a compiled model's inference request pays ~20 us around its nodes).
3. **Achievable rates.** Where the profile measured a rate (``measured_rates``: GEMM and
   conv FLOP/s per dtype, DRAM bytes/s) it replaces datasheet peak x efficiency.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import replace

from graphopt.analysis.kernel_class import KernelClass
from graphopt.analysis.record import NodeAnalysis
from graphopt.hardware.profile import HardwareProfile

__all__ = ["CALL_KEY", "ORT_PREFIX", "OV_PREFIX", "call_cost", "fixed_cost", "for_runtime",
           "measured_bandwidth", "measured_matrix_rate", "runtime_tables", "view_cost"]

#: a calibrated profile's fixed-cost key for an ONNX Runtime op type (``ort:MatMul``); keys
#: without it are eager torch's (``graphopt calibrate`` measures both)
ORT_PREFIX = "ort:"
#: the same for an OpenVINO op type (``ov:MatMul``)
OV_PREFIX = "ov:"
#: runtime -> the prefix of its keys (eager torch's have none)
_PREFIXES = {"onnxruntime": ORT_PREFIX, "openvino": OV_PREFIX}
#: a runtime's fixed cost per call of the whole model, beside its per-op table (``ov:@call``);
#: no op type starts with "@", and no table holds it
CALL_KEY = "@call"


def fixed_cost(a: NodeAnalysis, profile: HardwareProfile) -> float:
    """Seconds a kernel node pays whatever its size."""
    table = profile.op_overhead_s
    measured = table.get(_variant(a), table.get(a.op_type or ""))
    return profile.launch_overhead_s if measured is None else measured


def _variant(a: NodeAnalysis) -> str:
    """The table key of the node's kernel variant: CPU convolutions take different code paths
    (a 1x1 conv is a GEMM; a depthwise conv is one filter per channel), each timed apart as
    ``Conv:1x1`` and ``Conv:depthwise``; a copying reshape is ``Reshape:copy``."""
    if a.op_type == "Reshape" and a.kernel_class is KernelClass.DATA_MOVEMENT:
        return "Reshape:copy"  # a reshape the strides do not allow as a view
    if a.kernel_class is not KernelClass.CONV:
        return a.op_type or ""
    d = a.dims
    groups, c_in = max(1, d.get("groups", 1)), d.get("C_in", 0)
    if groups > 1 and groups == c_in:
        return "Conv:depthwise"
    if c_in and d.get("K", 0) == c_in // groups:
        return "Conv:1x1"
    return a.op_type or ""


def view_cost(a: NodeAnalysis, profile: HardwareProfile) -> float:
    """Seconds a view (no kernel) pays: its dispatch on a calibrated profile, else nothing."""
    if not profile.op_overhead_s:
        return 0.0
    table = profile.op_overhead_s
    return table.get(a.op_type or "", table.get("Reshape", 0.0))


def measured_matrix_rate(a: NodeAnalysis, profile: HardwareProfile, key: str) -> float | None:
    """Measured FLOP/s of a GEMM-like node at peak-table ``key`` (conv has its own), or None."""
    rates = profile.measured_rates
    if a.kernel_class is KernelClass.CONV and f"conv:{key}" in rates \
            and _variant(a) != "Conv:1x1":  # a 1x1 conv runs as a GEMM
        return rates[f"conv:{key}"]
    return rates.get(f"matrix:{key}")


def measured_bandwidth(profile: HardwareProfile) -> float | None:
    """Measured DRAM bytes/s of an elementwise kernel, or None."""
    return profile.measured_rates.get("memory")


def runtime_tables(costs: Mapping[str, float]) -> dict[str, dict[str, float]]:
    """A calibrated profile's fixed costs split by runtime: ``"torch"`` (eager),
    ``"onnxruntime"`` (the ``ort:*`` entries, prefix dropped) and ``"openvino"`` (``ov:*``)."""
    tables: dict[str, dict[str, float]] = {"torch": {}, **{r: {} for r in _PREFIXES}}
    for key, value in costs.items():
        runtime = next((r for r, p in _PREFIXES.items() if key.startswith(p)), "torch")
        op = key[len(_PREFIXES.get(runtime, "")):]
        if op != CALL_KEY:
            tables[runtime][op] = value
    return tables


def call_cost(profile: HardwareProfile, runtime: str) -> float | None:
    """A runtime's measured fixed cost per call of a compiled model (``ov:@call``), or None."""
    return profile.op_overhead_s.get(_PREFIXES.get(runtime, "") + CALL_KEY)


def for_runtime(profile: HardwareProfile, source: str) -> HardwareProfile:
    """``profile`` as the runtime that executes a ``source`` graph sees it: for ``"onnx"``,
    ONNX Runtime's fixed costs (``ort:*``) in place of eager torch's; for ``"openvino"``,
    OpenVINO's (``ov:*``). Profiles without them are returned unchanged."""
    runtime = {"onnx": "onnxruntime", "openvino": "openvino"}.get(source)
    table = runtime_tables(profile.op_overhead_s)[runtime] if runtime else {}
    if not table:
        return profile
    return replace(profile, op_overhead_s=table,
                   launch_overhead_s=statistics.median(table.values()))
