"""Tensor-core padding of the GEMMs themselves: where it fires, where not, the index maps.

Padding is dtype-independent (zeros in, zeros out), so every numeric check runs in fp32 on the
CPU at 1e-5 of the output scale; ``ctx.compute_dtype`` only picks the multiple (fp16 -> 8).
How the padded channels are carried through (or cut before) the ops between GEMMs is in
test_padding_carry.py; the shared helpers and models are in tests/padding_models.py.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from graphopt.backends.driver import Pass
from graphopt.backends.torch.fx_utils import aten_name, val
from graphopt.backends.torch.padding import pad_channels
from graphopt.backends.torch.pipeline import optimize_torch
from graphopt.decisions.padding.channel_map import ChannelMap, reshape_map, scatter_weight
from graphopt.ir.options import Options
from tests.padding_models import (
    NVIDIA_DIMS,
    LinearLayerNorm,
    NvidiaCNN,
    TokenCNN,
    ops,
    pad,
    run_pass,
    seeded,
    slices,
)
from tests.zoo import zoo

# --- where it fires -----------------------------------------------------------------------------

@pytest.mark.parametrize("target", ["a100", "h100"])
def test_nvidia_example_always(target: str) -> None:
    gm, ctx, changed = run_pass(NvidiaCNN(), (seeded(2, 3, 16, 16),), target=target)
    assert changed
    for name, new in NVIDIA_DIMS.items():
        assert pad(ctx, name).applied and dict(pad(ctx, name).detail.new) == new
    assert dict(pad(ctx, "conv2d").detail.old) == {"C_in": 3, "C_out": 67}
    assert pad(ctx, "linear").detail.waste_pct > 0
    # one per-call pad (the image, 3 -> 8), one slice (the output, back to 251); pooling and
    # flatten carry the 136 channels into the Linear
    assert ctx.notes["padding"]["per_call_pads"] == [
        {"node": "conv2d", "source": "x", "from": 3, "to": 8}]
    assert slices(ctx) == [("output", 251, 256)]
    for name in ("relu", "relu_1", "adaptive_avg_pool2d", "flatten"):
        assert pad(ctx, name, "padding_carry").reason.startswith("carried")
    assert val(next(n for n in gm.graph.nodes if n.name == "conv2d_1")).shape[1] == 136
    applied = {n for n, ds in ctx.decisions.items() if "padding" in ds and ds["padding"].applied}
    assert applied == set(NVIDIA_DIMS)  # "padding" is each GEMM's own decision


def test_nvidia_example_auto_where_compute_bound() -> None:
    gm, ctx, _ = run_pass(TokenCNN(), (seeded(32, 3, 128, 128),), pad="auto")
    # the stem keeps its 3 input channels: the conv library pads each filter tap's channels
    # to a 16-byte vector itself (cost.conv_taps), so a per-call pad of the image to 8
    # channels would only add a copy; its 67 output channels are padded to 72
    want = {"conv2d": {"C_in": 3, "C_out": 72}, "conv2d_1": NVIDIA_DIMS["conv2d_1"]}
    for name in ("conv2d", "conv2d_1"):
        d = pad(ctx, name)
        assert d.applied and dict(d.detail.new) == want[name], d
        assert d.detail.predicted_gain >= 1.1 and "margin" in d.reason
    # the FC writes the graph output: padding N to 256 would need a copy back to 251 channels
    # for the caller (charged on every backend, so torch and ONNX decide alike), which eats
    # the gain; it still reads the carried 136 channels (K absorbed with zero weights)
    fc = pad(ctx, "linear")
    assert not fc.applied and dict(fc.detail.candidate) == NVIDIA_DIMS["linear"], fc
    assert dict(fc.detail.new) == {"K": 136, "N": 251}
    assert slices(ctx) == []


def test_auto_declines_small_memory_bound_convs() -> None:
    _, ctx, _ = run_pass(NvidiaCNN(), (seeded(2, 3, 16, 16),), pad="auto")
    d = pad(ctx, "conv2d")
    assert not d.applied
    assert re.fullmatch(r"not applied: predicted \d\.\d\dx < 1\.1x margin", d.reason)
    assert d.detail.predicted_gain < 1.1 and dict(d.detail.candidate)["C_out"] == 72


class Grouped(nn.Module):
    def __init__(self, first: bool) -> None:
        super().__init__()
        self.first = first
        self.c1 = nn.Conv2d(3, 20, 3, padding=1)
        self.g = nn.Conv2d(20, 36, 3, padding=1, groups=4)  # 5 -> 9 channels per group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.g(x if self.first else F.relu(self.c1(x)))


def test_grouped_conv_padded_per_group() -> None:
    gm, ctx, _ = run_pass(Grouped(first=False), (seeded(2, 3, 8, 8),))
    d = pad(ctx, "conv2d_1")
    assert dict(d.detail.old) == {"C_in": 20, "C_out": 36, "groups": 4}
    assert dict(d.detail.new) == {"C_in": 32, "C_out": 64, "groups": 4}
    # conv2d's output (20 real of 24, a prefix) is regathered per group: 4 blocks of 8
    assert {"node": "conv2d_1", "source": "relu", "from": 24, "to": 32} in \
        ctx.notes["padding"]["per_call_pads"]
    assert slices(ctx) == [("output", 36, 64)]
    assert "index_select" in ops(gm)


def test_grouped_conv_on_the_input_or_not_at_all() -> None:
    _, ctx, _ = run_pass(Grouped(first=True), (seeded(2, 20, 8, 8),))
    assert dict(pad(ctx, "conv2d").detail.new) == {"C_in": 32, "C_out": 64, "groups": 4}
    _, ctx, changed = run_pass(Grouped(first=True), (seeded(2, 20, 8, 8),), pad="auto")
    assert not changed and not pad(ctx, "conv2d").applied
    assert pad(ctx, "conv2d").reason.startswith("not applied: predicted")


class Depthwise(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.dw0 = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.c1 = nn.Conv2d(16, 67, 1)
        self.dw = nn.Conv2d(67, 67, 3, padding=1, groups=67)
        self.pw = nn.Conv2d(67, 64, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pw(F.relu(self.dw(F.relu(self.c1(self.dw0(x))))))


def test_depthwise_conv_not_padded_but_carries_padded_input() -> None:
    gm, ctx, _ = run_pass(Depthwise(), (seeded(2, 16, 8, 8),))
    assert pad(ctx, "conv2d").reason == ("not applied: depthwise conv (groups == C_in): "
                                         "per-group padding would multiply the work")
    assert not pad(ctx, "conv2d").applied
    assert pad(ctx, "conv2d_2").reason.startswith("not applied: depthwise conv")
    dw = pad(ctx, "conv2d_2", "padding_carry")
    assert dw.reason.startswith("carried: depthwise") and dict(dw.detail.new) == {"groups": 72}
    assert dict(pad(ctx, "conv2d_3").detail.new) == {"C_in": 72, "C_out": 64}
    assert slices(ctx) == []


class Attention(nn.Module):
    def __init__(self, heads: int, head_dim: int) -> None:
        super().__init__()
        self.h, self.d = heads, head_dim
        self.qkv = nn.Linear(64, 3 * heads * head_dim)
        self.out = nn.Linear(heads * head_dim, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.h, self.d).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.out(y.transpose(1, 2).reshape(b, s, self.h * self.d))


def test_attention_head_dim_padded_with_scale_kept() -> None:
    gm, ctx, _ = run_pass(Attention(4, 68), (seeded(2, 16, 64),))
    d = pad(ctx, "scaled_dot_product_attention")
    assert d.applied and dict(d.detail.old) == {"head_dim": 68}
    assert dict(d.detail.new) == {"head_dim": 72}
    sdpa = next(n for n in gm.graph.nodes if aten_name(n) == "scaled_dot_product_attention")
    assert sdpa.kwargs["scale"] == pytest.approx(1 / math.sqrt(68))
    assert val(sdpa).shape[-1] == 72
    # the head merge (H, D) -> H*D splits nothing: it is carried into the out-projection
    assert dict(pad(ctx, "linear_1").detail.new)["K"] == 4 * 72
    assert slices(ctx) == []


def test_attention_head_dim_72_is_already_aligned_for_fp16() -> None:
    _, ctx, _ = run_pass(Attention(2, 72), (seeded(2, 16, 64),))
    d = pad(ctx, "scaled_dot_product_attention")
    assert not d.applied and d.reason == "not applied: head_dim already a multiple of 8"


class Transposed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.ConvTranspose2d(16, 67, 2, stride=2)
        self.b = nn.ConvTranspose2d(67, 30, 3, padding=1)
        self.c = nn.Conv2d(30, 64, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(self.b(F.relu6(self.a(x))))


def test_transposed_convs_pad_and_absorb() -> None:
    _, ctx, _ = run_pass(Transposed(), (seeded(2, 16, 4, 4),))
    assert dict(pad(ctx, "conv_transpose2d").detail.new) == {"C_in": 16, "C_out": 72}
    assert dict(pad(ctx, "conv_transpose2d_1").detail.new) == {"C_in": 72, "C_out": 32}
    assert dict(pad(ctx, "conv2d").detail.new) == {"C_in": 32, "C_out": 64}
    assert slices(ctx) == []


class AddmmMm(nn.Module):
    """GPT-2's Conv1D (``addmm`` with a ``[K, N]`` weight) feeding a bare ``mm``."""

    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(129, 250) * 0.1)
        self.b1 = nn.Parameter(torch.randn(250))
        self.w2 = nn.Parameter(torch.randn(250, 77) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.mm(torch.relu(torch.addmm(self.b1, x, self.w1)), self.w2)


def test_addmm_and_mm_weights_are_padded_like_linear() -> None:
    gm, ctx, changed = run_pass(AddmmMm(), (seeded(64, 129),))
    assert changed
    assert dict(pad(ctx, "addmm").detail.new) == {"K": 136, "N": 256}
    assert dict(pad(ctx, "mm").detail.new) == {"K": 256, "N": 80}
    assert slices(ctx) == [("output", 77, 80)]


class ScaledAddmm(nn.Module):
    """``addmm`` with beta/alpha: the torch backend has no edit for the scaled form."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(129, 250) * 0.1)
        self.b = nn.Parameter(torch.randn(250))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.b, x, self.w, beta=0.5, alpha=2.0)


def test_scaled_addmm_is_left_alone_with_the_reason() -> None:
    _, ctx, changed = run_pass(ScaledAddmm(), (seeded(64, 129),))
    d = pad(ctx, "addmm")
    assert not changed and not d.applied
    assert "rewrites linear, addmm, mm and conv weights, not addmm" in d.reason



@pytest.mark.parametrize("mode", ["always", "auto"])
@pytest.mark.parametrize("name", sorted(zoo()))
def test_zoo_models_stay_equal(name: str, mode: str) -> None:
    model, inputs = zoo()[name]
    run_pass(model, inputs, pad=mode)


# --- not applied ----------------------------------------------------------------------------------

def test_pad_never_changes_nothing() -> None:
    gm, ctx, changed = run_pass(NvidiaCNN(), (seeded(2, 3, 16, 16),), pad="never")
    assert not changed
    for name in NVIDIA_DIMS:
        assert pad(ctx, name).reason == "not applied: pad='never'"
    assert "constant_pad_nd" not in ops(gm)


def test_cpu_fp32_has_no_alignment_requirement() -> None:
    _, ctx, changed = run_pass(NvidiaCNN(), (seeded(2, 3, 16, 16),), target="cpu",
                               dtype="fp32", pad="auto")
    assert not changed
    for name in NVIDIA_DIMS:
        assert pad(ctx, name).reason == ("not applied: target cpu has no tensor-core "
                                         "alignment requirement")
    _, ctx, _ = run_pass(NvidiaCNN(), (seeded(2, 3, 16, 16),), target="cpu", dtype="fp32")
    assert pad(ctx, "conv2d").reason == ("pad='always': padded to multiples of 4 although the "
                                         "target cpu has no tensor-core alignment requirement")


def test_fp32_on_a100_convs_use_tf32_multiples_linears_none() -> None:
    _, ctx, _ = run_pass(NvidiaCNN(), (seeded(2, 3, 16, 16),), dtype="fp32")
    assert dict(pad(ctx, "conv2d").detail.new) == {"C_in": 4, "C_out": 68}
    assert pad(ctx, "conv2d").detail.multiple == 4
    _, ctx, _ = run_pass(LinearLayerNorm(), (seeded(4, 10, 64),), dtype="fp32", pad="auto")
    assert "runs on CUDA cores" in pad(ctx, "linear").reason


def test_idempotent_on_the_padded_module() -> None:
    x = (seeded(2, 3, 16, 16),)
    gm, _, _ = run_pass(NvidiaCNN(), x)
    again, ctx, _ = run_pass(gm.eval(), x)
    assert ctx.notes["padding"]["padded_nodes"] == []
    assert ctx.notes["padding"]["per_call_pads"] == []
    for name in ("conv2d", "conv2d_1", "linear"):
        assert pad(ctx, name).reason.startswith("not applied:") and "already multiples of 8" \
            in pad(ctx, name).reason


def test_pipeline_verifies_and_keeps_the_pass() -> None:
    model = NvidiaCNN().eval()
    info = optimize_torch(model, (seeded(2, 3, 16, 16),), "a100", Options(pad="always"),
                          passes=[Pass("padding", pad_channels, option="pad")]).report
    assert info.passes_applied == ("padding",) and info.passes_reverted == ()
    assert info.notes["padding"]["padded_nodes"] == ["conv2d", "conv2d_1", "linear"]


# --- the index maps on their own ------------------------------------------------------------------

def test_reshape_map_merges_and_refuses_splits() -> None:
    m = ChannelMap(1, 4, (0, 1, 2))
    merged = reshape_map(m, (2, 3, 2, 2), (2, 12))
    assert merged is not None and merged.size == 16 and merged.positions[:5] == (0, 1, 2, 3, 4)
    assert reshape_map(ChannelMap(1, 8, tuple(range(6))), (2, 6), (2, 2, 3)) is None
    same = reshape_map(m, (2, 3, 1, 1), (2, 3))
    assert same == ChannelMap(1, 4, (0, 1, 2))


def test_scatter_weight_per_group() -> None:
    w = torch.arange(1.0, 1 + 4 * 2 * 1).reshape(4, 2, 1)  # 2 groups: 2 out x 2 in each
    in_map = ChannelMap.grouped(1, 4, 2, 3)
    out_map = ChannelMap.grouped(1, 4, 2, 3)
    new = scatter_weight(w, 2, in_map, out_map, torch)
    assert new.shape == (6, 3, 1)
    assert torch.equal(new[[0, 1, 3, 4]][:, [0, 1]], w) and new[2].eq(0).all()
