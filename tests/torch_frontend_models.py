"""Helpers and models shared by the torch frontend tests (test_torch_frontend*.py): op counts,
the one node of a type, a well-formedness check, and small hand-built models."""

from __future__ import annotations

from collections import Counter

import torch
import torch.nn.functional as F
from torch import nn

from graphopt.ir.graph import Graph, Node


def ops(g: Graph) -> Counter[str]:
    return Counter(n.op_type for n in g.nodes)


def only(g: Graph, op_type: str) -> Node:
    found = [n for n in g.nodes if n.op_type == op_type]
    assert len(found) == 1, (op_type, ops(g))
    return found[0]


def check_wellformed(g: Graph) -> None:
    """Every tensor a node names exists, no getitem survived, names are unique."""
    assert len({n.name for n in g.nodes}) == len(g.nodes)
    for n in g.nodes:
        assert "getitem" not in n.source_op
        for t in [*n.inputs, *n.outputs]:
            assert t == "" or t in g.tensors, (n, t)
    assert all(t in g.tensors for t in g.inputs + g.outputs)


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 8, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, stride=2, padding=1, groups=2)
        self.bn = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2)
        self.gap = nn.AdaptiveAvgPool2d(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gap(self.pool(F.relu(self.bn(self.conv(x))))).flatten(1)


class ManualAttention(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        s = torch.matmul(q, k.transpose(-2, -1)) / 8.0
        return torch.matmul(s.masked_fill(mask, float("-inf")).softmax(-1), v)


class DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.bn = nn.BatchNorm1d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn(self.fc(x))
        if y.sum() > 0:  # export cannot guard on this; make_fx runs it
            return y * 2
        return y - 1
