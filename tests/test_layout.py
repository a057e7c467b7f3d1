"""The channels_last layout pass: where it fires, where it must not, and the numbers after it."""

from __future__ import annotations

import pytest
import torch
from torch import fx, nn
from torch.nn import functional as F

from graphopt.backends.driver import Pass
from graphopt.backends.torch.cleanup import fold_batchnorm_and_drop_dropout
from graphopt.backends.torch.context import RewriteContext
from graphopt.backends.torch.fx_utils import get_tensor, is_aten
from graphopt.backends.torch.layout import channels_last
from graphopt.backends.torch.layout_regions import is_entry_conversion, is_exit_conversion
from graphopt.backends.torch.pipeline import decide_run, optimize_torch, prepare
from graphopt.backends.torch.verify import compare_outputs
from graphopt.decisions.tolerance import tolerance_for
from graphopt.ir.decision_details import LayoutDetail, LayoutFormat
from graphopt.ir.options import Options

ONEDNN = pytest.mark.skipif(not torch.backends.mkldnn.is_available(),
                            reason="the CPU rule models oneDNN")


class ResidualConvNet(nn.Module):
    """conv-bn-relu-conv + residual, then adaptive pool + flatten + linear."""

    def __init__(self, c: int = 16, features: bool = False) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.bn = nn.BatchNorm2d(c)
        self.conv = nn.Conv2d(c, c, 3, padding=1)
        self.fc = nn.Linear(c, 10)
        self.features = features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stem(x)
        y = self.conv(F.relu(self.bn(y))) + y
        if self.features:
            return y
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))


class TwoRegions(nn.Module):
    """Two conv regions joined by flatten -> linear -> view."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 8 * 8, 8 * 8 * 8)
        self.b = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.flatten(F.relu(self.a(x)), 1)
        y = self.fc(y).view(x.shape[0], 8, 8, 8)
        return F.relu(self.b(y))


class GroupedNet(nn.Module):
    def __init__(self, groups: int) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 3, padding=1)
        self.grouped = nn.Conv2d(32, 32, 3, padding=1, groups=groups)
        self.point = nn.Conv2d(32, 32, 1)
        self.last = nn.Conv2d(32, 32, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.grouped(F.relu(self.stem(x))))
        return F.adaptive_avg_pool2d(self.last(F.relu(self.point(y))), 1).flatten(1)


def _prepared(model: nn.Module, x: torch.Tensor, target: str = "cpu", layout: str = "auto",
              dtype: str = "fp32") -> tuple[fx.GraphModule, RewriteContext]:
    torch.manual_seed(0)
    gm, ctx = prepare(model.eval(), (x,), target, Options(layout=layout))  # type: ignore[arg-type]
    decide_run(ctx, dtype)  # the run's decisions (compute dtype, then layout) at ``dtype``
    return gm, ctx


def _conversions(gm: fx.GraphModule) -> tuple[int, int]:
    nodes = list(gm.graph.nodes)
    return sum(map(is_entry_conversion, nodes)), sum(map(is_exit_conversion, nodes))


def _conv_weights(gm: fx.GraphModule) -> list[torch.Tensor]:
    out = []
    for n in gm.graph.nodes:
        if is_aten(n, "conv2d", "conv3d"):
            w = get_tensor(gm, n.args[1])
            assert w is not None
            out.append(w)
    return out


def _layout(ctx: RewriteContext, node: str):
    return ctx.decisions[node]["layout"]


def _net(region: dict) -> float:
    """The predicted gain a conv's decision carries: its region's, net of conversions."""
    return region["gain_s"] - region["cost_s"]


def _assert_same(model: nn.Module, gm: fx.GraphModule, x: torch.Tensor) -> None:
    gm.graph.lint()
    gm.recompile()
    with torch.no_grad():
        ref, out = model(x), gm(x)
    result = compare_outputs(ref, out, tolerance_for("fp32"))
    assert all(c.within for c in result), [c.describe() for c in result]
    assert out.stride() == ref.stride() and out.is_contiguous() == ref.is_contiguous()


def test_forced_region_one_entry_one_exit_and_same_numbers() -> None:
    model, x = ResidualConvNet(), torch.randn(2, 3, 16, 16)
    gm, ctx = _prepared(model, x, layout="channels_last")
    assert channels_last(gm, ctx)
    notes = ctx.notes["layout"]
    assert len(notes["regions"]) == 1
    region = notes["regions"][0]
    assert region["applied"] and region["convs"] == ["conv2d", "conv2d_1"]
    assert (region["entries"], region["exits"], notes["conversions"]) == (1, 1, 2)
    assert _conversions(gm) == (1, 1)
    for w in _conv_weights(gm):
        assert w.is_contiguous(memory_format=torch.channels_last) and not w.is_contiguous()
    for conv in ("conv2d", "conv2d_1"):
        d = _layout(ctx, conv)
        assert d.applied and d.detail == LayoutDetail(LayoutFormat.CHANNELS_LAST, 0,
                                                      _net(region))
        assert "forced by layout=channels_last" in d.reason
    assert any(n.op == "call_module" for n in gm.graph.nodes)  # _guards_fn kept
    _assert_same(model, gm, x)


def test_graph_output_gets_original_strides_back() -> None:
    model, x = ResidualConvNet(features=True), torch.randn(2, 3, 16, 16)
    gm, ctx = _prepared(model, x, layout="channels_last")
    assert channels_last(gm, ctx)
    assert _conversions(gm) == (1, 1)
    _assert_same(model, gm, x)  # the 4-D output is NCHW-contiguous like the original


def test_pipeline_keeps_outputs_within_fp32_tolerance() -> None:
    model, x = ResidualConvNet(), torch.randn(2, 3, 16, 16)
    done = optimize_torch(
        model.eval(), (x,), "cpu", Options(layout="channels_last", measure=False),  # no timing
        passes=[Pass("cleanup", fold_batchnorm_and_drop_dropout),
                Pass("layout", channels_last, option="layout")])
    plan, info = done.plan, done.report
    assert "layout" in info.passes_applied and not info.passes_reverted
    assert info.notes["layout"]["conversions"] == 2
    by_name = {n.name: n for n in plan.nodes}
    assert by_name["conv2d"].decisions["layout"].detail.format == "channels_last"


def test_fp32_on_volta_is_kept_with_the_reason() -> None:
    model, x = ResidualConvNet(), torch.randn(2, 3, 16, 16)
    gm, ctx = _prepared(model, x, target="v100", dtype="fp32")
    before = gm.code
    assert not channels_last(gm, ctx)
    assert gm.code == before and _conversions(gm) == (0, 0)
    for conv in ("conv2d", "conv2d_1"):
        d = _layout(ctx, conv)
        assert not d.applied and d.detail == LayoutDetail(LayoutFormat.NCHW, None, None)
        assert "Volta" in d.reason and "sm_70" in d.reason


def test_grouped_conv_on_h100_fp16_is_kept_nchw() -> None:
    model, x = GroupedNet(groups=4), torch.randn(2, 3, 16, 16)
    gm, ctx = _prepared(model, x, target="h100", dtype="fp16")
    channels_last(gm, ctx)
    d = _layout(ctx, "conv2d_1")  # the grouped conv: 8 channels per group
    assert not d.applied and d.detail.format == "nchw" and d.detail.region is None
    assert "grouped conv with 8 channels per group" in d.reason
    grouped = next(n for n in gm.graph.nodes if n.name == "conv2d_1")
    assert not is_entry_conversion(grouped.args[0])  # it reads NCHW data
    _assert_same(model, gm, x)


def test_depthwise_conv_joins_the_region_on_h100_fp16() -> None:
    model, x = GroupedNet(groups=32), torch.randn(2, 3, 16, 16)
    gm, ctx = _prepared(model, x, target="h100", dtype="fp16")
    assert channels_last(gm, ctx)
    d = _layout(ctx, "conv2d_1")
    assert d.applied and d.detail == LayoutDetail(
        LayoutFormat.CHANNELS_LAST, 0, _net(ctx.notes["layout"]["regions"][0]))
    assert "tensor-core" in d.reason
    assert len(ctx.notes["layout"]["regions"]) == 1
    _assert_same(model, gm, x)


def test_fp32_on_h100_is_not_applied_in_auto() -> None:
    model, x = ResidualConvNet(), torch.randn(2, 3, 16, 16)
    gm, ctx = _prepared(model, x, target="h100", dtype="fp32")
    assert not channels_last(gm, ctx)
    d = _layout(ctx, "conv2d_1")
    assert not d.applied and d.detail.region == 0 and "not applied because" in d.reason


def test_keep_changes_nothing() -> None:
    model, x = ResidualConvNet(), torch.randn(2, 3, 16, 16)
    gm, ctx = _prepared(model, x, target="h100", layout="keep", dtype="fp16")
    before = gm.code
    assert not channels_last(gm, ctx)
    assert gm.code == before
    for conv in ("conv2d", "conv2d_1"):
        d = _layout(ctx, conv)
        assert not d.applied and d.reason == "kept: layout=keep"
    assert ctx.notes["layout"]["conversions"] == 0


def test_two_regions_have_their_own_conversions() -> None:
    model, x = TwoRegions(), torch.randn(2, 3, 8, 8)
    gm, ctx = _prepared(model, x, layout="channels_last")
    assert channels_last(gm, ctx)
    regions = ctx.notes["layout"]["regions"]
    assert [(r["entries"], r["exits"]) for r in regions] == [(1, 1), (1, 1)]
    assert ctx.notes["layout"]["conversions"] == 4 and _conversions(gm) == (2, 2)
    assert _layout(ctx, "conv2d").detail.region == 0
    assert _layout(ctx, "conv2d_1").detail.region == 1
    view = next(n for n in gm.graph.nodes if is_aten(n, "view"))
    assert is_exit_conversion(view.args[0].args[0].args[0])  # view <- linear <- flatten <- exit
    _assert_same(model, gm, x)


def test_second_run_adds_no_conversions() -> None:
    model, x = TwoRegions(), torch.randn(2, 3, 8, 8)
    gm, ctx = _prepared(model, x, layout="channels_last")
    assert channels_last(gm, ctx)
    params = len(list(gm.parameters()))
    code = gm.code
    assert not channels_last(gm, ctx)
    assert gm.code == code and len(list(gm.parameters())) == params
    assert ctx.notes["layout"]["inserted"] == 0 and ctx.notes["layout"]["conversions"] == 4
    assert _conversions(gm) == (2, 2)
    _assert_same(model, gm, x)


def test_spatial_reduction_reader_needs_no_exit() -> None:
    class MeanHead(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c = nn.Conv2d(3, 8, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.relu(self.c(x)).mean(dim=(2, 3))

    model, x = MeanHead(), torch.randn(2, 3, 8, 8)
    gm, ctx = _prepared(model, x, layout="channels_last")
    assert channels_last(gm, ctx)
    assert _conversions(gm) == (1, 0)
    _assert_same(model, gm, x)


def test_conv3d_uses_channels_last_3d() -> None:
    class Net3d(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Conv3d(2, 8, 3, padding=1), nn.Conv3d(8, 8, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(F.relu(self.a(x)))

    model, x = Net3d(), torch.randn(2, 2, 4, 6, 6)
    gm, ctx = _prepared(model, x, layout="channels_last")
    assert channels_last(gm, ctx)
    for w in _conv_weights(gm):
        assert w.is_contiguous(memory_format=torch.channels_last_3d)
    _assert_same(model, gm, x)


def test_transposed_conv_is_a_boundary() -> None:
    class Up(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Conv2d(3, 8, 3, padding=1)
            self.up = nn.ConvTranspose2d(8, 8, 2, stride=2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.up(F.relu(self.a(x)))

    model, x = Up(), torch.randn(2, 3, 8, 8)
    gm, ctx = _prepared(model, x, layout="channels_last")
    channels_last(gm, ctx)
    d = next(v["layout"] for k, v in ctx.decisions.items() if "transpose" in k)
    assert not d.applied and "transposed" in d.reason
    _assert_same(model, gm, x)


# --- the CPU rule (measured by benchmarks/bench_layout_cpu.py) -------------------------------
class ConvStack(nn.Module):
    def __init__(self, c: int, n: int) -> None:
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv2d(c, c, 3, padding=1) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        for conv in self.convs:
            y = F.relu(conv(y))
        return y + x


@ONEDNN
def test_cpu_auto_converts_a_region_whose_convs_outweigh_its_copies() -> None:
    # 3 dense 3x3 convs save 3 x 0.75 x 2 copies = 4.5 > 1.1 x 1.5 x 2 boundary copies
    model, x = ConvStack(64, 3), torch.randn(8, 64, 56, 56)
    gm, ctx = _prepared(model, x)
    assert channels_last(gm, ctx)
    d = _layout(ctx, "conv2d")
    assert d.applied and "predicted to pay" in d.reason and "spatial conv" in d.reason
    assert _conversions(gm) == (1, 1)
    _assert_same(model, gm, x)


@ONEDNN
@pytest.mark.parametrize("convs", [1, 2])
def test_cpu_auto_keeps_regions_whose_copies_cost_as_much(convs: int) -> None:
    # a lone conv measured 0.86-0.93x converted, a 2-conv basic block 0.87-1.30x: both kept
    model, x = ConvStack(64, convs), torch.randn(8, 64, 56, 56)
    gm, ctx = _prepared(model, x)
    assert not channels_last(gm, ctx)
    d = _layout(ctx, "conv2d")
    assert not d.applied and "does not beat 1.1x the conversions" in d.reason
    assert _conversions(gm) == (0, 0)


@ONEDNN
def test_cpu_auto_keeps_deep_small_maps_nchw() -> None:
    model, x = ConvStack(512, 2), torch.randn(8, 512, 7, 7)
    gm, ctx = _prepared(model, x)
    assert not channels_last(gm, ctx)
    d = _layout(ctx, "conv2d")
    assert not d.applied and "maps under 14x14" in d.reason
    assert ctx.notes["layout"]["regions"][0]["gain_s"] < 0


@ONEDNN
def test_cpu_auto_keeps_a_lone_depthwise_conv() -> None:
    # measured 0.34-0.66x converted: its output copy back to NCHW costs more than it saves
    model, x = nn.Conv2d(128, 128, 3, padding=1, groups=128), torch.randn(8, 128, 56, 56)
    gm, ctx = _prepared(model, x)
    assert not channels_last(gm, ctx)
    assert "depthwise conv" in _layout(ctx, "conv2d").reason


@ONEDNN
def test_cpu_auto_converts_a_whole_conv_net_with_a_pooled_head() -> None:
    model, x = ResidualConvNet(c=64), torch.randn(8, 3, 56, 56)
    gm, ctx = _prepared(model, x)
    fold_batchnorm_and_drop_dropout(gm, ctx)
    assert channels_last(gm, ctx)
    region = ctx.notes["layout"]["regions"][0]
    assert region["applied"] and region["gain_s"] > region["cost_s"]
    assert not channels_last(gm, ctx)  # idempotent in auto too
    assert "already channels_last" in _layout(ctx, "conv2d").reason
    _assert_same(model, gm, x)
