"""One layout decision for both backends: a conv model optimized as torch and as ONNX gets the
same channels_last answer and reason (decided once in
``graphopt.decisions.layout.channels_last``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import graphopt
from graphopt.decisions.layout.channels_last import decide_layout
from graphopt.frontends.onnx_export import export_torch
from graphopt.hardware.registry import resolve_targets
from graphopt.ir.plan import Plan


class ConvNet(nn.Module):
    """conv 3->64 -> relu -> conv 64->64 (``groups``) -> relu -> conv 64->64 on 32x32 maps."""

    def __init__(self, groups: int = 1) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 64, 3, padding=1)
        self.b = nn.Conv2d(64, 64, 3, padding=1, groups=groups)
        self.c = nn.Conv2d(64, 64, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(F.relu(self.b(F.relu(self.a(x)))))


def _convs(plan: Plan) -> list[dict[str, Any]]:
    """Each conv's layout decision in graph order, without the node names (they differ)."""
    out = []
    for n in plan.nodes:
        if n.op_type == "Conv":
            d = n.decisions["layout"]
            out.append({"format": d.detail.format, "region": d.detail.region,
                        "reason": d.reason, "gain": d.detail.predicted_gain_s})
    return out


def _both(groups: int, target: str, tmp_path: Path) -> tuple[Any, Any]:
    torch.manual_seed(0)
    model, x = ConvNet(groups).eval(), torch.randn(2, 3, 32, 32)
    # measure=False: a pass timed slower on this host is reverted, which would rewrite the
    # torch reasons; the decision is what is compared here
    # precision pinned on the CPU: each backend decides layout with its own compute dtype
    # (torch picks bf16 on a host with native bf16, ONNX Runtime's CPU EP stays fp32)
    precision = "fp32" if target == "cpu" else "auto"
    as_torch = graphopt.optimize(model, x, target=target, precision=precision, measure=False)
    path = tmp_path / "convnet.onnx"
    path.write_bytes(export_torch(model, (x,)).model.SerializeToString())
    as_onnx = graphopt.optimize(str(path), target=target, precision=precision, measure=False)
    return as_torch, as_onnx


@pytest.mark.parametrize("groups", [1, 8])
@pytest.mark.parametrize("target", ["h100", "cpu"])
def test_torch_and_onnx_get_the_same_layout_decision(groups: int, target: str,
                                                     tmp_path: Path) -> None:
    as_torch, as_onnx = _both(groups, target, tmp_path)
    t, o = _convs(as_torch.plan), _convs(as_onnx.plan)
    assert len(t) == 3
    assert [{**d, "gain": pytest.approx(d["gain"])} for d in t] == o
    t_model = as_torch.info.notes["layout"]["decision"]
    o_model = as_onnx.info.notes["layout"]["decision"]
    assert t_model == o_model


def test_h100_runs_the_plain_net_nhwc_on_both(tmp_path: Path) -> None:
    as_torch, as_onnx = _both(1, "h100", tmp_path)
    assert all(d["format"] == "channels_last" and "predicted to pay" in d["reason"]
               and d["gain"] > 0 for d in _convs(as_torch.plan))
    assert as_torch.info.notes["layout"]["decision"]["nhwc"]
    assert as_onnx.info.session["providers"][0][1]["prefer_nhwc"] == "1"
    for n in as_onnx.plan.nodes:
        if n.op_type == "Conv":
            assert n.decisions["layout"].applied and n.decisions["layout"].detail.backend is None


def test_h100_keeps_the_grouped_conv_nchw_on_both(tmp_path: Path) -> None:
    as_torch, as_onnx = _both(8, "h100", tmp_path)
    for plan in (as_torch.plan, as_onnx.plan):
        grouped = _convs(plan)[1]
        assert grouped["format"] == "nchw" and grouped["region"] is None
        assert "grouped conv with 8 channels per group" in grouped["reason"]
    # the other two convs are separate regions, each deciding on its own
    assert [d["region"] for d in _convs(as_torch.plan)] == [0, None, 1]
    session = as_onnx.info.session
    nhwc = as_onnx.info.notes["layout"]["decision"]["nhwc"]
    assert ("prefer_nhwc" in session["providers"][0][1]) == nhwc


def test_cpu_onnx_states_what_ort_does_instead(tmp_path: Path) -> None:
    _, as_onnx = _both(1, "cpu", tmp_path)
    assert "NCHWc" in as_onnx.info.session["reasons"]["layout"]
    for n in as_onnx.plan.nodes:
        if n.op_type == "Conv":
            d = n.decisions["layout"]
            assert not d.applied  # ORT's CPU EP chooses its own layout
            assert ("NCHWc" in (d.detail.backend or "")) == (d.detail.format
                                                             == "channels_last")


def test_decision_cases_on_the_plan() -> None:
    """keep / forced / auto straight on a plan, with no backend."""
    torch.manual_seed(0)
    plan = graphopt.plan(ConvNet().eval(), torch.randn(2, 3, 32, 32), target="h100")
    h100 = resolve_targets("h100")[0]
    keep = decide_layout(plan, h100, "bf16", "keep")
    assert not keep.nhwc and all(d.reason == "kept: layout=keep" for d in keep.convs.values())
    fp32 = decide_layout(plan, h100, "fp32", "auto")
    assert not fp32.nhwc and not any(d.channels_last for d in fp32.convs.values())
    assert "modelled to pay only for fp16/bf16" in fp32.reason
    forced = decide_layout(plan, h100, "fp32", "channels_last")
    assert forced.nhwc and all("forced by layout=channels_last" in d.reason
                               for d in forced.convs.values())
    (region, est), = forced.regions
    assert [e.name for e in region.entries] == ["x"] and len(region.exits) == 1
    assert est.cost_s > 0


class WithUpsample(ConvNet):
    """ConvNet, then a transposed conv (case 2: never channels_last)."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(64, 8, 2, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(F.relu(super().forward(x)))


def test_onnx_says_where_the_session_option_overrides_a_conv(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model, x = WithUpsample().eval(), torch.randn(2, 3, 32, 32)
    path = tmp_path / "up.onnx"
    path.write_bytes(export_torch(model, (x,)).model.SerializeToString())
    opt = graphopt.optimize(str(path), target="h100", measure=False)
    assert opt.info.session["providers"][0][1]["prefer_nhwc"] == "1"
    up = next(n for n in opt.plan.nodes if n.op_type == "ConvTranspose").decisions["layout"]
    assert not up.applied and "transposed conv" in up.reason
    assert "one option per session" in up.detail.backend


def test_torch_pass_applies_whatever_the_plan_decides() -> None:
    """The fx pass decides nothing itself: a plan that says channels_last (here: as if forced)
    is applied even where the pass's own options say auto and fp32 would not pay."""
    import graphopt.backends.torch.layout as torch_layout
    from graphopt.backends.torch.pipeline import decide_run, prepare
    from graphopt.ir.options import Options

    torch.manual_seed(0)
    model, x = ConvNet().eval(), torch.randn(2, 3, 32, 32)
    gm, ctx = prepare(model, (x,), "h100", Options(layout="auto"))
    decide_run(ctx, "fp32")
    assert not torch_layout.channels_last(gm, ctx)  # auto: fp32 does not pay on h100
    ctx.layout = decide_layout(ctx.plan, ctx.target, "fp32", "channels_last")
    assert torch_layout.channels_last(gm, ctx)
    assert ctx.notes["layout"]["decision"]["nhwc"]
    assert all("forced by layout=channels_last" in ctx.decisions[c]["layout"].reason
               for c in ("conv2d", "conv2d_1", "conv2d_2"))
