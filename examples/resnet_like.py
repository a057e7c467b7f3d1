"""A small ResNet-like CNN with channel counts tensor cores dislike (the demo model).

Used by `make demo`: `graphopt plan examples/resnet_like.py:build --target h100`.
"""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    """conv-bn-relu-conv-bn + identity, the basic residual block."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(y)))


class ResNetLike(nn.Module):
    def __init__(self, widths: tuple[int, ...] = (67, 129, 251), classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 7, stride=2, padding=3, bias=False),
                                  nn.BatchNorm2d(widths[0]), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        layers: list[nn.Module] = []
        for i, w in enumerate(widths):
            if i:
                layers += [nn.Conv2d(widths[i - 1], w, 3, stride=2, padding=1, bias=False),
                           nn.BatchNorm2d(w), nn.ReLU()]
            layers += [Block(w), Block(w)]
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(widths[-1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def build(batch: int = 8, resolution: int = 224) -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The model in eval mode and one example batch."""
    torch.manual_seed(0)
    return ResNetLike().eval(), (torch.randn(batch, 3, resolution, resolution),)
