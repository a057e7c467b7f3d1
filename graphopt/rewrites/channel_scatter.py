"""Tensors placed at a :class:`~graphopt.decisions.channel_map.ChannelMap`'s positions.

The torch padding pass's weight and bias edits (identity 1 of ``decisions.channel_map``): real
values at the map's positions, zeros (or ``fill``) at the padding, so padded channels add
nothing to a consumer's sums.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from graphopt.decisions.channel_map import ChannelMap

__all__ = ["scatter_vector", "scatter_weight"]


def scatter_vector(v: torch.Tensor, positions: Sequence[int], size: int,
                   fill: float = 0.0) -> torch.Tensor:
    """A length-``size`` vector with ``v[i]`` at ``positions[i]`` and ``fill`` elsewhere."""
    out = torch.full((size,), fill, dtype=v.dtype)
    out[torch.tensor(positions, dtype=torch.long)] = v.detach()
    return out


def scatter_weight(w: torch.Tensor, groups: int, in_map: ChannelMap, out_map: ChannelMap
                   ) -> torch.Tensor:
    """Conv/linear weight ``[C_out, C_in/g, *k]`` placed at the maps' positions, zero elsewhere.

    Group ``j``'s rows go to ``out_map`` positions and its columns to ``in_map`` positions
    relative to input block ``j`` (both maps must be group-compatible, see ``group_block``).
    """
    c_out, per_in = w.shape[0], w.shape[1]
    per_out, block = c_out // groups, in_map.size // groups
    new = w.new_zeros((out_map.size, block, *w.shape[2:]))
    for j in range(groups):
        rows = torch.tensor(out_map.positions[j * per_out:(j + 1) * per_out], dtype=torch.long)
        cols = torch.tensor([in_map.positions[j * per_in + i] - j * block
                             for i in range(per_in)], dtype=torch.long)
        new[rows[:, None], cols[None, :]] = w.detach()[j * per_out:(j + 1) * per_out]
    return new
