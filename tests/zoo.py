"""Small torch models shared by the tests (plain torch: no torchvision here)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class ConvNet(nn.Module):
    """Plain, grouped and depthwise convs with BN, then a Linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.c2 = nn.Conv2d(16, 32, 3, stride=2, padding=1, groups=4)
        self.dw = nn.Conv2d(32, 32, 3, padding=1, groups=32)
        self.fc = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn(self.c1(x)))
        x = F.relu(self.dw(self.c2(x)))
        return self.fc(x.mean(dim=(2, 3)))


class Attention(nn.Module):
    """Multi-head self-attention through SDPA with head_dim 72 (not a multiple of 16 bytes)."""

    def __init__(self, dim: int = 288, heads: int = 4) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (t.reshape(b, s, self.heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        o = F.scaled_dot_product_attention(q, k, v)
        return self.out(o.transpose(1, 2).reshape(b, s, d))


class ManualAttention(Attention):
    """The same attention written out: matmul -> scale -> softmax -> matmul."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (t.reshape(b, s, self.heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        p = torch.softmax(q @ k.transpose(-2, -1) / self.head_dim**0.5, dim=-1)
        return self.out((p @ v).transpose(1, 2).reshape(b, s, d))


class RMSNormMLP(nn.Module):
    """Decomposed RMSNorm (pow -> mean -> rsqrt -> mul) before a SwiGLU MLP."""

    def __init__(self, dim: int = 64, hidden: int = 176) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
        return self.down(F.silu(self.gate(h)) * self.up(h))


class ResidualMLP(nn.Module):
    """``blocks`` residual blocks of Linear 64->64 + LayerNorm (the planning benchmark)."""

    def __init__(self, blocks: int, width: int = 64) -> None:
        super().__init__()
        self.lins = nn.ModuleList(nn.Linear(width, width) for _ in range(blocks))
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for lin, norm in zip(self.lins, self.norms, strict=False):
            x = norm(x + lin(x))
        return x
