"""``graphopt.plan`` shows the padding and layout decisions ``optimize`` would apply (issue 20,
item 3), and each run decides its layout once, before any pass.

The dry run (``api.planning.dry_run``) asks the backend that would run the model for its
legality and constants and makes the same decisions its passes make; these tests check the
plan's decisions against what ``optimize`` applied, node by node, on both backends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import graphopt
import graphopt.decisions.rewrites as rewrites
from graphopt.frontends.onnx_export import export_torch
from graphopt.ir.decision_details import Detail
from graphopt.ir.plan import Plan
from tests import zoo

_KINDS = ("padding", "padding_carry", "padding_slice", "layout", "fold", "drop")


def _rewrites(plan: Plan) -> dict[tuple[str, str], tuple[bool, str, Detail]]:
    return {(n.name, k): (d.applied, d.reason, d.detail) for n in plan.nodes
            for k, d in n.decisions.items() if k in _KINDS}


@pytest.mark.parametrize("name", ["tc_guide_cnn", "odd_residual_cnn", "odd_mlp",
                                  "transformer_hd72"])
@pytest.mark.parametrize("target", ["h100", "a100", "xeon-8380"])
def test_torch_plan_shows_what_optimize_applies(name: str, target: str) -> None:
    model, inputs = zoo.zoo()[name]
    planned = graphopt.plan(model, inputs, target=target)
    done = graphopt.optimize(model, inputs, target=target, measure=False)
    assert _rewrites(planned)  # every GEMM-like node has a padding decision at least
    assert _rewrites(planned) == _rewrites(done.plan)


class _Cleanup(nn.Module):
    """Every case of the cleanup pass: a BatchNorm after a conv (folds), after a conv whose
    output has another reader (kept), after a relu (kept), BatchNorm1d after a linear behind
    an eval dropout (dropout dropped, then folds), a conv without bias (gains one)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.bn_a = nn.Conv2d(3, 37, 3, padding=1), nn.BatchNorm2d(37)
        self.b, self.bn_b = nn.Conv2d(37, 37, 3, padding=1, bias=False), nn.BatchNorm2d(37)
        self.bn_c = nn.BatchNorm2d(37)
        self.fc, self.drop, self.bn_d = nn.Linear(37, 61), nn.Dropout(0.2), nn.BatchNorm1d(61)
        for bn in (self.bn_a, self.bn_b, self.bn_c, self.bn_d):  # not the identity
            nn.init.uniform_(bn.weight, 0.5, 1.5)
            nn.init.uniform_(bn.running_mean, -0.2, 0.2)
            nn.init.uniform_(bn.running_var, 0.5, 2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = F.relu(self.bn_a(self.a(x)))
        b = self.b(a)
        y = self.bn_c(F.relu(self.bn_b(b) + b))
        return self.bn_d(self.drop(self.fc(y.mean((2, 3)))))


@pytest.mark.parametrize("target", ["h100", "xeon-8380"])
def test_plan_shows_the_cleanup_and_the_padding_after_it(target: str) -> None:
    torch.manual_seed(0)
    model, x = _Cleanup().eval(), torch.randn(2, 3, 12, 12)
    planned = graphopt.plan(model, (x,), target=target)
    done = graphopt.optimize(model, (x,), target=target, measure=False)
    assert _rewrites(planned) == _rewrites(done.plan)
    folds = {n: d[0] for (n, k), d in _rewrites(planned).items() if k == "fold"}
    assert folds == {"batch_norm": True, "conv2d": True, "batch_norm_1": False,
                     "batch_norm_2": False, "batch_norm_3": True, "linear": True}
    assert _rewrites(planned)[("dropout", "drop")][0]


@pytest.mark.zoo
@pytest.mark.parametrize("name", ["resnet", "mobilenet_v2"])
def test_plan_of_a_batchnorm_cnn_shows_what_optimize_applies(name: str) -> None:
    from tests import arch_zoo

    model, inputs = arch_zoo.build(name)
    planned = graphopt.plan(model, inputs, target="h100")
    done = graphopt.optimize(model, inputs, target="h100", measure=False)
    assert any(k == "fold" for _, k in _rewrites(planned))
    assert _rewrites(planned) == _rewrites(done.plan)


@pytest.mark.parametrize("target", ["h100", "xeon-8380"])
def test_onnx_plan_shows_what_optimize_applies(tmp_path: Path, target: str) -> None:
    """ONNX records layout as ORT runs it (one prefer_nhwc per session on GPUs, none on the CPU
    EP): the plan says so too."""
    model, inputs = zoo.zoo()["tc_guide_cnn"]
    path = tmp_path / "m.onnx"
    path.write_bytes(export_torch(model, inputs).model.SerializeToString())
    planned = graphopt.plan(str(path), target=target)
    done = graphopt.optimize(str(path), target=target, measure=False)
    assert _rewrites(planned) == _rewrites(done.plan)
    layouts = [d for (_, k), d in _rewrites(planned).items() if k == "layout"]
    assert layouts and all((f.backend is not None) == (target == "xeon-8380" and f.format ==
                                                        "channels_last") for _, _, f in layouts)


def test_plan_padding_and_layout_in_the_report() -> None:
    """tc_guide_cnn on h100: conv 67->129 pads its output to 136 (bf16 wants multiples of 8),
    both convs run channels_last; the rewrites section says so for the model."""
    model, inputs = zoo.zoo()["tc_guide_cnn"]
    plan = graphopt.plan(model, inputs, target="h100")
    report = plan.to_dict()
    section = report["rewrites"]
    assert section["compute_dtype"] == "bf16"
    assert section["padding"]["padded_nodes"] == ["conv2d_1"]
    assert section["layout"]["nhwc"] is True
    nodes = {n["name"]: n["decisions"] for n in report["nodes"]}
    assert nodes["conv2d_1"]["padding"]["new"] == {"C_in": 67, "C_out": 136}
    assert nodes["conv2d_1"]["padding"]["applied"] is True
    assert nodes["conv2d"]["layout"]["format"] == "channels_last"
    assert "padding" in plan.to_markdown() and "channels_last" in plan.to_markdown()


def test_plan_of_a_conv_free_model_says_layout_does_not_matter() -> None:
    model, inputs = zoo.zoo()["odd_mlp"]
    section = graphopt.plan(model, inputs, target="h100").to_dict()["rewrites"]
    assert section["layout"]["reason"] == "no convolutions: layout does not matter"
    assert section["padding"]["mode"] == "auto"


class _Convs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 32, 3, padding=1), nn.Conv2d(32, 32, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(F.relu(self.a(x)))


def _count_layout_decisions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    real = rewrites.decide_layout

    def counted(plan: Plan, *args: Any, **kwargs: Any) -> Any:
        calls.append(plan.target.name)
        return real(plan, *args, **kwargs)

    monkeypatch.setattr(rewrites, "decide_layout", counted)
    return calls


def test_each_run_decides_its_layout_once(monkeypatch: pytest.MonkeyPatch,
                                          tmp_path: Path) -> None:
    """One layout decision per optimize run, on either backend, made before the passes (the
    torch layout pass and the ONNX session read it; neither decides again)."""
    torch.manual_seed(0)
    model, x = _Convs().eval(), torch.randn(2, 3, 16, 16)
    calls = _count_layout_decisions(monkeypatch)
    graphopt.optimize(model, (x,), target="h100", measure=False)
    assert len(calls) == 1
    path = tmp_path / "c.onnx"
    path.write_bytes(export_torch(model, (x,)).model.SerializeToString())
    calls.clear()
    graphopt.optimize(str(path), target="h100", measure=False)
    assert len(calls) == 1
    calls.clear()
    graphopt.plan(model, (x,), target="h100")
    assert len(calls) == 1


def test_torch_layout_pass_without_a_decided_layout_is_a_bug() -> None:
    """The pass has no rule of its own to fall back on."""
    from graphopt.backends.torch.layout import channels_last
    from graphopt.backends.torch.pipeline import prepare

    gm, ctx = prepare(_Convs().eval(), (torch.randn(1, 3, 8, 8),), "h100")
    ctx.layout = None
    with pytest.raises(RuntimeError, match="decided before any pass"):
        channels_last(gm, ctx)


def test_dry_run_with_options_follows_them() -> None:
    """pad='never' and layout='keep' are decided as optimize would: nothing padded, all NCHW."""
    from graphopt.api.planning import dry_run
    from graphopt.decisions.planner import build_plan
    from graphopt.frontends import load_graph
    from graphopt.hardware import get_target
    from graphopt.ir.options import Options

    model, inputs = zoo.zoo()["tc_guide_cnn"]
    graph = load_graph(model, inputs, None)
    plan = dry_run(build_plan(graph, get_target("h100")), graph,
                   Options(pad="never", layout="keep"))
    section = plan.to_dict()["rewrites"]
    assert section["padding"] == {"mode": "never", "reason": "pad='never'"}
    assert section["layout"]["nhwc"] is False
    assert not any(n.decisions["layout"].applied for n in plan.nodes if n.op_type == "Conv")
