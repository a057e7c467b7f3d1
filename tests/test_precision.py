"""Precision pass: the format choice per target, fp32 islands, casts, parameters, numerics."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

from graphopt.backends.torch.context import RewriteContext, torch_dtype
from graphopt.backends.torch.fx_utils import aten_name
from graphopt.backends.torch.pipeline import prepare
from graphopt.backends.torch.precision import reduce_precision
from graphopt.backends.torch.verify import compare_outputs
from graphopt.decisions.precision.format import choose_precision
from graphopt.decisions.tolerance import tolerance_for
from graphopt.errors import GraphoptError
from graphopt.hardware import get_target
from graphopt.ir.decision_details import PrecisionDetail
from graphopt.ir.options import Options

LOW = ("bf16", "fp16")


# ------------------------------------------------------------------------------------ models
class RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(dim) + 0.1 * torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w


class Block(nn.Module):
    """LayerNorm -> attention (softmax(qk^T) and SDPA) -> RMSNorm -> GELU MLP, residuals."""

    def __init__(self, dim: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.ln = nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.rms = RMSNorm(dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2)
                   for z in self.qkv(self.ln(x)).split(d, -1))
        manual = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, -1) @ v
        fused = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj((manual + fused).transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.rms(x))))


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1, self.bn = nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.c2, self.gn = nn.Conv2d(16, 32, 3, padding=1), nn.GroupNorm(4, 32)
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn(self.c1(x)))
        x = F.silu(self.gn(self.c2(x)))
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


class Overflowing(nn.Module):
    """Activations around 1e3 into a LayerNorm written as E[h^2] - E[h]^2: in fp16, h*h and
    mu*mu overflow (> 65504) and inf - inf is NaN."""

    def __init__(self, dim: int = 64) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.w, self.b = nn.Parameter(torch.ones(dim)), nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = (self.fc1(x) + 3.0) * 300.0
        mu = h.mean(-1, keepdim=True)
        var = (h * h).mean(-1, keepdim=True) - mu * mu
        return self.fc2((h - mu) * torch.rsqrt(var + 1e-5) * self.w + self.b)


class ExplicitCasts(nn.Module):
    """The model's own dtype choices: softmax(dtype=fp32), .float(), .to(memory_format=)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.c1(x).to(memory_format=torch.channels_last)
        p = torch.softmax(h, 1, dtype=torch.float32)
        return self.c2(p * h.float()).float()


class TiedLM(nn.Module):
    """Token ids -> embedding -> linear head sharing the embedding weight; logits and argmax."""

    def __init__(self, vocab: int = 50, dim: int = 32) -> None:
        super().__init__()
        self.emb, self.fc = nn.Embedding(vocab, dim), nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.head(F.gelu(self.fc(self.emb(ids))))
        return logits, logits.argmax(-1)


# ----------------------------------------------------------------------------------- helpers
def _seeded(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


def _rewrite(model: nn.Module, inputs: tuple[Any, ...], fmt: str, target: str = "h100",
             ) -> tuple[fx.GraphModule, RewriteContext, bool]:
    torch.manual_seed(0)
    gm, ctx = prepare(model.eval(), inputs, target)
    ctx.compute_dtype = fmt
    return gm, ctx, reduce_precision(gm, ctx)


def _runtime_dtypes(gm: fx.GraphModule, inputs: tuple[Any, ...]) -> dict[str, torch.dtype]:
    """The dtype each node's value really has when the rewritten module runs."""
    seen: dict[str, torch.dtype] = {}

    class Recorder(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            out = super().run_node(n)
            if isinstance(out, torch.Tensor):
                seen[n.name] = out.dtype
            return out

    with torch.no_grad():
        Recorder(gm).run(*inputs)
    return seen


def _assert_meta_is_runtime(gm: fx.GraphModule, dt: dict[str, torch.dtype]) -> None:
    """The dtypes the pass recorded in node.meta["val"] are the ones the module computes."""
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        if isinstance(v, torch.Tensor) and n.name in dt:
            assert v.dtype == dt[n.name], (n.name, v.dtype, dt[n.name])


def _by_op(gm: fx.GraphModule, *ops: str) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if aten_name(n) in ops]


def _check_numerics(model: nn.Module, gm: fx.GraphModule, inputs: tuple[Any, ...],
                    fmt: str) -> None:
    with torch.no_grad():
        ref, out = model(*inputs), gm(*inputs)
    result = compare_outputs(ref, out, tolerance_for(fmt))
    assert all(c.within for c in result), [c.describe() for c in result]


# ------------------------------------------------------------------------ choosing a format
@pytest.mark.parametrize(("target", "expected"), [
    ("a100", "bf16"), ("h100", "bf16"), ("b200", "bf16"), ("rtx-4090", "bf16"),
    ("v100", "fp16"), ("t4", "fp16"),
    ("xeon-8480", "bf16"), ("epyc-9654", "bf16"), ("graviton3", "bf16"),
    ("xeon-8380", "fp32"), ("epyc-7763", "fp32"),
])
def test_auto_picks_the_native_reduced_format(target: str, expected: str) -> None:
    fmt, reason = choose_precision(get_target(target), "auto")
    assert fmt == expected, reason
    assert reason.startswith(expected)


def test_auto_on_this_host_follows_its_bf16_support() -> None:
    host = get_target("cpu")
    fmt, reason = choose_precision(host, "auto")
    native = host.peak_flops.get("bf16", 0.0) > host.peak_flops["fp32"]
    assert fmt == ("bf16" if native else "fp32")
    if not native:
        assert "no native bf16" in reason


@pytest.mark.parametrize(("target", "requested", "expected", "phrase"), [
    ("h100", "fp16", "fp16", "as requested"),
    ("h100", "fp32", "fp32", "as requested"),
    ("h100", "tf32", "tf32", "as requested"),
    ("xeon-8480", "fp16", "fp16", "as requested"),  # AVX512-FP16
    ("v100", "bf16", "fp16", "does not run bf16 natively"),
    ("t4", "bf16", "fp16", "does not run bf16 natively"),
    ("xeon-8380", "bf16", "fp32", "does not run bf16 natively"),
    ("epyc-9654", "fp16", "bf16", "does not run fp16 natively"),
    ("v100", "tf32", "fp32", "no TF32 tensor cores"),
    ("xeon-8480", "tf32", "fp32", "no TF32 tensor cores"),
])
def test_explicit_requests_are_honoured_or_fall_back_with_a_reason(
        target: str, requested: str, expected: str, phrase: str) -> None:
    fmt, reason = choose_precision(get_target(target), requested)
    assert fmt == expected and phrase in reason, reason


def test_unknown_request_raises() -> None:
    with pytest.raises(GraphoptError, match="int8"):
        choose_precision(get_target("h100"), "int8")


# ------------------------------------------------------------------------ the transformer
@pytest.mark.parametrize("fmt", LOW)
def test_transformer_block_gemms_low_sensitive_ops_fp32(fmt: str) -> None:
    torch.manual_seed(0)
    model, x = Block().eval(), _seeded(2, 16, 64)
    gm, ctx, changed = _rewrite(model, (x,), fmt)
    assert changed
    low = torch_dtype(fmt)
    dt = _runtime_dtypes(gm, (x,))
    _assert_meta_is_runtime(gm, dt)
    for n in _by_op(gm, "linear", "matmul", "scaled_dot_product_attention"):
        assert dt[n.name] == low, n.name
        assert ctx.decisions[n.name]["precision"].detail == PrecisionDetail(fmt)
        assert ctx.decisions[n.name]["precision"].applied
    islands = _by_op(gm, "softmax", "layer_norm")
    rms = [n for n in gm.graph.nodes if (a := ctx.analysis(n)) and a.pattern == "rmsnorm:0"]
    assert len(islands) == 2 and len(rms) == 6
    for n in islands + rms:
        assert dt[n.name] == torch.float32, n.name
        d = ctx.decisions[n.name]["precision"]
        assert d.detail == PrecisionDetail("fp32") and d.reason.startswith("fp32 island"), d.reason
    assert "rmsnorm:0" in ctx.decisions[rms[0].name]["precision"].reason
    assert dt[next(iter(_by_op(gm, "gelu"))).name] == low  # elementwise between two GEMMs
    # parameters converted once, ahead of time: no fp32 copy of a GEMM weight is left
    params = dict(gm.named_parameters())
    assert "qkv.weight" not in params and "fc1.weight" not in params
    assert sum(p.dtype == low for p in params.values()) == 8  # 4 linears x (weight, bias)
    assert params["ln.weight"].dtype == torch.float32  # the island's parameters stay fp32
    note = ctx.notes["precision"]
    assert note["params_converted"] == 8 and note["casts_inserted"] == 6
    assert note["fp32_islands"] == 8 and note["low_nodes"] > 8
    assert note["runtime"]["allow_fp16_reduced_precision_reduction"] is False
    _check_numerics(model, gm, (x,), fmt)


# ---------------------------------------------------------------------------------- the CNN
@pytest.mark.parametrize("fmt", LOW)
def test_cnn_convs_low_batchnorm_and_groupnorm_fp32(fmt: str) -> None:
    torch.manual_seed(0)
    model, x = ConvNet().eval(), _seeded(2, 3, 16, 16)
    with torch.no_grad():  # non-trivial running statistics
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
    gm, ctx, changed = _rewrite(model, (x,), fmt)
    assert changed
    dt = _runtime_dtypes(gm, (x,))
    _assert_meta_is_runtime(gm, dt)
    convs = _by_op(gm, "conv2d", "linear")
    norms = _by_op(gm, "batch_norm", "_native_batch_norm_legit_no_training", "group_norm")
    assert len(convs) == 3 and len(norms) == 2
    assert all(dt[n.name] == torch_dtype(fmt) for n in convs)
    assert all(dt[n.name] == torch.float32 for n in norms)
    assert dict(gm.named_parameters())["bn.weight"].dtype == torch.float32
    _check_numerics(model, gm, (x,), fmt)


# ---------------------------------------------------------------------- islands matter
def test_fp32_islands_prevent_fp16_overflow_that_naive_half_hits() -> None:
    torch.manual_seed(0)
    model, x = Overflowing().eval(), _seeded(4, 64)
    with torch.no_grad():
        naive = model.half()(x.half())
    model.float()
    assert not torch.isfinite(naive).all(), "the model must overflow fp16 without islands"
    gm, ctx, _ = _rewrite(model, (x,), "fp16")
    with torch.no_grad():
        out = gm(x)
    assert torch.isfinite(out).all()
    _check_numerics(model, gm, (x,), "fp16")
    squares = [n for n in _by_op(gm, "mul") if n.args[0] is n.args[1]]
    assert len(squares) == 2
    assert all("square" in ctx.decisions[n.name]["precision"].reason for n in squares)


def test_a_square_a_pass_added_is_still_an_island() -> None:
    """Nodes with no plan node ask the same shared rule by canonical op (``CANONICAL``)."""
    torch.manual_seed(0)
    model, x = Overflowing().eval(), _seeded(4, 64)
    gm, ctx = prepare(model, (x,), "h100")
    ctx = replace(ctx, plan=replace(ctx.plan, nodes=()), compute_dtype="fp16")
    reduce_precision(gm, ctx)
    squares = [n for n in _by_op(gm, "mul") if n.args[0] is n.args[1]]
    assert len(squares) == 2
    assert all("square" in ctx.decisions[n.name]["precision"].reason for n in squares)
    _check_numerics(model, gm, (x,), "fp16")


# --------------------------------------------------------------- integers, tied weights
@pytest.mark.parametrize("fmt", LOW)
def test_integer_tensors_untouched_tied_weight_gets_a_low_copy(fmt: str) -> None:
    torch.manual_seed(0)
    model = TiedLM().eval()
    ids = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(0))
    gm, ctx, _ = _rewrite(model, (ids,), fmt)
    ids_node = next(n for n in gm.graph.nodes if n.op == "placeholder")
    assert not any(aten_name(u) == "_to_copy" for u in ids_node.users)
    dt = _runtime_dtypes(gm, (ids,))
    _assert_meta_is_runtime(gm, dt)
    assert dt[_by_op(gm, "embedding")[0].name] == torch.float32  # reads only a parameter
    assert dt[_by_op(gm, "argmax")[0].name] == torch.int64
    assert ctx.decisions[_by_op(gm, "argmax")[0].name]["precision"].reason.startswith("kept")
    params = dict(gm.named_parameters())
    assert params["emb.weight"].dtype == torch.float32  # still read by the fp32 embedding
    assert sum(p.dtype == torch_dtype(fmt) for p in params.values()) == 3  # fc w, b; head w
    with torch.no_grad():
        (ref, ref_idx), (out, idx) = model(ids), gm(ids)
    assert out.dtype == ref.dtype and idx.dtype == torch.int64
    assert torch.equal(idx, ref_idx)
    _check_numerics(model, gm, (ids,), fmt)


def test_weight_beyond_fp16_range_keeps_its_gemm_fp32_as_tf32() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)).eval()
    with torch.no_grad():
        model[0].weight.mul_(1e6)  # |w| up to ~3.5e5 > 65504
    x = _seeded(3, 8) * 1e-3  # activations stay in range: only the weight does not fit
    gm, ctx, _ = _rewrite(model, (x,), "fp16")
    first, second = _by_op(gm, "linear")
    d = ctx.decisions[first.name]["precision"]
    assert d.detail == PrecisionDetail("tf32") and "beyond fp16's range" in d.reason
    assert ctx.decisions[second.name]["precision"].detail == PrecisionDetail("fp16")
    assert ctx.notes["precision"]["runtime"]["allow_tf32"] is True
    assert dict(gm.named_parameters())["0.weight"].dtype == torch.float32
    _check_numerics(model, gm, (x,), "fp16")


# ------------------------------------------------------------------------------ idempotence
@pytest.mark.parametrize("model_fn, shape", [(Block, (2, 16, 64)), (ConvNet, (2, 3, 16, 16))])
def test_second_run_changes_nothing(model_fn: type[nn.Module], shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    x = _seeded(*shape)
    gm, ctx, changed = _rewrite(model_fn(), (x,), "bf16")
    assert changed
    code, params = gm.code, {k: (v.dtype, v.data_ptr()) for k, v in gm.named_parameters()}
    assert reduce_precision(gm, ctx) is False
    assert gm.code == code
    assert {k: (v.dtype, v.data_ptr()) for k, v in gm.named_parameters()} == params
    assert ctx.notes["precision"]["casts_inserted"] == 0
    assert ctx.notes["precision"]["casts_total"] > 0


# ------------------------------------------------------------------- fp32 / tf32: no change
def test_fp32_changes_no_dtype_but_says_why() -> None:
    torch.manual_seed(0)
    model, x = Block().eval(), _seeded(2, 16, 64)
    gm, ctx = prepare(model, (x,), "xeon-8380", Options(precision="auto"))
    ctx.compute_dtype, _ = choose_precision(ctx.target, "auto")
    code = gm.code
    assert ctx.compute_dtype == "fp32" and reduce_precision(gm, ctx) is False
    assert gm.code == code
    d = ctx.decisions[_by_op(gm, "linear")[0].name]["precision"]
    assert not d.applied and d.detail == PrecisionDetail("fp32")
    assert "no native bf16" in d.reason
    assert ctx.notes["precision"]["runtime"] == {"allow_tf32": False}


def test_tf32_marks_gemms_and_sets_the_runtime_flag() -> None:
    torch.manual_seed(0)
    model, x = Block().eval(), _seeded(2, 16, 64)
    gm, ctx = prepare(model, (x,), "h100", Options(precision="tf32"))
    ctx.compute_dtype = "tf32"
    assert reduce_precision(gm, ctx) is False
    gemms = _by_op(gm, "linear", "matmul", "scaled_dot_product_attention")
    assert all(ctx.decisions[n.name]["precision"].detail == PrecisionDetail("tf32") for n in gemms)
    assert "softmax" not in ctx.decisions
    assert ctx.notes["precision"]["runtime"] == {"allow_tf32": True}


@pytest.mark.parametrize("fmt", LOW)
def test_the_models_explicit_dtypes_are_kept(fmt: str) -> None:
    torch.manual_seed(0)
    model, x = ExplicitCasts().eval(), _seeded(2, 3, 8, 8)
    gm, ctx, _ = _rewrite(model, (x,), fmt)
    dt = _runtime_dtypes(gm, (x,))
    _assert_meta_is_runtime(gm, dt)
    assert all(dt[n.name] == torch_dtype(fmt) for n in _by_op(gm, "conv2d"))
    softmax = _by_op(gm, "softmax")[0]
    assert dt[softmax.name] == torch.float32
    assert ctx.decisions[softmax.name]["precision"].reason.startswith("kept fp32")
    _check_numerics(model, gm, (x,), fmt)
