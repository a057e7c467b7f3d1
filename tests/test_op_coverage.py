"""Op coverage (issue 24, item 7): ATen ops real models use get their real kernel class.

Each op below was classed ``other`` (no FLOPs, no bytes, no roofline) before: a tiny module
using it is planned and its node must carry the class, a canonical op graphopt knows (so the
plan does not list it as unsupported) and, where it moves data, the bytes it moves. The zoo
test plans every shared model and fails on any ``other`` node not in :data:`ALLOWED_OTHER`.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import graphopt
from graphopt.analysis.kernel_class import KernelClass
from tests.zoo import zoo

#: ops that may stay ``other``, each with the reason; empty: every op in the zoo has a class
ALLOWED_OTHER: dict[str, str] = {}


class _Fn(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return self.fn(*xs)


def _fill(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    y.fill_(2.0)
    return y * x


def _meshgrid(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    gx, gy = torch.meshgrid(a, b, indexing="ij")
    return gx + gy


class _WeightNorm(nn.Module):
    """What ``nn.utils.parametrizations.weight_norm`` computes: ``g * v / ||v||`` per row."""

    def __init__(self) -> None:
        super().__init__()
        self.v = nn.Parameter(torch.randn(4, 8))
        self.g = nn.Parameter(torch.randn(4, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ torch._weight_norm(self.v, self.g, 0).t()


# (name, module, inputs, the op as traced, kernel class, bytes read, bytes written)
_F32 = 4
CASES = [
    ("reshape_as", _Fn(lambda x, y: x.reshape_as(y) + 1), (torch.randn(2, 12), torch.randn(4, 6)),
     "aten.reshape_as", KernelClass.VIEW, 0, 0),
    ("view_as", _Fn(lambda x, y: x.view_as(y) + 1), (torch.randn(2, 12), torch.randn(4, 6)),
     "aten.view_as", KernelClass.VIEW, 0, 0),
    ("multiply", _Fn(lambda x: torch.multiply(x, x)), (torch.randn(4, 5),),
     "aten.multiply", KernelClass.ELEMENTWISE, 20 * _F32, 20 * _F32),
    ("divide", _Fn(lambda x, y: torch.divide(x, y)), (torch.randn(4, 5), torch.rand(4, 5) + 1),
     "aten.divide", KernelClass.ELEMENTWISE, 40 * _F32, 20 * _F32),
    # [1, 2, 6, 6] -> [1, 2*9, 36]: reads the image once, writes every tap
    ("im2col", _Fn(lambda x: F.unfold(x, 3, padding=1)), (torch.randn(1, 2, 6, 6),),
     "aten.im2col", KernelClass.DATA_MOVEMENT, 72 * _F32, 648 * _F32),
    ("col2im", _Fn(lambda x: F.fold(x, (6, 6), 3, padding=1)), (torch.randn(1, 18, 36),),
     "aten.col2im", KernelClass.DATA_MOVEMENT, 648 * _F32, 72 * _F32),
    ("meshgrid", _Fn(_meshgrid), (torch.randn(3), torch.randn(4)),
     "aten.meshgrid", KernelClass.VIEW, 0, 0),
    # fill_ reads nothing: it writes its 12 elements
    ("fill_", _Fn(_fill), (torch.randn(3, 4),), "aten.fill_", KernelClass.DATA_MOVEMENT, 0,
     12 * _F32),
    ("_weight_norm", _WeightNorm(), (torch.randn(2, 8),), "aten._weight_norm", KernelClass.NORM,
     (32 + 4) * _F32, 32 * _F32),
]


def _node(plan, op: str):
    found = [n for n in plan.nodes if n.op.rsplit(".", 1)[0] == op]
    assert found, f"{op} not in {[n.op for n in plan.nodes]}"
    return found[0]


@pytest.mark.parametrize(("name", "model", "inputs", "op", "kernel", "read", "written"), CASES,
                         ids=[c[0] for c in CASES])
def test_op_gets_its_kernel_class(name, model, inputs, op, kernel, read, written) -> None:
    plan = graphopt.plan(model, inputs, target="cpu")
    node = _node(plan, op)
    a = node.analysis
    assert a.kernel_class is kernel, (name, node.op_type, a.kernel_class)
    assert "unsupported_op" not in a.flags, (name, node.op_type)
    assert (a.bytes_read, a.bytes_written) == (read, written), name
    assert kernel is KernelClass.VIEW or node.cost.est_time_s > 0  # a roofline cost


def test_weight_norm_counts_one_norm_per_row() -> None:
    """``_weight_norm(v[4, 8], g, dim=0)``: 4 norms over 8 elements, 4 FLOPs per element."""
    node = _node(graphopt.plan(_WeightNorm(), (torch.randn(2, 8),), target="cpu"),
                 "aten._weight_norm")
    assert node.analysis.dims == {"numel": 32, "rows": 4, "cols": 8}
    assert node.analysis.flops == 4 * 32


def _assert_no_other(name: str, plan) -> None:
    other = sorted({n.op for n in plan.nodes if n.analysis.kernel_class is KernelClass.OTHER
                    and n.op.rsplit(".", 1)[0] not in ALLOWED_OTHER})
    assert not other, f"{name}: classed 'other' (class them, or allow them with a reason): {other}"


@pytest.mark.parametrize("name", sorted(zoo()))
def test_small_zoo_has_no_other_op(name: str) -> None:
    model, inputs = zoo()[name]
    _assert_no_other(name, graphopt.plan(model, inputs, target="cpu"))


@pytest.mark.slow
@pytest.mark.zoo
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning",
                            "ignore::UserWarning")
def test_arch_zoo_has_no_other_op() -> None:
    """Every transformers architecture of the zoo, planned for this CPU."""
    pytest.importorskip("transformers")
    from tests.arch_zoo import ARCHS, build

    for arch in ARCHS:
        model, inputs = build(arch.name)
        _assert_no_other(arch.name, graphopt.plan(model, inputs, target="cpu"))
