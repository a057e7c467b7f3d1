"""The plan report end to end: schema, determinism, patterns on real traces, bad input."""

from __future__ import annotations

import json

import onnx
import pytest
import torch

import graphopt
from graphopt.errors import GraphoptError, UnknownTargetError
from graphopt.ir.shape_range import DimRange
from tests.zoo import ConvNet, RMSNormMLP


@pytest.fixture(scope="module")
def convnet_onnx(tmp_path_factory):
    path = tmp_path_factory.mktemp("m") / "convnet.onnx"
    torch.manual_seed(0)
    torch.onnx.export(ConvNet().eval(), (torch.randn(2, 3, 16, 16),), str(path), dynamo=False,
                      opset_version=17)
    return path


def test_report_schema(convnet_onnx):
    d = graphopt.plan(str(convnet_onnx), target="h100").to_dict()
    assert d["schema_version"] == 2
    assert d["target"]["name"] == "h100-sxm"
    assert {"est_latency_s", "bottleneck_mix", "costliest_nodes"} <= set(d["summary"])
    assert d["summary"]["est_latency_s"] == pytest.approx(sum(n["est_time_s"] for n in d["nodes"]))
    for n in d["nodes"]:
        assert {"name", "op", "kernel_class", "dims", "flops", "bytes", "bottleneck",
                "est_time_s", "decisions"} <= set(n)
        assert n["bottleneck"] in ("compute", "memory", "latency")
        assert isinstance(n["dims"], dict) and isinstance(n["decisions"], dict)
    convs = [n for n in d["nodes"] if n["kernel_class"] == "conv"]
    assert len(convs) == 3 and all({"M", "N", "K"} <= set(n["dims"]) for n in convs)


def test_json_is_deterministic_torch_and_onnx(convnet_onnx):
    a = graphopt.plan(str(convnet_onnx), target="a100").to_json()
    b = graphopt.plan(str(convnet_onnx), target="a100").to_json()
    assert a == b
    torch.manual_seed(0)
    m = RMSNormMLP().eval()
    x = torch.randn(2, 8, 64)
    assert graphopt.plan(m, (x,), target="h100").to_json() == \
        graphopt.plan(m, (x,), target="h100").to_json()


def test_rmsnorm_and_swiglu_found_in_trace():
    torch.manual_seed(0)
    p = graphopt.plan(RMSNormMLP().eval(), (torch.randn(2, 8, 64),), target="h100")
    assert p.summary.patterns.get("rmsnorm") == 1
    assert p.summary.patterns.get("swiglu") == 1
    classes = {n.analysis.kernel_class.value for n in p.nodes}
    assert {"rmsnorm", "silu", "gemm"} <= classes


def test_save_writes_all_reports(tmp_path, convnet_onnx):
    p = graphopt.plan(str(convnet_onnx), target="cpu")
    written = p.save(json=str(tmp_path / "a" / "p.json"), md=str(tmp_path / "p.md"),
                     html=str(tmp_path / "p.html"))
    assert len(written) == 3
    assert json.loads((tmp_path / "a" / "p.json").read_text())["target"]["kind"] == "cpu"
    assert "<svg" in (tmp_path / "p.html").read_text()


def test_unknown_target_lists_known_ones(convnet_onnx):
    with pytest.raises(UnknownTargetError) as e:
        graphopt.plan(str(convnet_onnx), target="h1000")
    assert "h100-sxm" in str(e.value) and e.value.fix


def test_unknown_op_is_kept_and_listed():
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 4])
    nodes = [onnx.helper.make_node("Relu", ["x"], ["r"], name="relu"),
             onnx.helper.make_node("Frobnicate", ["r"], ["y"], name="<script>", domain="acme")]
    model = onnx.helper.make_model(
        onnx.helper.make_graph(nodes, "g", [x], [y]),
        opset_imports=[onnx.helper.make_opsetid("", 17), onnx.helper.make_opsetid("acme", 1)])
    p = graphopt.plan(model, target="h100")
    node = p.node("<script>")
    assert node.analysis.kernel_class.value == "other"
    assert p.summary.unsupported_ops == {"acme::Frobnicate": 1}
    assert any("Frobnicate" in w for w in p.warnings)


def test_dynamic_batch_is_planned_at_a_stated_default(tmp_path):
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 64])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 32])
    w = onnx.numpy_helper.from_array(torch.randn(64, 32).numpy(), "w")
    g = onnx.helper.make_graph([onnx.helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
                               "g", [x], [y], [w])
    p = graphopt.plan(onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", 17)]),
                      target="h100")
    # N is planned at the stated default (1, a leading dim), costed at min and max too
    assert p.node("mm").analysis.dims["M"] == 1
    assert p.shape_range.dims == (DimRange("N", 1, 1, None, "default"),)
    assert any("default sizes: N=1" in w for w in p.warnings)
    p = graphopt.plan(onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", 17)]),
                      target="h100", dynamic_shapes={"N": (1, 256, 1 << 20)})
    assert p.node("mm").analysis.dims["M"] == 256
    assert p.node("mm").at_points.max.dims["M"] == 1 << 20
    est = p.shape_range.est_latency_s
    assert est.min <= est.opt < est.max


def test_bad_model_objects_raise_graphopt_errors():
    with pytest.raises(GraphoptError):
        graphopt.plan(42, target="h100")
    with pytest.raises(GraphoptError) as e:
        graphopt.plan(ConvNet(), None, target="h100")
    assert "example inputs" in str(e.value)
