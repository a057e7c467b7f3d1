"""Tensor-core padding carried through the ops between GEMMs, or sliced where it must not reach.

Residual adds, concats, per-channel affine ops and gates carry the padded channels on; channel
reductions, norms over the channel axis and mismatched operands slice back to the real channels.
Every numeric check runs in fp32 on the CPU (see test_padding.py); the shared helpers and models
are in tests/padding_models.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from graphopt.backends.torch.fx_utils import aten_name
from graphopt.ir.decision_details import PaddingCarryDetail
from tests.padding_models import LinearLayerNorm, ops, pad, randomize_bn, run_pass, seeded, slices


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(16, 67, 3, padding=1), nn.Conv2d(67, 67, 3, padding=1)
        self.c = nn.Conv2d(67, 64, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.a(x))
        return self.c(F.relu(h + self.b(h)))


def test_residual_add_of_equally_padded_branches_is_carried() -> None:
    gm, ctx, _ = run_pass(Residual(), (seeded(2, 16, 8, 8),))
    assert pad(ctx, "add", "padding_carry").reason.startswith(
        "carried: Add of two equally padded tensors")
    assert slices(ctx) == [] and "slice" not in ops(gm)
    assert dict(pad(ctx, "conv2d_2").detail.new) == {"C_in": 72, "C_out": 64}


class Concat(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(16, 3, 3, padding=1), nn.Conv2d(16, 5, 3, padding=1)
        self.c = nn.Conv2d(8, 64, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.cat([F.relu(self.a(x)), self.b(x)], dim=1))


def test_concat_along_channels_places_maps_at_offsets() -> None:
    gm, ctx, _ = run_pass(Concat(), (seeded(2, 16, 8, 8),))
    assert pad(ctx, "cat", "padding_carry").detail == PaddingCarryDetail(real=8, padded=16,
                                                                         clean=True)
    # the consumer sees [a: 3 real of 8 | b: 5 real of 8]; its in-weights sit at 0-2 and 8-12
    assert dict(pad(ctx, "conv2d_2").detail.new) == {"C_in": 16, "C_out": 64}
    w = next(n for n in gm.graph.nodes if n.name == "conv2d_2").args[1]
    weight = getattr(gm, w.target)
    nonzero = weight.abs().sum(dim=(0, 2, 3)) != 0
    assert nonzero.nonzero().flatten().tolist() == [0, 1, 2, 8, 9, 10, 11, 12]
    assert slices(ctx) == []


# --- where the padding must not reach -----------------------------------------------------------

class SigmoidMean(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(16, 67, 3, padding=1), nn.Conv2d(67, 64, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.a(x).sigmoid()
        return s.mean(1), self.b(s)


def test_sigmoid_then_channel_mean_slices_before_the_reduction() -> None:
    gm, ctx, _ = run_pass(SigmoidMean(), (seeded(2, 16, 8, 8),))
    assert "f(0) != 0" in pad(ctx, "sigmoid", "padding_carry").reason
    # the mean would count sigmoid(0) = 0.5 in 5 padded channels: sliced; the conv ignores them
    assert slices(ctx) == [("mean", 67, 72)]
    assert "reduces over the padded channel axis" in pad(ctx, "mean", "padding_slice").reason
    assert dict(pad(ctx, "conv2d_1").detail.new) == {"C_in": 72, "C_out": 64}


class ConvGroupNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.gn = nn.Conv2d(16, 66, 3, padding=1), nn.GroupNorm(3, 66)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gn(self.a(x))


def test_groupnorm_over_padded_groups_slices_before_it() -> None:
    _, ctx, _ = run_pass(ConvGroupNorm(), (seeded(2, 16, 8, 8),))
    assert slices(ctx) == [("group_norm", 66, 72)]
    assert "GroupNormalization statistics would include the padded channels" in \
        pad(ctx, "group_norm", "padding_slice").reason


def test_layernorm_over_padded_features_slices_before_it() -> None:
    _, ctx, _ = run_pass(LinearLayerNorm(), (seeded(4, 10, 64),))
    assert dict(pad(ctx, "linear").detail.new) == {"K": 64, "N": 72}
    assert pad(ctx, "gelu", "padding_carry").reason.startswith("carried")
    assert slices(ctx) == [("layer_norm", 67, 72)]


class ConvBN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(16, 67, 3, padding=1), nn.Conv2d(67, 64, 1)
        self.bn = randomize_bn(nn.BatchNorm2d(67))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.a(x)
        return self.b(F.relu(self.bn(h))), h.sum()


def test_eval_batchnorm_is_carried_with_padded_params() -> None:
    gm, ctx, _ = run_pass(ConvBN(), (seeded(2, 16, 8, 8),))
    assert pad(ctx, "batch_norm", "padding_carry").reason.startswith(
        "carried: BatchNormalization is per-channel affine")
    bn = next(n for n in gm.graph.nodes if aten_name(n) == "batch_norm")
    weight, bias, mean, var = (getattr(gm, a.target) for a in bn.args[1:5])
    assert weight.shape == (72,) and weight[67:].eq(0).all() and bias[67:].eq(0).all()
    assert mean[67:].eq(0).all() and var[67:].eq(1).all()
    assert slices(ctx) == [("sum_1", 67, 72)]  # the full sum over channels must not see padding


class Flatten(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.fc = nn.Conv2d(16, 67, 3, padding=1), nn.Linear(67 * 16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.a(x).view(x.shape[0], -1))


def test_flatten_of_spatial_dims_scatters_the_linear_weight() -> None:
    _, ctx, _ = run_pass(Flatten(), (seeded(2, 16, 4, 4),))
    assert dict(pad(ctx, "linear").detail.new) == {"K": 72 * 16, "N": 16}


class SqueezeExcite(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.out = nn.Conv2d(16, 67, 3, padding=1), nn.Conv2d(67, 64, 1)
        self.f1, self.f2 = nn.Conv2d(67, 16, 1), nn.Conv2d(16, 67, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.silu(self.a(x))
        gate = torch.sigmoid(self.f2(F.relu(self.f1(h.mean((2, 3), keepdim=True)))))
        return self.out(h * gate)


def test_sigmoid_gate_times_zero_padding_stays_clean() -> None:
    gm, ctx, _ = run_pass(SqueezeExcite(), (seeded(2, 16, 8, 8),))
    assert pad(ctx, "mean", "padding_carry").reason.startswith(
        "carried: ReduceMean reduces other axes")
    assert pad(ctx, "mul", "padding_carry").reason.startswith("carried: Mul of two equally padded")
    assert slices(ctx) == []


class Mismatch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(67, 67, 3, padding=1), nn.Conv2d(67, 64, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(F.relu(self.a(x)) + x)


def test_add_with_an_unpadded_operand_slices() -> None:
    _, ctx, _ = run_pass(Mismatch(), (seeded(2, 67, 8, 8),))
    assert slices(ctx) == [("add", 67, 72)]
    assert "not padded the same way" in pad(ctx, "add", "padding_slice").reason


class LayerScale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(16, 67, 3, padding=1), nn.Conv2d(67, 64, 1)
        self.gamma = nn.Parameter(torch.rand(1, 67, 1, 1) + 0.5)
        self.beta = nn.Parameter(torch.randn(67, 1, 1))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = (self.a(x) * self.gamma + self.beta) / self.gamma
        return self.b(h), h.amax(dim=1)


def test_per_channel_constants_are_padded_ahead_of_time() -> None:
    gm, ctx, _ = run_pass(LayerScale(), (seeded(2, 16, 8, 8),))
    for name in ("mul", "add", "div"):
        assert "per-channel constant padded ahead of time" in \
            pad(ctx, name, "padding_carry").reason
    div = next(n for n in gm.graph.nodes if aten_name(n) == "div")
    divisor = getattr(gm, div.args[1].target)
    assert divisor.shape == (1, 72, 1, 1) and divisor[0, 67:].eq(1).all()
    assert slices(ctx) == [("amax", 67, 72)]


class ProjectedSDPA(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(64, 67)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.q(x)
        return F.scaled_dot_product_attention(q, q, q)


def test_sdpa_reads_a_zero_tail_padded_projection_as_is() -> None:
    gm, ctx, _ = run_pass(ProjectedSDPA(), (seeded(2, 8, 64),))
    assert dict(pad(ctx, "linear").detail.new) == {"K": 64, "N": 72}
    assert dict(pad(ctx, "scaled_dot_product_attention").detail.new) == {"head_dim": 72}
    assert ctx.notes["padding"]["per_call_pads"] == []
    assert slices(ctx) == [("output", 67, 72)]
