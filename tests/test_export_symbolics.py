"""graphopt's symbolics for the TorchScript exporter, and the opset export_torch writes.

Each symbolic is exported through ``export_torch`` and its model run in ONNX Runtime against
torch on the same inputs (fp32: 1e-6 of the output's scale; counts exactly).
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest
import torch
from torch import nn

import graphopt
from graphopt.errors import GraphoptError
from graphopt.frontends.export_symbolics import LENT_OPS, lent_symbolics
from graphopt.frontends.onnx_export import export_torch, supported_opsets
from graphopt.frontends.onnx_safety import default_opset

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning",
                                        "ignore::FutureWarning")


def _ort(proto: onnx.ModelProto, *inputs: torch.Tensor) -> list[np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {i.name: t.numpy() for i, t in zip(sess.get_inputs(), inputs,
                                                              strict=True)})


def _check(model: nn.Module, *inputs: torch.Tensor, rtol: float = 1e-6) -> onnx.ModelProto:
    """Export with the TorchScript exporter (no fallback) and compare every output."""
    exp = export_torch(model.eval(), inputs)
    assert exp.exporter == "legacy", exp.fallback_reason
    with torch.no_grad():
        ref = model(*inputs)
    refs = ref if isinstance(ref, tuple) else (ref,)
    got = _ort(exp.model, *inputs)
    assert len(got) == len(refs)
    for r, o in zip(refs, got, strict=True):
        r = r.numpy()
        assert r.shape == o.shape and r.dtype == o.dtype
        if r.dtype.kind in "biu":
            assert np.array_equal(r, o)
        else:
            scale = max(float(np.abs(r).max()), 1e-30)
            assert float(np.abs(r.astype(np.float64) - o).max()) <= rtol * scale
    return exp.model


class Diff(nn.Module):
    def forward(self, x: torch.Tensor, p: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.diff(x, n=2, dim=1, prepend=p), torch.diff(x > 0, dim=-1),
                torch.diff(x, dim=0, append=x[:1] * 0.5))


class Histc(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.histc(x, bins=7, min=-1.0, max=1.5),  # values outside are dropped
                torch.histc(x, bins=5),                       # min == max: the data's range
                torch.histc(x.round().clamp(0, 3), bins=4, min=0, max=3))  # x == max: last bin


class GroupedMM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 8, 12))

    def forward(self, a: torch.Tensor, offs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch._grouped_mm(a, self.w, offs=offs),
                torch._grouped_mm(a, self.w, offs=offs, out_dtype=torch.float32),
                torch._grouped_mm(a.reshape(4, 3, 8), self.w))


class BoolCumsum(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x > 0).cumsum(-1)


def test_diff_prepend_append_bool_and_repeated() -> None:
    model = _check(Diff(), torch.randn(3, 5), torch.randn(3, 2))
    assert "Xor" in {n.op_type for n in model.graph.node}  # bool diff is !=, as in torch


def test_histc_fixed_range_data_range_and_top_edge() -> None:
    _check(Histc(), torch.randn(4, 9) * 2)
    _check(Histc(), torch.full((3, 3), 0.25))  # one value: torch widens the range by 1


def test_grouped_mm_rows_meet_their_group_including_an_empty_one() -> None:
    offs = torch.tensor([2, 2, 7, 12], dtype=torch.int32)  # group 1 has no rows
    _check(GroupedMM(), torch.randn(12, 8), offs)


def test_bool_cumsum_is_int64_as_in_torch() -> None:
    _check(BoolCumsum(), torch.randn(2, 6))


def test_symbolics_are_lent_for_one_export_only() -> None:
    from torch.onnx._internal.torchscript_exporter import registration

    with lent_symbolics(17) as lent:
        assert set(LENT_OPS) <= set(lent)
        assert registration.registry.is_registered_op("aten::diff", 17)
    assert not registration.registry.is_registered_op("aten::diff", 17)
    with lent_symbolics(12) as lent:  # older than the opset-13 forms they use: none
        assert lent == []


def test_a_users_own_symbolic_wins() -> None:
    calls = []

    def mine(g, x, n, dim, prepend, append):  # noqa: ANN001, ANN202 - torch's signature
        calls.append(1)
        return g.op("Identity", x)

    torch.onnx.register_custom_op_symbolic("aten::diff", mine, 17)
    try:
        with lent_symbolics(17) as lent:
            assert "aten::diff" not in lent
        exp = export_torch(Diff().eval(), (torch.randn(3, 5), torch.randn(3, 2)), verify=False)
        assert calls and exp.exporter == "legacy"
    finally:
        torch.onnx.unregister_custom_op_symbolic("aten::diff", 17)


def _sets_flag(fn):  # noqa: ANN001, ANN202 - a decorator like transformers' config defaults
    @functools.wraps(fn)
    def forward(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        kwargs.setdefault("flag", True)
        return fn(self, *args, **kwargs)
    return forward


class DecoratedForward(nn.Module):
    """forward() with defaulted parameters, one of them also passed by its decorator."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(4, 4)

    @_sets_flag
    def forward(self, x: torch.Tensor, flag: bool | None = None, keep: int = 0) -> torch.Tensor:
        y = self.up(x)
        return (y.relu() if flag else y)[keep:]


def test_the_torchscript_exporter_gets_exactly_the_given_inputs() -> None:
    """Its default-filling would pass ``flag`` twice and make ``keep`` a graph input."""
    model = DecoratedForward().eval()
    exp = export_torch(model, (torch.randn(3, 4),))
    assert exp.exporter == "legacy", exp.fallback_reason
    assert [i.name for i in exp.model.graph.input] == ["x"]
    assert not model.training  # the exporter restores modes: the user's model stays in eval
    names = {n.name for n in exp.model.graph.node} | {t.name for t in exp.model.graph.initializer}
    assert {"/up/Gemm", "up.weight"} <= names  # the user's module names, no wrapper scope


# ------------------------------------------------------------------------------ opsets
def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 4)).eval()


@pytest.mark.parametrize("opset", [99, 12, 0, "17", 17.0, True])
def test_an_opset_outside_the_supported_range_is_refused(opset: object) -> None:
    lo, hi = supported_opsets()
    with pytest.raises(GraphoptError, match=f"{lo}-{hi}") as e:
        export_torch(_mlp(), (torch.randn(2, 8),), opset=opset)  # type: ignore[arg-type]
    assert "TorchScript" in str(e.value) and "dynamo" in str(e.value)


def test_supported_range_is_the_installed_exporters() -> None:
    from torch.onnx import _constants

    assert supported_opsets() == (13, max(_constants.ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET,
                                          _constants.ONNX_MAX_OPSET))


@pytest.mark.parametrize("opset", [13, 19])
def test_the_torchscript_exporter_writes_the_requested_opset(opset: int) -> None:
    exp = export_torch(_mlp(), (torch.randn(2, 8),), opset=opset)
    assert exp.exporter == "legacy" and default_opset(exp.model) == exp.opset == opset


def test_an_opset_past_the_torchscript_exporter_goes_to_dynamo_exactly() -> None:
    opset = supported_opsets()[1]
    exp = export_torch(_mlp(), (torch.randn(2, 8),), opset=opset)
    assert exp.exporter == "dynamo" and default_opset(exp.model) == opset
    assert "newer than the TorchScript exporter" in (exp.fallback_reason or "")


def test_default_opset_is_each_exporters_own() -> None:
    exp = export_torch(_mlp(), (torch.randn(2, 8),))
    assert exp.exporter == "legacy" and exp.opset == 17


def test_optimized_export_onnx_refuses_opset_99_and_writes_an_asked_one(tmp_path) -> None:
    model, x = _mlp(), torch.randn(2, 8)
    with pytest.raises(GraphoptError, match="outside what the installed exporters write"):
        graphopt.optimize(model, (x,), target="cpu", measure=False).export_onnx(
            tmp_path / "m.onnx", opset=99)
    opt = graphopt.optimize(model, (x,), target="cpu", measure=False)
    path = opt.export_onnx(tmp_path / "m19.onnx", opset=19)
    assert default_opset(onnx.load(str(path))) == 19


@torch.library.custom_op("graphopt_test::twice", mutates_args=())
def _twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_twice.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class Twice(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.graphopt_test.twice(x) + 1


@pytest.mark.slow
def test_dynamo_failure_names_the_op_without_an_onnx_function() -> None:
    with pytest.raises(GraphoptError, match="no ONNX function for graphopt_test.twice") as e:
        export_torch(Twice().eval(), (torch.randn(2, 3),), opset=21)
    assert "custom_translation_table" in e.value.fix


class FallbackGroupedMM(nn.Module):
    """transformers' own grouped-GEMM op: no TorchScript symbolic, so only dynamo exports it
    (with graphopt's translation), at opset 18; asked for 17, graphopt converts down."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 8, 16))

    def forward(self, a: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        return torch.ops.transformers.grouped_mm_fallback(a, self.w, offs).relu()


class FallbackGroupedMMNorm(FallbackGroupedMM):
    def forward(self, a: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        return nn.functional.layer_norm(super().forward(a, offs), (16,))


@pytest.mark.slow
def test_dynamo_fallback_converts_down_to_the_asked_opset_or_says_it_cannot() -> None:
    pytest.importorskip("transformers.integrations.moe")
    a, offs = torch.randn(12, 8), torch.tensor([3, 3, 9, 12], dtype=torch.int32)
    model = FallbackGroupedMM().eval()
    exp = export_torch(model, (a, offs), opset=17)
    assert exp.exporter == "dynamo" and default_opset(exp.model) == exp.opset == 17
    assert "TorchScript exporter failed" in (exp.fallback_reason or "")
    with torch.no_grad():
        ref = model(a, offs).numpy()
    got = _ort(exp.model, a, offs)[0]
    assert float(np.abs(ref - got).max()) <= 1e-6 * float(np.abs(ref).max())
    with pytest.raises(GraphoptError, match="does not convert to opset 13") as e:
        export_torch(FallbackGroupedMMNorm().eval(), (a, offs), opset=13)  # LayerNormalization
        # has no opset-13 form
    assert "pass opset=18" in (e.value.fix or "")
