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
    """Multi-head self-attention through SDPA with head_dim 72 (9 x 16 bytes in fp16, but not a
    multiple of 16 elements as FlashAttention-style int8/fp8 kernels want)."""

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


class OddResidualCNN(nn.Module):
    """A residual CNN with channel counts tensor cores dislike."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 37, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(37)
        self.c1 = nn.Conv2d(37, 37, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(37)
        self.down = nn.Conv2d(37, 75, 3, stride=2, padding=1)
        self.head = nn.Linear(75, 13)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.stem(x)))
        x = F.relu(x + self.bn2(self.c1(x)))
        x = F.relu(self.down(x))
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


class TensorCoreGuideCNN(nn.Module):
    """NVIDIA's tensor-core guide example: Conv 3->67, Conv 67->129, Linear 129->251."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 67, 3, padding=1)
        self.c2 = nn.Conv2d(67, 129, 3, padding=1)
        self.fc = nn.Linear(129, 251)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.c2(F.relu(self.c1(x))))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


class NormZoo(nn.Module):
    """Transposed conv, GroupNorm, LayerNorm over channels-last features, sigmoid gating."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(5, 12, 3, padding=1)
        self.gn = nn.GroupNorm(3, 12)
        self.up = nn.ConvTranspose2d(12, 7, 2, stride=2)
        self.ln = nn.LayerNorm(7)
        self.fc = nn.Linear(7, 9)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.gn(self.conv(x)))
        x = self.up(x) * torch.sigmoid(self.up(x).mean(dim=(2, 3), keepdim=True))
        return self.fc(self.ln(x.permute(0, 2, 3, 1)))


class OddMLP(nn.Module):
    def __init__(self, widths: tuple[int, ...] = (61, 130, 99, 17)) -> None:
        super().__init__()
        pairs = zip(widths, widths[1:], strict=False)
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in pairs)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = self.drop(F.gelu(x))
        return x


class TransformerBlock(nn.Module):
    """Pre-norm encoder block, head_dim 72, GELU MLP."""

    def __init__(self, dim: int = 288, heads: int = 4, hidden: int = 700) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def zoo() -> dict[str, tuple[nn.Module, tuple[torch.Tensor, ...]]]:
    """Every zoo model in eval mode with a seeded example batch."""
    torch.manual_seed(0)
    models: dict[str, tuple[nn.Module, tuple[torch.Tensor, ...]]] = {
        "odd_residual_cnn": (OddResidualCNN(), (torch.randn(2, 3, 16, 16),)),
        "tc_guide_cnn": (TensorCoreGuideCNN(), (torch.randn(2, 3, 16, 16),)),
        "convnet_grouped_depthwise": (ConvNet(), (torch.randn(2, 3, 16, 16),)),
        "norm_zoo": (NormZoo(), (torch.randn(2, 5, 8, 8),)),
        "odd_mlp": (OddMLP(), (torch.randn(4, 61),)),
        "transformer_hd72": (TransformerBlock(), (torch.randn(2, 10, 288),)),
        "rmsnorm_swiglu": (RMSNormMLP(), (torch.randn(2, 8, 64),)),
    }
    for m, _ in models.values():
        m.eval()
        for mod in m.modules():  # non-trivial BN statistics, so folding is really tested
            if isinstance(mod, nn.BatchNorm2d):
                with torch.no_grad():
                    mod.running_mean.uniform_(-0.5, 0.5)
                    mod.running_var.uniform_(0.5, 2.0)
                    mod.weight.uniform_(0.5, 1.5)
                    mod.bias.uniform_(-0.2, 0.2)
    return models
