"""Tensor-core padding: where it fires, where it must not, and that outputs stay equal in fp32.

Padding is dtype-independent (zeros in, zeros out), so every numeric check runs in fp32 on the
CPU at 1e-5 of the output scale; ``ctx.compute_dtype`` only picks the multiple (fp16 -> 8).
"""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

from graphopt.decisions.channel_map import ChannelMap, reshape_map, scatter_weight
from graphopt.decisions.tolerance import tolerance_for
from graphopt.options import Options
from graphopt.pass_driver import Pass
from graphopt.plan import Decision
from graphopt.rewrites.context import RewriteContext
from graphopt.rewrites.fx_utils import aten_name, val
from graphopt.rewrites.padding import pad_channels
from graphopt.rewrites.pipeline import optimize_torch, prepare
from graphopt.rewrites.verify import compare_outputs
from tests.zoo import zoo


def run_pass(model: nn.Module, inputs: tuple[torch.Tensor, ...], *, target: str = "a100",
             dtype: str = "fp16", pad: str = "always"
             ) -> tuple[fx.GraphModule, RewriteContext, bool]:
    torch.manual_seed(0)
    gm, ctx = prepare(model.eval(), inputs, target, Options(pad=pad))  # type: ignore
    ctx.compute_dtype = dtype
    changed = pad_channels(gm, ctx)
    assert_same(model, gm, inputs)
    return gm, ctx, changed


def assert_same(model: nn.Module, gm: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
    with torch.no_grad():
        result = compare_outputs(model(*inputs), gm(*inputs), tolerance_for("fp32"))
    assert all(c.within for c in result), [c.describe() for c in result]


def pad(ctx: RewriteContext, name: str, kind: str = "padding") -> Decision:
    """The GEMM's own decision (``padding``), a carry (``padding_carry``) or a slice."""
    return ctx.decisions[name][kind]


def ops(gm: fx.GraphModule) -> list[str]:
    return [aten_name(n) or n.op for n in gm.graph.nodes]


def slices(ctx: RewriteContext) -> list[tuple[str, int, int]]:
    return [(s["node"], s["real"], s["padded"]) for s in ctx.notes["padding"]["slices"]]


def seeded(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(1))


def randomize_bn(bn: nn.BatchNorm2d) -> nn.BatchNorm2d:
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-1, 1)
    return bn


class NvidiaCNN(nn.Module):
    """NVIDIA's tensor-core guide example: Conv 3->67, Conv 67->129, Linear 129->251."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 67, 3, padding=1), nn.Conv2d(67, 129, 3, padding=1)
        self.fc = nn.Linear(129, 251)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.c2(F.relu(self.c1(x))))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


class TokenCNN(nn.Module):
    """The same channels, at sizes where every GEMM is compute-bound: 7x7 stem, per-pixel FC."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 67, 7, padding=3), nn.Conv2d(67, 129, 3, padding=1)
        self.fc = nn.Linear(129, 251)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.c2(F.max_pool2d(F.relu(self.c1(x)), 4)))
        return self.fc(x.flatten(2).transpose(1, 2))


NVIDIA_DIMS = {"conv2d": {"C_in": 8, "C_out": 72}, "conv2d_1": {"C_in": 72, "C_out": 136},
               "linear": {"K": 136, "N": 256}}


# --- where it fires -----------------------------------------------------------------------------

@pytest.mark.parametrize("target", ["a100", "h100"])
def test_nvidia_example_always(target: str) -> None:
    gm, ctx, changed = run_pass(NvidiaCNN(), (seeded(2, 3, 16, 16),), target=target)
    assert changed
    for name, new in NVIDIA_DIMS.items():
        assert pad(ctx, name).applied and dict(pad(ctx, name).fields["new"]) == new
    assert dict(pad(ctx, "conv2d").fields["old"]) == {"C_in": 3, "C_out": 67}
    assert pad(ctx, "linear").fields["waste_pct"] > 0
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
    for name in ("conv2d", "conv2d_1"):
        d = pad(ctx, name)
        assert d.applied and dict(d.fields["new"]) == NVIDIA_DIMS[name], d
        assert d.fields["predicted_gain"] >= 1.1 and "margin" in d.reason
    # the FC writes the graph output: padding N to 256 would need a copy back to 251 channels
    # for the caller (charged on every backend, so torch and ONNX decide alike), which eats
    # the gain; it still reads the carried 136 channels (K absorbed with zero weights)
    fc = pad(ctx, "linear")
    assert not fc.applied and dict(fc.fields["candidate"]) == NVIDIA_DIMS["linear"], fc
    assert dict(fc.fields["new"]) == {"K": 136, "N": 251}
    assert slices(ctx) == []


def test_auto_declines_small_memory_bound_convs() -> None:
    _, ctx, _ = run_pass(NvidiaCNN(), (seeded(2, 3, 16, 16),), pad="auto")
    d = pad(ctx, "conv2d")
    assert not d.applied
    assert re.fullmatch(r"not applied: predicted \d\.\d\dx < 1\.1x margin", d.reason)
    assert d.fields["predicted_gain"] < 1.1 and dict(d.fields["candidate"])["C_out"] == 72


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
    assert dict(d.fields["old"]) == {"C_in": 20, "C_out": 36, "groups": 4}
    assert dict(d.fields["new"]) == {"C_in": 32, "C_out": 64, "groups": 4}
    # conv2d's output (20 real of 24, a prefix) is regathered per group: 4 blocks of 8
    assert {"node": "conv2d_1", "source": "relu", "from": 24, "to": 32} in \
        ctx.notes["padding"]["per_call_pads"]
    assert slices(ctx) == [("output", 36, 64)]
    assert "index_select" in ops(gm)


def test_grouped_conv_on_the_input_or_not_at_all() -> None:
    _, ctx, _ = run_pass(Grouped(first=True), (seeded(2, 20, 8, 8),))
    assert dict(pad(ctx, "conv2d").fields["new"]) == {"C_in": 32, "C_out": 64, "groups": 4}
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
    assert dw.reason.startswith("carried: depthwise") and dict(dw.fields["new"]) == {"groups": 72}
    assert dict(pad(ctx, "conv2d_3").fields["new"]) == {"C_in": 72, "C_out": 64}
    assert slices(ctx) == []


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
    assert dict(pad(ctx, "conv2d_2").fields["new"]) == {"C_in": 72, "C_out": 64}


class Concat(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(16, 3, 3, padding=1), nn.Conv2d(16, 5, 3, padding=1)
        self.c = nn.Conv2d(8, 64, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.cat([F.relu(self.a(x)), self.b(x)], dim=1))


def test_concat_along_channels_places_maps_at_offsets() -> None:
    gm, ctx, _ = run_pass(Concat(), (seeded(2, 16, 8, 8),))
    assert dict(pad(ctx, "cat", "padding_carry").fields) == {"real": 8, "padded": 16, "clean": True}
    # the consumer sees [a: 3 real of 8 | b: 5 real of 8]; its in-weights sit at 0-2 and 8-12
    assert dict(pad(ctx, "conv2d_2").fields["new"]) == {"C_in": 16, "C_out": 64}
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
    assert dict(pad(ctx, "conv2d_1").fields["new"]) == {"C_in": 72, "C_out": 64}


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


class LinearLayerNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.ln = nn.Linear(64, 67), nn.LayerNorm(67)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(F.gelu(self.fc(x)))


def test_layernorm_over_padded_features_slices_before_it() -> None:
    _, ctx, _ = run_pass(LinearLayerNorm(), (seeded(4, 10, 64),))
    assert dict(pad(ctx, "linear").fields["new"]) == {"K": 64, "N": 72}
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
    assert d.applied and dict(d.fields["old"]) == {"head_dim": 68}
    assert dict(d.fields["new"]) == {"head_dim": 72}
    sdpa = next(n for n in gm.graph.nodes if aten_name(n) == "scaled_dot_product_attention")
    assert sdpa.kwargs["scale"] == pytest.approx(1 / math.sqrt(68))
    assert val(sdpa).shape[-1] == 72
    # the head merge (H, D) -> H*D splits nothing: it is carried into the out-projection
    assert dict(pad(ctx, "linear_1").fields["new"])["K"] == 4 * 72
    assert slices(ctx) == []


def test_attention_head_dim_72_is_already_aligned_for_fp16() -> None:
    _, ctx, _ = run_pass(Attention(2, 72), (seeded(2, 16, 64),))
    d = pad(ctx, "scaled_dot_product_attention")
    assert not d.applied and d.reason == "not applied: head_dim already a multiple of 8"


class Flatten(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.fc = nn.Conv2d(16, 67, 3, padding=1), nn.Linear(67 * 16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.a(x).view(x.shape[0], -1))


def test_flatten_of_spatial_dims_scatters_the_linear_weight() -> None:
    _, ctx, _ = run_pass(Flatten(), (seeded(2, 16, 4, 4),))
    assert dict(pad(ctx, "linear").fields["new"]) == {"K": 72 * 16, "N": 16}


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
    assert dict(pad(ctx, "conv_transpose2d").fields["new"]) == {"C_in": 16, "C_out": 72}
    assert dict(pad(ctx, "conv_transpose2d_1").fields["new"]) == {"C_in": 72, "C_out": 32}
    assert dict(pad(ctx, "conv2d").fields["new"]) == {"C_in": 32, "C_out": 64}
    assert slices(ctx) == []


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
    assert dict(pad(ctx, "linear").fields["new"]) == {"K": 64, "N": 72}
    assert dict(pad(ctx, "scaled_dot_product_attention").fields["new"]) == {"head_dim": 72}
    assert ctx.notes["padding"]["per_call_pads"] == []
    assert slices(ctx) == [("output", 67, 72)]


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
    assert dict(pad(ctx, "conv2d").fields["new"]) == {"C_in": 4, "C_out": 68}
    assert pad(ctx, "conv2d").fields["multiple"] == 4
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
    _, _, info = optimize_torch(model, (seeded(2, 3, 16, 16),), "a100",
                                Options(pad="always"),
                                passes=[Pass("padding", pad_channels, option="pad")])
    assert info["passes_applied"] == ["padding"] and info["passes_reverted"] == []
    assert info["notes"]["padding"]["padded_nodes"] == ["conv2d", "conv2d_1", "linear"]


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
    assert dict(pad(ctx, "addmm").fields["new"]) == {"K": 136, "N": 256}
    assert dict(pad(ctx, "mm").fields["new"]) == {"K": 256, "N": 80}
    assert slices(ctx) == [("output", 77, 80)]
