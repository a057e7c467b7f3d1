"""graphopt.profile: measured time per plan node beside the prediction (issue 12 item 6).

Nothing here asserts how fast this machine is: only that every node is measured, that the
summary numbers follow from the nodes, and that errors say the fix.
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
import torch
from torch import nn

import graphopt
from graphopt.cli.main import main
from graphopt.ir.plan_summary import Prediction
from graphopt.measure import spearman
from graphopt.measure.torch_runs import per_node
from graphopt.report.prediction import prediction_html, prediction_md, worst_nodes
from tests.onnx_rewrite_models import tc_guide
from tests.zoo import ConvNet, TransformerBlock

RUNS = dict(runs=3, warmup=1)  # enough for a median; keeps the suite fast on a shared host


def _check_summary(plan: graphopt.Plan) -> Prediction:
    """The summary's numbers recomputed from the nodes."""
    pred = plan.summary.prediction
    pairs = [(n.cost.est_time_s, n.measured_s) for n in plan.nodes
             if n.measured_s and n.cost.est_time_s > 0]
    assert pred.nodes_measured == len(pairs) >= 3
    assert pred.median_ratio == pytest.approx(np.median([p / m for p, m in pairs]))
    assert pred.spearman == pytest.approx(spearman(*zip(*pairs, strict=True)), abs=1e-6)
    assert -1 <= pred.spearman <= 1
    assert pred.measured_model_s > 0 and math.isfinite(pred.measured_model_s)
    assert pred.model_ratio == pytest.approx(plan.summary.est_latency_s / pred.measured_model_s)
    assert all(math.isfinite(getattr(pred, k))
               for k in ("spearman", "median_ratio", "model_ratio"))
    return pred


@pytest.mark.parametrize("make, shape", [(ConvNet, (2, 3, 16, 16)),
                                         (TransformerBlock, (2, 10, 288))])
def test_every_torch_node_is_measured(make, shape):
    torch.manual_seed(0)
    model, x = make().eval(), torch.randn(*shape)
    plan = graphopt.profile(model, (x,), target="cpu", **RUNS)
    assert plan.target.name == graphopt.plan(model, (x,), target="cpu").target.name
    assert plan.target.kind == "cpu"
    for n in plan.nodes:  # every plan node is an fx node, views included
        assert n.measured_s is not None and n.measured_s > 0, n.name
    _check_summary(plan)
    node = plan.to_dict()["nodes"][0]
    assert node["measured_s"] == plan.nodes[0].measured_s


def test_a_plain_plan_keeps_its_json():
    plan = graphopt.plan(ConvNet().eval(), (torch.randn(2, 3, 16, 16),), target="cpu")
    d = plan.to_dict()
    assert "prediction" not in d["summary"]
    assert all("measured_s" not in n for n in d["nodes"])
    assert prediction_md(plan, "##") == [] and prediction_html(plan) == ""


class _Branchy(nn.Module):
    """Data-dependent control flow: torch.export fails, the make_fx fallback traces."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        return torch.relu(y) * 2 if y.sum() > 0 else y - 1


def test_the_make_fx_fallback_is_measured_too():
    torch.manual_seed(0)
    model, x = _Branchy().eval(), torch.ones(4, 16)
    plan = graphopt.profile(model, (x,), **RUNS)
    assert any("make_fx" in w for w in plan.warnings)
    assert [n.name for n in plan.nodes if n.measured_s is None] == []


def test_an_onnx_file_is_profiled_node_for_node(tmp_path):
    m = tc_guide()
    m.graph.node[1].name = ""  # an unnamed node: the frontend names it the same each time
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    plan = graphopt.profile(str(path), **RUNS)
    assert [n.name for n in plan.nodes] == [n.name for n in graphopt.plan(str(path),
                                                                          target="cpu").nodes]
    for n in plan.nodes:
        assert n.measured_s is not None and n.measured_s > 0, n.name
    pred = _check_summary(plan)
    assert "ONNX Runtime" in pred.method


def test_spearman_by_hand():
    assert spearman([1, 2, 3, 4], [10, 30, 20, 40]) == pytest.approx(0.8)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    # ties take their average rank: ranks (1.5, 1.5, 3, 4) against (1, 2, 3, 4)
    assert spearman([5, 5, 6, 7], [1, 2, 3, 4]) == pytest.approx(
        np.corrcoef([1.5, 1.5, 3, 4], [1, 2, 3, 4])[0, 1])
    assert spearman([1, 2], [1, 2]) is None
    assert spearman([1, 1, 1], [1, 2, 3]) is None


def test_the_cli_writes_the_reports(tmp_path, capsys):
    spec = tmp_path / "m.py"
    spec.write_text("import torch\nfrom tests.zoo import ConvNet\n\ndef build():\n"
                    "    torch.manual_seed(0)\n"
                    "    return ConvNet().eval(), (torch.randn(2, 3, 16, 16),)\n")
    out = {k: tmp_path / f"p.{k}" for k in ("json", "md", "html")}
    rc = main(["profile", f"{spec}:build", "--target", "cpu", "--runs", "2", "--warmup", "1",
               "--threads", "1", *[a for k, p in out.items() for a in (f"--{k}", str(p))]])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "Spearman" in printed and printed.count("wrote ") == 3
    report = json.loads(out["json"].read_text())
    pred = report["summary"]["prediction"]
    assert pred["threads"] == 1
    assert pred["nodes_measured"] == sum(1 for n in report["nodes"] if n.get("measured_s"))
    md = out["md"].read_text()
    assert "## Predicted vs measured" in md
    typed = graphopt.Plan.from_json(report)
    assert all(f"`{n.name}`" in md for n, _, _ in worst_nodes(typed))
    html = out["html"].read_text()
    section = prediction_html(typed)
    assert section in html and section.count("<circle") == pred["nodes_measured"]


def test_the_cli_refuses_another_target(tmp_path, capsys):
    (tmp_path / "m.py").write_text("import torch\ndef build():\n"
                                   "    return torch.nn.ReLU(), (torch.randn(2),)\n")
    assert main(["profile", f"{tmp_path / 'm.py'}:build", "--target", "a100"]) == 2
    assert "this machine's CPU" in capsys.readouterr().err


@pytest.mark.parametrize("call, needle", [
    (lambda: graphopt.profile(ConvNet(), (torch.randn(2, 3, 16, 16),), target="h100"),
     "this machine's CPU"),
    (lambda: graphopt.profile(object()), "cannot profile"),
    (lambda: graphopt.profile(ConvNet()), "needs example inputs"),
    (lambda: graphopt.profile(ConvNet(), (torch.randn(2, 3, 16, 16),), runs=0), "runs >= 1"),
])
def test_bad_requests_say_the_fix(call, needle):
    with pytest.raises(graphopt.GraphoptError, match=needle) as err:
        call()
    assert err.value.fix


def test_a_model_elsewhere_than_the_target_is_refused():
    model = ConvNet().eval().to("meta")  # not on the CPU it would be timed on
    with pytest.raises(graphopt.GraphoptError, match="move both there first"):
        graphopt.profile(model, (torch.randn(2, 3, 16, 16, device="meta"),), **RUNS)


def test_per_node_reads_the_device_time_on_a_gpu():
    """The GPU path's mapping is the CPU one's: only the time field of the ops differs."""
    op = SimpleNamespace(name="aten::addmm", cpu_time_total=30.0, device_time_total=7.0,
                         cpu_children=[])
    rng = SimpleNamespace(name="graphopt::node::linear", cpu_children=[op, op])
    events = [rng, op, op, rng, op, op]
    assert per_node(events, "cpu") == {"linear": pytest.approx([60e-6, 60e-6])}
    assert per_node(events, "cuda:0") == {"linear": pytest.approx([14e-6, 14e-6])}


def test_a_broken_onnx_file_is_a_graphopt_error(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage" * 10)
    with pytest.raises(graphopt.GraphoptError):
        graphopt.profile(str(bad))
