"""Issue 31, item 8: einsum, repeat_interleave, glu, polar and the scatters get a class and a cost.

Each op is planned in a tiny module; its node's class, dims, FLOPs and bytes are compared with a
count made by hand here (fp32: 4 bytes, int64 indices: 8, complex64: 8). Einsum's reading of an
equation (:mod:`graphopt.analysis.einsum`) is checked on its own as well, for the forms the
plan cases do not reach.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

import graphopt
from graphopt.analysis.einsum import einsum_work
from graphopt.analysis.kernel_class import KernelClass as K
from tests.test_op_coverage import _Fn


def _node(fn, inputs, op: str):
    plan = graphopt.plan(_Fn(fn), inputs, target="cpu")
    found = [n for n in plan.nodes if n.op.rsplit(".", 1)[0] == op]
    assert found, f"{op} not in {[n.op for n in plan.nodes]}"
    return found[0]


def _r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


_IDX2 = torch.tensor([0, 2])  # two rows: 16 bytes of int64
_IDX32 = torch.tensor([[0, 1], [1, 2], [2, 3]])  # [3, 2]: 48 bytes


def _in_place(method: str, *args):
    def fn(x, *rest):
        y = x.clone()
        getattr(y, method)(*args, *rest)
        return y * 1
    return fn


# (name, fn, inputs, traced op, class, dims, FLOPs, bytes read, bytes written)
CASES = [
    # [2, 3, 4] x [2, 4, 5]: 2 * batch 2 * M 3 * N 5 * K 4
    ("einsum_bmm", lambda a, b: torch.einsum("bij,bjk->bik", a, b), (_r(2, 3, 4), _r(2, 4, 5)),
     "aten.einsum", K.GEMM, {"M": 3, "N": 5, "K": 4, "batch": 2}, 2 * 2 * 3 * 5 * 4,
     (24 + 40) * 4, 30 * 4),
    # the ellipsis dims of x only: folded into M = 2 * 3 * 4, like a Linear
    ("einsum_linear", lambda x, w: torch.einsum("...ij,jk->...ik", x, w),
     (_r(2, 3, 4, 6), _r(6, 5)), "aten.einsum", K.GEMM, {"M": 24, "N": 5, "K": 6, "batch": 1},
     2 * 24 * 5 * 6, (144 + 30) * 4, 120 * 4),
    # a matrix times a vector: N = 1
    ("einsum_gemv", lambda a, v: torch.einsum("ij,j->i", a, v), (_r(3, 4), _r(4)),
     "aten.einsum", K.GEMV, {"M": 3, "N": 1, "K": 4, "batch": 1}, 2 * 3 * 4, 16 * 4, 3 * 4),
    # an outer product: one multiply per output element
    ("einsum_outer", lambda a, b: torch.einsum("i,j->ij", a, b), (_r(3), _r(4)),
     "aten.einsum", K.ELEMENTWISE, {"numel": 12}, 12, 7 * 4, 12 * 4),
    # a row sum: one add per input element
    ("einsum_sum", lambda a: torch.einsum("ij->i", a), (_r(3, 4),),
     "aten.einsum", K.REDUCTION, {"numel": 3, "input_numel": 12}, 12, 12 * 4, 3 * 4),
    # a permutation: torch returns a view
    ("einsum_permute", lambda a: torch.einsum("ij->ji", a) + 1, (_r(3, 4),),
     "aten.einsum", K.VIEW, {"numel": 12}, 0, 0, 0),
    # each of 12 elements twice along dim 1: reads 12, writes 24
    ("repeat_interleave", lambda x: x.repeat_interleave(2, dim=1), (_r(3, 4),),
     "aten.repeat_interleave", K.DATA_MOVEMENT, {"numel": 24}, 0, 12 * 4, 24 * 4),
    # rows repeated 1, 2, 3 times: 6 rows of 4; reads x and the 3 int64 counts
    ("repeat_interleave_tensor",
     lambda x: x.repeat_interleave(torch.tensor([1, 2, 3]), dim=0, output_size=6), (_r(3, 4),),
     "aten.repeat_interleave", K.DATA_MOVEMENT, {"numel": 24}, 0, 12 * 4 + 24, 24 * 4),
    # [3, 8] -> [3, 4]: a sigmoid (4) and a multiply (1) per output element
    ("glu", lambda x: F.glu(x, -1), (_r(3, 8),), "aten.glu", K.ELEMENTWISE, {"numel": 12},
     5 * 12, 24 * 4, 12 * 4),
    # a cos, a sin (4 each) and two multiplies per element; writes complex64 (8 bytes)
    ("polar", lambda m, a: torch.view_as_real(torch.polar(m, a)), (_r(3, 4).abs(), _r(3, 4)),
     "aten.polar", K.ELEMENTWISE, {"numel": 12}, 10 * 12, 24 * 4, 12 * 8),
    # a copy of x with 6 elements overwritten: reads x, index, src; writes x
    ("scatter", lambda x, s: x.scatter(1, _IDX32, s), (_r(3, 4), _r(3, 2)),
     "aten.scatter", K.DATA_MOVEMENT, {"numel": 12, "updates": 6}, 0, 48 + 48 + 24, 48),
    # a scalar into one element per row: 3 updates, index [3, 1]
    ("scatter_value", lambda x: x.scatter(1, torch.tensor([[0], [1], [2]]), 1.5), (_r(3, 4),),
     "aten.scatter", K.DATA_MOVEMENT, {"numel": 12, "updates": 3}, 0, 48 + 24, 48),
    # in place: reads index and src, writes the 6 updated elements only
    ("scatter_", _in_place("scatter_", 1, _IDX32), (_r(3, 4), _r(3, 2)),
     "aten.scatter_", K.DATA_MOVEMENT, {"numel": 12, "updates": 6}, 0, 48 + 24, 6 * 4),
    # in place, adding: one add per update, and the 6 old values read
    ("scatter_add_", _in_place("scatter_add_", 1, _IDX32), (_r(3, 4), _r(3, 2)),
     "aten.scatter_add_", K.DATA_MOVEMENT, {"numel": 12, "updates": 6}, 6, 48 + 24 + 24, 24),
    ("scatter_reduce_amax", lambda x, s: x.scatter_reduce(1, _IDX32, s, "amax"),
     (_r(3, 4), _r(3, 2)), "aten.scatter_reduce", K.DATA_MOVEMENT,
     {"numel": 12, "updates": 6}, 6, 48 + 48 + 24, 48),
    # mean: a sum and a divide per update
    ("scatter_reduce_mean", lambda x, s: x.scatter_reduce(1, _IDX32, s, "mean"),
     (_r(3, 4), _r(3, 2)), "aten.scatter_reduce", K.DATA_MOVEMENT,
     {"numel": 12, "updates": 6}, 12, 48 + 48 + 24, 48),
    # two whole rows of 4 from source [2, 4]
    ("index_copy", lambda x, s: x.index_copy(0, _IDX2, s), (_r(3, 4), _r(2, 4)),
     "aten.index_copy", K.DATA_MOVEMENT, {"numel": 12, "updates": 8}, 0, 48 + 16 + 32, 48),
    ("index_copy_", _in_place("index_copy_", 0, _IDX2), (_r(3, 4), _r(2, 4)),
     "aten.index_copy_", K.DATA_MOVEMENT, {"numel": 12, "updates": 8}, 0, 16 + 32, 32),
    ("index_add_", _in_place("index_add_", 0, _IDX2), (_r(3, 4), _r(2, 4)),
     "aten.index_add_", K.DATA_MOVEMENT, {"numel": 12, "updates": 8}, 8, 16 + 32 + 32, 32),
    ("index_fill", lambda x: x.index_fill(0, _IDX2, 2.0), (_r(3, 4),),
     "aten.index_fill", K.DATA_MOVEMENT, {"numel": 12, "updates": 8}, 0, 48 + 16, 48),
    # x[1] = s, functionalized
    ("select_scatter", lambda x, s: torch.select_scatter(x, s, 0, 1), (_r(3, 4), _r(4)),
     "aten.select_scatter", K.DATA_MOVEMENT, {"numel": 12, "updates": 4}, 0, 48 + 16, 48),
    ("slice_scatter", lambda x, s: torch.slice_scatter(x, s, 0, 0, 2), (_r(3, 4), _r(2, 4)),
     "aten.slice_scatter", K.DATA_MOVEMENT, {"numel": 12, "updates": 8}, 0, 48 + 32, 48),
    # at most min(12, 12) elements from source; the bool mask is 12 bytes
    ("masked_scatter", lambda x, m, s: x.masked_scatter(m, s), (_r(3, 4), _r(3, 4) > 0, _r(12)),
     "aten.masked_scatter", K.DATA_MOVEMENT, {"numel": 12, "updates": 12}, 0, 48 + 12 + 48, 48),
]


@pytest.mark.parametrize(("name", "fn", "inputs", "op", "kernel", "dims", "flops", "read",
                          "written"), CASES, ids=[c[0] for c in CASES])
def test_op_class_dims_flops_and_bytes(name, fn, inputs, op, kernel, dims, flops, read,
                                       written) -> None:
    node = _node(fn, inputs, op)
    a = node.analysis
    assert a.kernel_class is kernel, (name, node.op_type, a.kernel_class)
    assert "unsupported_op" not in a.flags, (name, node.op_type)
    assert dict(a.dims) == dims, name
    assert a.flops == flops, name
    assert (a.bytes_read, a.bytes_written) == (read, written), name
    assert kernel is K.VIEW or node.cost.est_time_s > 0  # a roofline cost


@pytest.mark.parametrize(("equation", "shapes", "kernel", "dims", "flops"), [
    # no arrow: the output is the letters used once, sorted: "ik"
    ("ij,jk", [(3, 4), (4, 5)], K.GEMM, {"M": 3, "N": 5, "K": 4, "batch": 1}, 2 * 3 * 5 * 4),
    # left to right: (ij,jk -> ik: 2*2*4*3 = 48), then (ik,kl -> il: 2*2*5*4 = 80); dims of
    # the bigger step
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)], K.GEMM, {"M": 2, "N": 5, "K": 4, "batch": 1},
     48 + 80),
    # i summed out of the first operand alone (12 adds), then a [1, 4] x [4, 5] product
    ("ij,jk->k", [(3, 4), (4, 5)], K.GEMV, {"M": 1, "N": 5, "K": 4, "batch": 1}, 12 + 40),
    # a broadcast product with no summed letter: one multiply per output element
    ("bi,bi->bi", [(2, 4), (2, 4)], K.ELEMENTWISE, {"numel": 8}, 8),
    # attention scores with the ellipsis over batch and heads: batch = 2 * 3
    ("...qd,...kd->...qk", [(2, 3, 8, 16), (2, 3, 8, 16)], K.GEMM,
     {"M": 8, "N": 8, "K": 16, "batch": 6}, 2 * 6 * 8 * 8 * 16),
])
def test_einsum_reads_the_equation(equation, shapes, kernel, dims, flops) -> None:
    work = einsum_work(equation, shapes)
    assert work is not None
    assert (work.kernel_class, work.dims, work.flops) == (kernel, dims, flops)


def test_einsum_that_does_not_fit_its_operands_is_unknown() -> None:
    assert einsum_work("ij,jk->ik", [(3, 4)]) is None  # one operand for two terms
    assert einsum_work("ijk->i", [(3, 4)]) is None  # three letters for a 2-D operand
    assert einsum_work("ij->k", [(3, 4)]) is None  # an output letter no operand has
