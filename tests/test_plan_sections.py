"""The sections the planner and the decisions fill are typed records (issue 32, part A).

``fusion``, ``memory``, ``quantization``, ``runtime_settings``, ``rewrites`` and ``shape_range``
are read by attribute, written as the report has always written them and read back into equal
records: for plans over a shape range, ONNX plans grouped as ONNX Runtime fuses them, and a
model without parameters.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from torch.export import Dim

import graphopt
from graphopt.ir.plan_memory import MemoryPlan, QuantizationPlan, RuntimeSettings, Setting
from graphopt.ir.plan_sections import (
    FusionKind,
    FusionPlan,
    PaddingSummary,
    PerCallPad,
    PointCost,
    RangePoints,
    RewritesPlan,
    ShapeRangePlan,
)
from graphopt.ir.shape_range import DimRange
from tests import ort_fusion_models as om
from tests.plan_round_trip import round_trip
from tests.zoo import Attention, zoo

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


def test_each_section_is_its_record_read_by_attribute() -> None:
    p = graphopt.plan(*zoo()["odd_residual_cnn"], target="h100")
    assert isinstance(p.fusion, FusionPlan) and isinstance(p.memory, MemoryPlan)
    assert isinstance(p.quantization, QuantizationPlan)
    assert isinstance(p.runtime_settings, RuntimeSettings)
    assert isinstance(p.rewrites, RewritesPlan) and p.shape_range is None
    assert p.runtime_settings.batch_size.value == p.memory.recommended_batch_size == p.memory.batch
    assert p.rewrites.layout.nhwc and p.rewrites.padding.mode == "auto"
    assert {g.kind for g in p.fusion.groups} <= set(FusionKind)
    assert sum(r.bytes for r in p.memory.breakdown) == p.memory.total_bytes
    assert p.quantization.format in {c.format for c in p.quantization.alternatives}
    round_trip(p)


def test_a_plan_over_a_shape_range_reads_back_equal() -> None:
    spec = ({0: Dim("batch", min=1, max=64), 1: Dim("seq", min=4, max=512)},)
    p = graphopt.plan(Attention().eval(), (torch.randn(2, 16, 288),), target="h100",
                      dynamic_shapes=spec)
    rng = p.shape_range
    assert isinstance(rng, ShapeRangePlan) and rng.range.dims == rng.dims
    assert rng.inputs[next(iter(rng.inputs))][:2] == ("batch", "seq")
    assert rng.hints and rng.est_latency_s.min <= rng.est_latency_s.opt
    assert p.to_dict()["shape_range"]["est_latency_s"] == {
        "min": rng.est_latency_s.min, "opt": rng.est_latency_s.opt, "max": rng.est_latency_s.max}
    qkv = p.node("linear")  # each node at min, opt and max; the JSON's range holds min and max
    pts = qkv.at_points
    assert isinstance(pts, RangePoints) and isinstance(pts.min, PointCost)
    assert (pts.min.dims["M"], pts.opt.dims["M"], pts.max.dims["M"]) == (1 * 4, 2 * 16, 64 * 512)
    assert pts.opt == PointCost(dict(qkv.analysis.dims), qkv.cost.est_time_s,
                                qkv.cost.bottleneck, qkv.analysis.flops,
                                qkv.analysis.bytes_total)
    assert pts.min.est_time_s <= pts.opt.est_time_s < pts.max.est_time_s
    assert qkv.to_dict()["range"] == {"min": pts.min.to_json(), "max": pts.max.to_json()}
    assert round_trip(p).node("linear").at_points == pts


@pytest.mark.parametrize("target", ["cpu", "h100"])
def test_an_onnx_plan_with_ort_groups_reads_back_equal(target: str) -> None:
    p = graphopt.plan(om.layer_norm(), target=target)
    (g,) = p.fusion.groups
    assert g.kind is FusionKind.ORT and g.rules and p.fusion.runtime.name == "onnxruntime"
    assert p.to_dict()["fusion"]["groups"][0]["rules"] == list(g.rules)
    assert round_trip(p).fusion.groups[0].rules == g.rules


def test_a_model_without_parameters_has_nothing_to_quantize() -> None:
    class Scale(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(x) * 2

    p = graphopt.plan(Scale(), (torch.randn(4, 8),), target="h100")
    assert p.quantization == QuantizationPlan.nothing_to_quantize(
        "the model has no parameters to quantize")
    assert p.to_dict()["quantization"] == {"format": None, "fits": True,
                                           "reason": "the model has no parameters to quantize"}
    round_trip(p)


def test_json_keys_that_are_no_python_names_and_left_out_defaults() -> None:
    pad = PerCallPad("conv2d", "x", 3, 8)
    assert pad.to_json() == {"node": "conv2d", "source": "x", "from": 3, "to": 8}
    assert PerCallPad.from_json(pad.to_json()) == pad
    skipped = PaddingSummary.not_decided("never", "pad='never'")
    assert skipped.to_json() == {"mode": "never", "reason": "pad='never'"}
    assert DimRange("batch", 1, 2, 8, "example").to_json() == {
        "name": "batch", "min": 1, "opt": 2, "max": 8, "source": "example"}
    named = DimRange("batch", 1, 2, None, "example", "s77")
    assert named.to_json()["symbol"] == "s77" and DimRange.from_json(named.to_json()) == named


def test_a_setting_reads_back_each_kind_of_value() -> None:
    for value in (True, 2160, "high", ("flash", "math"), None):
        s = Setting(value, "why")
        back = Setting.from_json(json.loads(json.dumps(s.to_json())))
        assert back == s and type(back.value) is type(value)
