"""The plan's ``optimization`` and ``onnx_optimization`` sections as typed records: what a
backend's run applied, reverted and measured (``graphopt.optimize``'s result, ``opt.info``).

Why in ``ir``: the plan holds them, and the plan is ``ir``'s; the torch backend
(``backends/torch/pipeline.py``) and the ONNX backend (``backends/onnx/pipeline.py``) write them,
and ``Optimized.ensure_onnx`` adds the export's fields (:class:`OnnxExport`).

Open on purpose (``Mapping[str, JSONValue]``): ``notes``, each pass's own notes, whose keys
the passes choose (``padding``, ``layout``, ``precision``, ``quantize``, ``measured`` ...);
``session``, the ONNX Runtime session config's own file format
(``decisions.memory_runtime.ort_session.SessionConfig.from_dict`` checks it); and the ONNX
artifact's per-node ``decisions``, each the node's decision JSON (``Decision.to_dict``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from graphopt.ir.plan_sections import FusionPlan
from graphopt.ir.records import JSONValue, Record, keyed, optional
from graphopt.ir.shape_range import ShapeRange

__all__ = ["Fallback", "MetricPass", "MetricReport", "Number", "OnnxExport", "OnnxGuard",
           "OnnxOptimization", "OnnxSensitivity", "OnnxSensitivityRow", "OutputNumerics",
           "PassReverted", "PrecisionChoice", "RangeCheck", "ToleranceBudget", "TorchGuard",
           "TorchOptimization", "TorchSensitivity", "TorchSensitivityRow"]

#: a measured number; the ONNX backend writes a non-finite one as "inf", "-inf" or "nan" (an
#: exact output's SNR is infinite), the guard an overflowing node's local error as "overflow"
Number = float | str


@dataclass(frozen=True, slots=True)
class ToleranceBudget(Record):
    """How far an output may move: max |ref - out| <= rel_to_scale * max |ref|, and a cosine
    floor (``decisions.tolerance.Tolerance``, as the report writes it)."""

    rel_to_scale: float
    min_cosine: float


@dataclass(frozen=True, slots=True)
class OutputNumerics(Record):
    """One output's error against the original model, and the verdict. ``output``: its index
    (torch) or name (ONNX); the ONNX rows add the SNR and the inf/NaN counts."""

    output: int | str
    max_abs: Number
    max_rel: Number
    cosine: Number
    scale: Number
    within: bool
    tolerance: ToleranceBudget
    snr_db: Number | None = optional()
    finite: bool | None = optional()
    nonfinite: int | None = optional()


@dataclass(frozen=True, slots=True)
class PassReverted(Record):
    """A pass the driver undid (``"all"``: the whole run, the model itself handed back)."""

    name: str = keyed("pass")
    reason: str


@dataclass(frozen=True, slots=True)
class PrecisionChoice(Record):
    """The compute dtype asked for, the one chosen for the target, and why."""

    requested: str
    chosen: str
    reason: str


@dataclass(frozen=True, slots=True)
class MetricPass(Record):
    """A lossy pass's value of the user's task metric, over ``batches`` check batches."""

    value: float
    kept: bool
    batches: int


@dataclass(frozen=True, slots=True)
class MetricReport(Record):
    """The user's task metric, its floor, the batches it ran on, and each lossy pass's value
    in the order they were checked (``backends.metric.MetricGoal``)."""

    name: str
    min_metric: float
    on: str
    passes: Mapping[str, MetricPass]


@dataclass(frozen=True, slots=True)
class RangeCheck(Record):
    """The final torch module's numbers at the shape range's min or max (``scaled_down``: at
    smaller sizes than the range's own, which would not fit the check)."""

    point: str
    dims: Mapping[str, int]
    scaled_down: bool
    input_shapes: str
    within: bool
    numerics: tuple[OutputNumerics, ...]


@dataclass(frozen=True, slots=True)
class TorchSensitivityRow(Record):
    """One Linear the torch quantize guard measured: its error alone (``local``), its share
    of the output error, and whether it stayed in float (``kept``)."""

    rank: int | None
    node: str
    format: str
    local: Number | None
    contribution: Number | None
    share: Number | None
    kept: bool


@dataclass(frozen=True, slots=True)
class TorchSensitivity(Record):
    """What the torch quantize guard measured: nodes, runs, and the most sensitive rows."""

    nodes: int
    runs: int
    samples: int
    kept: int
    runner: str
    top: tuple[TorchSensitivityRow, ...]


@dataclass(frozen=True, slots=True)
class TorchGuard(Record):
    """The torch quantize guard's report for one pass; ``declined``: why it lowered nothing."""

    name: str = keyed("pass")
    sensitivity: TorchSensitivity
    declined: str | None = optional()


@dataclass(frozen=True, slots=True)
class OnnxSensitivityRow(Record):
    """One node the ONNX guard measured (``backends.onnx.sensitivity.NodeSensitivity``)."""

    node: str
    local: Number | None
    cumulative: Number | None
    contribution: Number | None
    rank: int
    kept: bool


@dataclass(frozen=True, slots=True)
class OnnxSensitivity(Record):
    """What the ONNX guard measured: sessions and runs it cost, and the most sensitive nodes."""

    nodes: int
    kept: int
    sessions: int
    runs: int
    samples: int
    not_measured: int
    top: tuple[OnnxSensitivityRow, ...]


@dataclass(frozen=True, slots=True)
class Fallback(Record):
    """A node the ONNX guard moved back to higher precision, and why."""

    node: str
    round: int
    how: str
    score: Number | None
    rank: int | None
    reason: str


@dataclass(frozen=True, slots=True)
class OnnxGuard(Record):
    """The ONNX accuracy guard's report for one lossy pass (``backends.onnx.guard``)."""

    name: str = keyed("pass")
    tolerance: ToleranceBudget
    rounds: int
    reverted: bool
    reason: str
    initial: tuple[OutputNumerics, ...]
    final: tuple[OutputNumerics, ...]
    fallbacks: tuple[Fallback, ...]
    sensitivity: OnnxSensitivity


@dataclass(frozen=True, slots=True)
class TorchOptimization(Record):
    """The torch backend's run: the passes applied and reverted, the module's numbers against
    the user's model (and at the shape range's ends), and the batches they were checked on."""

    passes_applied: tuple[str, ...]
    passes_reverted: tuple[PassReverted, ...]
    compute_dtype: str
    notes: Mapping[str, JSONValue]
    tolerance: ToleranceBudget
    numerics: tuple[OutputNumerics, ...]
    calibration_batches: int
    held_out_batches: int
    calibration_use: str
    guard: tuple[TorchGuard, ...] = optional(())
    shape_range: ShapeRange | None = optional()
    range_checks: tuple[RangeCheck, ...] | None = optional()
    metric: MetricReport | None = optional()


@dataclass(frozen=True, slots=True)
class OnnxOptimization(Record):
    """The ONNX backend's run: passes, guard rounds and fallbacks, numbers per output, the
    session settings, the samples checked on and the timings."""

    source: str
    target: str
    passes_applied: tuple[str, ...]
    warnings: tuple[str, ...]
    passes_reverted: tuple[PassReverted, ...]
    compute_dtype: str
    precision_choice: PrecisionChoice
    tolerance: ToleranceBudget
    numerics: tuple[OutputNumerics, ...]
    guard: tuple[OnnxGuard, ...]
    fallbacks: tuple[Fallback, ...]
    session: Mapping[str, JSONValue]
    samples: int
    sample_shapes: tuple[Mapping[str, tuple[int, ...]], ...]
    sample_values: Mapping[str, int]
    calibration_batches: int
    held_out_batches: int
    notes: Mapping[str, JSONValue]
    timings: Mapping[str, float]
    shape_range: ShapeRange | None = optional()
    range_samples: int | None = optional()
    metric: MetricReport | None = optional()


@dataclass(frozen=True, slots=True, kw_only=True)
class OnnxExport(OnnxOptimization):
    """The ONNX artifact of a torch model (the plan's ``onnx_optimization``): the ONNX
    backend's run on the export, how it was exported, and its own decisions and kernels
    (its nodes are the ONNX graph's, not the torch module's)."""

    exporter: str
    export_s: float
    opset: int | None
    #: ONNX node -> {kind: the decision's JSON} for the kinds the passes decide
    decisions: Mapping[str, Mapping[str, Mapping[str, JSONValue]]]
    fusion: FusionPlan | None = optional()

    @classmethod
    def of(cls, run: OnnxOptimization, **export: Any) -> OnnxExport:
        """``run`` with the export's fields (``exporter``, ``export_s``, ``opset``,
        ``decisions``, ``fusion``)."""
        own = {f.name: getattr(run, f.name) for f in dataclasses.fields(OnnxOptimization)}
        return cls(**own, **export)
