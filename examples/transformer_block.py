"""A pre-norm transformer block with RMSNorm, rotary embedding, attention and SwiGLU, written
out op by op the way LLaMA-style code does (the patterns graphopt recognizes).

`graphopt plan examples/transformer_block.py:build --target h100`
"""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class Block(nn.Module):
    def __init__(self, dim: int = 576, heads: int = 8, hidden: int = 1536) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.norm1, self.norm2 = RMSNorm(dim), RMSNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, self.head_dim).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        scores = q @ k.transpose(-2, -1) / self.head_dim ** 0.5
        attn = torch.softmax(scores, dim=-1) @ v
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, d))
        h = self.norm2(x)
        return x + self.down(nn.functional.silu(self.gate(h)) * self.up(h))


def build(batch: int = 4, seq: int = 128) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    block = Block().eval()
    pos = torch.arange(seq, dtype=torch.float32)[:, None]
    freqs = pos / 10000 ** (torch.arange(0, block.head_dim, 2) / block.head_dim)
    emb = torch.cat((freqs, freqs), dim=-1)
    return block, (torch.randn(batch, seq, 576), emb.cos(), emb.sin())
