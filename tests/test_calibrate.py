"""graphopt calibrate: a measured host profile that --target reads (issue 12, item 6).

Nothing here asserts how fast this machine is. The checks are that calibration measures
every op type it lists, that the profile file round-trips and refuses bad files with the fix,
and that the roofline uses the measured numbers (fixed cost per op type, views included,
GEMM/conv rates, bandwidth) exactly where a calibrated profile has them.
"""

from __future__ import annotations

import importlib.util
import json
import math
from dataclasses import replace

import pytest
import torch
from torch import nn

import graphopt
from graphopt.cli.main import main
from graphopt.hardware import get_target, is_this_machine
from graphopt.hardware.detect import host_cpu_profile
from graphopt.hardware.profile_file import FORMAT, load_profile, save_profile
from graphopt.measure.calibrate import OP_BENCHES, VIEW_OPS


def _measured(**changes) -> graphopt.hardware.HardwareProfile:
    """The host profile with made-up measurements: numbers chosen to be told apart."""
    host = host_cpu_profile()
    model = host.display_name.split(" (host")[0]
    values = dict(display_name=f"{model} (host, calibrated)", launch_overhead_s=7e-6,
                  op_overhead_s={"Add": 3e-6, "Linear": 20e-6, "Reshape": 1.5e-6,
                                 "Transpose": 2.5e-6, "Conv": 90e-6},
                  measured_rates={"matrix:fp32": 50e9, "conv:fp32": 25e9, "memory": 10e9})
    return replace(host, **{**values, **changes})


class _Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 64)
        self.conv = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x: torch.Tensor, img: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = self.fc(x).transpose(0, 1) + 1.0
        return torch.sigmoid(y), self.conv(img)


def _plan(profile):
    torch.manual_seed(0)
    return graphopt.plan(_Small().eval(), (torch.randn(8, 64), torch.randn(1, 4, 8, 8)),
                         target=profile)


def test_a_calibrated_profile_round_trips_through_its_file(tmp_path):
    path = tmp_path / "host.json"
    for profile in (_measured(), get_target("h100")):
        save_profile(profile, path)
        assert json.loads(path.read_text())["format"] == FORMAT
        assert load_profile(path).to_dict() == profile.to_dict()
    assert get_target(str(path)).to_dict() == get_target("h100").to_dict()
    assert "op_overhead_s" not in get_target("h100").to_dict()  # datasheet JSON unchanged


@pytest.mark.parametrize("text, says", [
    ("{not json", "cannot read"),
    ('{"format": "something-else/1"}', "not a graphopt hardware profile"),
    ('[1, 2]', "not a graphopt hardware profile"),
    (None, "malformed: missing field"),
    ("negative", "must be finite and >= 0"),
])
def test_a_bad_profile_file_is_refused_with_the_fix(tmp_path, text, says):
    path = tmp_path / "host.json"
    good = {"format": FORMAT, **_measured().to_dict()}
    if text is None:
        del good["bandwidth_bytes_per_s"]
        text = json.dumps(good)
    elif text == "negative":
        good["op_overhead_s"]["Add"] = -1.0
        text = json.dumps(good)
    path.write_text(text)
    with pytest.raises(graphopt.GraphoptError) as e:
        get_target(str(path))
    assert says in str(e.value) and "graphopt calibrate" in e.value.fix


def test_a_missing_profile_file_names_the_path(tmp_path):
    with pytest.raises(graphopt.GraphoptError, match="does not exist"):
        graphopt.plan(_Small(), (torch.randn(8, 64), torch.randn(1, 4, 8, 8)),
                      target=str(tmp_path / "nope.json"))


def test_the_roofline_uses_the_measured_numbers_where_they_exist():
    profile = _measured()
    plan, datasheet = _plan(profile), _plan(host_cpu_profile())
    by_op = {n.op_type: n for n in plan.nodes}
    # fixed cost per op type; a view pays its own dispatch; an op type never timed pays
    # the profile's launch overhead
    assert by_op["Linear"].cost.overhead_s == 20e-6
    assert by_op["Transpose"].cost.est_time_s == by_op["Transpose"].cost.overhead_s == 2.5e-6
    assert by_op["Add"].cost.overhead_s == 3e-6
    assert by_op["Sigmoid"].cost.overhead_s == 7e-6
    # GEMM at the measured matrix rate, conv at the measured conv rate, memory at the
    # measured bandwidth (no efficiency factor on a measured number)
    fc, conv = by_op["Linear"], by_op["Conv"]
    assert fc.cost.compute_time_s == pytest.approx(fc.analysis.flops / 50e9)
    assert conv.cost.compute_time_s == pytest.approx(conv.analysis.flops / 25e9)
    assert by_op["Add"].cost.memory_time_s == pytest.approx(
        by_op["Add"].analysis.bytes_total / 10e9)
    # the uncalibrated host: views free, one launch overhead, datasheet rates
    d = {n.op_type: n for n in datasheet.nodes}
    assert d["Transpose"].cost.est_time_s == 0.0
    assert d["Linear"].cost.overhead_s == d["Add"].cost.overhead_s \
        == host_cpu_profile().launch_overhead_s
    assert d["Linear"].cost.compute_time_s != pytest.approx(fc.cost.compute_time_s)


def test_a_gemm_without_a_native_matrix_dtype_uses_the_measured_fp32_rate():
    caps = frozenset(c for c in host_cpu_profile().capabilities
                     if "bf16" not in c and "fp16" not in c)
    # no bf16 on this made-up CPU, whatever this host has (AMX-BF16, AVX512-BF16)
    profile = _measured(peak_flops={"fp32": 128e9}, vector_flops={}, capabilities=caps)
    e = graphopt.cost.estimate_op("gemm", dtype="bf16", target=profile, M=512, N=512, K=512)
    assert e.time_s == pytest.approx(2 * 512**3 / 50e9 + 20e-6, rel=0.05)
    assert "measured by calibrate" in e.reason


def test_a_calibration_of_another_cpu_is_not_this_machine():
    assert is_this_machine(_measured())
    assert not is_this_machine(_measured(display_name="Some Other CPU (host, calibrated)"))
    with pytest.raises(graphopt.GraphoptError, match="cannot check a plan"):
        graphopt.profile(_Small(), (torch.randn(8, 64), torch.randn(1, 4, 8, 8)),
                         target=_measured(display_name="Other (host, calibrated)"), runs=1)


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    path = tmp_path_factory.mktemp("cal") / "host.json"
    return graphopt.calibrate(path, quick=True, threads=1), path


def test_calibrate_measures_every_op_type_it_lists(calibrated):
    profile, path = calibrated
    ort = {k for k in profile.op_overhead_s if k.startswith("ort:")}
    ov = {k for k in profile.op_overhead_s if k.startswith("ov:")}
    assert set(profile.op_overhead_s) - ort - ov == set(OP_BENCHES)
    assert {"ort:Add", "ort:MatMul", "ort:Conv", "ort:Reshape"} <= ort
    # OpenVINO's where it is installed; a node it keeps but never runs (a reshape in place)
    # costs 0 there
    assert bool(ov) == (importlib.util.find_spec("openvino") is not None)
    assert all(v > 0 and math.isfinite(v) for k, v in profile.op_overhead_s.items()
               if k not in ov)
    assert all(v >= 0 and math.isfinite(v) for k, v in profile.op_overhead_s.items() if k in ov)
    assert {"matrix:fp32", "conv:fp32", "memory"} <= set(profile.measured_rates)
    if hasattr(torch.ops.quantized, "linear_dynamic"):  # the INT8 kernel graphopt emits
        assert profile.measured_rates["matrix:int8"] > 0
    assert profile.bandwidth_bytes_per_s == profile.measured_rates["memory"]
    assert "1 intra-op thread" in profile.source and "in-model factors" in profile.source
    assert VIEW_OPS <= set(OP_BENCHES)
    assert load_profile(path).to_dict() == profile.to_dict()
    assert is_this_machine(profile) and profile.calibrated


def test_a_calibrated_target_is_profiled_and_predicts_both_numbers(calibrated):
    _, path = calibrated
    torch.manual_seed(0)
    model, x = _Small().eval(), (torch.randn(8, 64), torch.randn(1, 4, 8, 8))
    plan = graphopt.profile(model, x, target=str(path), runs=3, warmup=1, threads=1)
    pred = plan.summary.prediction
    assert plan.target.calibrated
    assert pred.module_ratio == pytest.approx(plan.summary.est_latency_s
                                                 / pred.measured_module_s)
    assert pred.model_ratio == pytest.approx(plan.summary.est_latency_s
                                                / pred.measured_model_s)
    views = [n for n in plan.nodes if n.analysis.kernel_class.value == "view"]
    assert views and all(n.cost.est_time_s > 0 for n in views)


def test_cli_calibrate_checks_the_path_before_measuring(tmp_path, capsys):
    assert main(["calibrate", "-o", str(tmp_path / "host.txt")]) == 2
    assert "does not end in .json" in capsys.readouterr().err
    folder = tmp_path / "dir.json"
    folder.mkdir()
    assert main(["calibrate", "-o", str(folder)]) == 2
    assert list(folder.iterdir()) == []


def test_cli_calibrate_writes_a_profile_the_cli_plans_with(tmp_path, capsys):
    path = tmp_path / "host.json"
    assert main(["calibrate", "-o", str(path), "--quick", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert f"--target {path}" in out and "GB/s" in out
    assert main(["cost", "gemm", "256", "256", "256", "--dtype", "fp32", "--target",
                 str(path)]) == 0
    assert "measured by calibrate" in capsys.readouterr().out
    # OpenVINO's fixed costs in the file, as the host calibration has them (issue 34)
    if importlib.util.find_spec("openvino") is not None:
        costs = json.loads(path.read_text())["op_overhead_s"]
        assert any(k.startswith("ov:") and k != "ov:@call" for k in costs) and "ov:@call" in costs
        assert "fixed cost per node, OpenVINO" in out


class _Variants(nn.Module):
    """A copying reshape beside a viewing one; a 3x3, a 1x1 and a depthwise conv."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.pointwise = nn.Conv2d(8, 16, 1)
        self.depthwise = nn.Conv2d(16, 16, 3, padding=1, groups=16)

    def forward(self, x: torch.Tensor, img: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (x.transpose(1, 2).reshape(2, -1), x.reshape(4, -1),
                self.depthwise(self.pointwise(self.conv(img))))


def test_a_reshape_that_copies_is_a_copy_and_each_conv_variant_has_its_cost():
    costs = {"Reshape": 1e-6, "Reshape:copy": 11e-6, "Conv": 100e-6, "Conv:1x1": 30e-6,
             "Conv:depthwise": 60e-6}
    plan = graphopt.plan(_Variants(), (torch.randn(2, 4, 8), torch.randn(1, 8, 8, 8)),
                         target=_measured(op_overhead_s=costs))
    reshapes = [n for n in plan.nodes if n.op_type == "Reshape"]
    assert [n.analysis.kernel_class.value for n in reshapes] == ["data_movement", "view"]
    assert reshapes[0].analysis.bytes_total == 2 * 4 * 8 * 4 * 2  # read and written once
    assert [n.cost.overhead_s for n in reshapes] == [11e-6, 1e-6]
    convs = [n for n in plan.nodes if n.op_type == "Conv"]
    assert [n.cost.overhead_s for n in convs] == [100e-6, 30e-6, 60e-6]
    # a 1x1 conv is a GEMM: the measured matrix rate, not the conv rate
    assert convs[1].cost.compute_time_s == pytest.approx(convs[1].analysis.flops / 50e9)
    assert convs[0].cost.compute_time_s == pytest.approx(convs[0].analysis.flops / 25e9)


def test_an_onnx_plan_pays_onnx_runtimes_fixed_costs_a_torch_plan_eager_torchs(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    costs = {"Add": 5e-6, "Relu": 6e-6, "ort:Add": 1e-6, "ort:Relu": 3e-6}
    profile = _measured(op_overhead_s=costs)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])
    graph = helper.make_graph([helper.make_node("Add", ["x", "x"], ["s"], name="add"),
                               helper.make_node("Relu", ["s"], ["y"], name="relu")],
                              "g", [x], [y])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    onnx_plan = graphopt.plan(str(path), target=profile)
    assert {n.op_type: n.cost.overhead_s for n in onnx_plan.nodes} == {"Add": 1e-6,
                                                                       "Relu": 3e-6}
    assert onnx_plan.target.launch_overhead_s == 2e-6  # the median of ONNX Runtime's

    class AddRelu(nn.Module):
        def forward(self, v: torch.Tensor) -> torch.Tensor:
            return torch.relu(v + v)

    torch_plan = graphopt.plan(AddRelu(), (torch.randn(2, 8),), target=profile)
    assert {n.op_type: n.cost.overhead_s for n in torch_plan.nodes} == {"Add": 5e-6,
                                                                        "Relu": 6e-6}
