"""The torch frontend on a mixture-of-experts layer's ops: grouped GEMM, sort, histc.

A hand-written MoE routing (the shape of transformers' ``grouped_mm`` experts path) must come out
with no ``other`` node: the grouped GEMM is a gemm with the FLOPs of one expert per row (not of
every expert), sort a full-length TopK, histc a Histogram reduction, contiguous a Copy.
torch.export's meta kernel for ``_grouped_mm`` takes bf16 only (transformers calls its own
fallback op in fp32, which the Mixtral zoo test covers end to end; ``test_export_symbolics``
exports the fp32 op).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import graphopt

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

TOKENS, HIDDEN, FFN, EXPERTS, TOP_K = 16, 32, 64, 4, 2


class TinyMoE(nn.Module):
    """Route each token to its top-2 experts; run the experts as one grouped GEMM."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.router = nn.Linear(HIDDEN, EXPERTS, bias=False)
        self.up = nn.Parameter(torch.randn(EXPERTS, HIDDEN, FFN) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.router(x).t().contiguous().t()
        weights, experts = torch.topk(logits.softmax(-1), TOP_K, dim=-1)
        flat = experts.reshape(-1)
        order, perm = torch.sort(flat)
        counts = torch.histc(order.float(), bins=EXPERTS, min=0, max=EXPERTS - 1)
        offs = torch.cumsum(counts, dim=0).to(torch.int32)
        rows = x[perm // TOP_K].to(torch.bfloat16)
        out = torch._grouped_mm(rows, self.up.to(torch.bfloat16), offs=offs).float()
        back = torch.empty_like(perm)
        back[perm] = torch.arange(perm.numel())
        out = out[back] * weights.reshape(-1, 1)
        return out.view(TOKENS, TOP_K, FFN).sum(1)


def test_moe_ops_are_classified_and_the_grouped_gemm_counts_one_expert_per_row() -> None:
    model, x = TinyMoE().eval(), torch.randn(TOKENS, HIDDEN)
    plan = graphopt.plan(model, (x,), target="h100")
    by_op = {n.op.split(".")[1]: n for n in plan.nodes if n.op.startswith("aten.")}
    assert not [n.op for n in plan.nodes if n.analysis.kernel_class.value == "other"]
    gmm = by_op["_grouped_mm"]
    assert gmm.op_type == "MatMul" and gmm.analysis.kernel_class.value == "gemm"
    rows = TOKENS * TOP_K
    assert dict(gmm.analysis.dims) == {"M": rows, "N": FFN, "K": HIDDEN, "batch": 1}
    assert gmm.analysis.flops == 2 * rows * HIDDEN * FFN  # not EXPERTS times that
    assert by_op["sort"].op_type == "TopK" and by_op["sort"].analysis.kernel_class.value == \
        "reduction"
    assert by_op["histc"].op_type == "Histogram"
    assert by_op["contiguous"].op_type == "Copy"
