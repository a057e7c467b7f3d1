"""Index maps of padded channel axes: where each real channel sits inside a padded axis.

Pure index arithmetic on shapes, shared by the torch and the ONNX padding passes (no torch here:
planning or optimizing an ``.onnx`` file must not import it).

A tensor whose channel axis was padded is described by a :class:`ChannelMap`: the axis, its
padded length, and for every real channel ``i`` the position ``positions[i]`` it occupies.
Every other position is padding. ``clean`` says the padding holds exact zeros (a conv with
zero-padded weights and bias writes zeros there); after an op with ``f(0) != 0`` (sigmoid) it
holds finite junk, which only a consumer with zero weights at those positions may read.

Identities the maps rely on:

1. Zero weights absorb padding: ``sum_k W'[n, k] x'[k] = sum_i W[n, i] x[i]`` when
   ``W'[:, positions] = W`` and ``W'`` is zero elsewhere, whatever ``x'`` holds there.
2. A reshape that merges the channel axis with real (unpadded) axes keeps each real element's
   offset inside the merged axis computable: ``(outer, c, inner) -> outer*P*I + p_c*I + inner``.
3. Concat along the channel axis shifts each input's positions by the padded length before it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

__all__ = ["ChannelMap", "reshape_map", "round_up", "scatter_axis", "scatter_weight"]


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


@dataclass(frozen=True)
class ChannelMap:
    """Where the real channels of one tensor sit inside its padded ``axis`` of length ``size``."""

    axis: int
    size: int
    positions: tuple[int, ...]
    clean: bool = True  # padding positions hold exact zeros

    @classmethod
    def identity(cls, axis: int, channels: int) -> ChannelMap:
        return cls(axis, channels, tuple(range(channels)))

    @classmethod
    def grouped(cls, axis: int, channels: int, groups: int, block: int) -> ChannelMap:
        """Group ``j``'s ``channels // groups`` channels at the start of block ``j``."""
        per = channels // groups
        return cls(axis, groups * block,
                   tuple(j * block + i for j in range(groups) for i in range(per)))

    @property
    def real(self) -> int:
        return len(self.positions)

    @property
    def is_prefix(self) -> bool:
        return self.positions == tuple(range(self.real))

    @property
    def is_padded(self) -> bool:
        return self.size != self.real

    def same_layout(self, other: ChannelMap) -> bool:
        return (self.axis, self.size, self.positions) == (other.axis, other.size, other.positions)

    def moved(self, axis: int, clean: bool | None = None) -> ChannelMap:
        return replace(self, axis=axis, clean=self.clean if clean is None else clean)

    def zero_slot(self) -> int | None:
        """A padding position known to hold zero, for gathers that need one."""
        if not self.clean or not self.is_padded:
            return None
        taken = set(self.positions)
        return next(p for p in range(self.size) if p not in taken)

    def group_block(self, groups: int) -> int | None:
        """Block length if each group's real channels lie inside its own equal block."""
        if groups == 1:
            return self.size
        if self.size % groups or self.real % groups:
            return None
        block, per = self.size // groups, self.real // groups
        ok = all(p // block == c // per for c, p in enumerate(self.positions))
        return block if ok else None

    @staticmethod
    def concat(maps: Sequence[ChannelMap], axis: int) -> ChannelMap:
        positions: list[int] = []
        offset = 0
        for m in maps:
            positions.extend(offset + p for p in m.positions)
            offset += m.size
        return ChannelMap(axis, offset, tuple(positions), all(m.clean for m in maps))


def _dim_groups(old: Sequence[int], new: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    """Pair runs of ``old`` dims with runs of ``new`` dims of equal product (row-major reshape)."""
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(old) or j < len(new):
        gi, gj = [], []
        po = pn = 1
        if i < len(old):
            gi.append(i)
            po, i = old[i], i + 1
        if j < len(new):
            gj.append(j)
            pn, j = new[j], j + 1
        while po != pn:
            if po < pn and i < len(old):
                gi.append(i)
                po, i = po * old[i], i + 1
            elif pn < po and j < len(new):
                gj.append(j)
                pn, j = pn * new[j], j + 1
            else:
                return []
        groups.append((gi, gj))
    return groups


def reshape_map(cmap: ChannelMap, old: Sequence[int], new: Sequence[int]) -> ChannelMap | None:
    """The map after a row-major reshape of the real shape ``old`` to ``new`` (identity 2).

    ``None`` when the reshape splits the padded axis (its positions would not factor) or the
    shapes do not pair up. Merges with real axes on either side are carried.
    """
    if cmap.real <= 1 or math.prod(old) != math.prod(new):
        return None  # a 1-channel axis is ambiguous under squeeze; leave it to a slice
    for gi, gj in _dim_groups(old, new):
        if cmap.axis not in gi:
            continue
        if len(gj) != 1:
            return None
        outer = math.prod(old[gi[0]:cmap.axis])
        inner = math.prod(old[cmap.axis + 1:gi[-1] + 1])
        psize = cmap.size * inner
        positions = tuple(o * psize + p * inner + r for o in range(outer)
                          for p in cmap.positions for r in range(inner))
        return ChannelMap(gj[0], outer * psize, positions, cmap.clean)
    return None


def scatter_axis(a: Any, axis: int, positions: Sequence[int], size: int, fill: float,
                 xp: Any) -> Any:
    """``a`` with ``axis`` spread to ``size``: slice ``i`` at ``positions[i]``, ``fill`` elsewhere.

    ``xp`` is the array module (``numpy`` or ``torch``), so both backends place constants the
    same way (identity 1: zeros where a consumer's sums would read the padding).
    """
    shape = list(a.shape)
    shape[axis] = size
    out = xp.full(tuple(shape), fill, dtype=a.dtype)
    idx: list[Any] = [slice(None)] * a.ndim
    idx[axis] = xp.asarray(list(positions))
    out[tuple(idx)] = a
    return out


def scatter_weight(w: Any, groups: int, in_map: ChannelMap, out_map: ChannelMap, xp: Any) -> Any:
    """Weight ``[C_out, C_in/g, *k]`` at the maps' positions (per group), zero elsewhere.

    Group ``j``'s rows go to ``out_map`` positions and its columns to ``in_map`` positions
    relative to input block ``j`` (both maps must be group-compatible, see ``group_block``).
    """
    c_out, per_in = w.shape[0], w.shape[1]
    per_out, block = c_out // groups, in_map.size // groups
    new = xp.full((out_map.size, block, *w.shape[2:]), 0, dtype=w.dtype)
    for j in range(groups):
        rows = xp.asarray(list(out_map.positions[j * per_out:(j + 1) * per_out]))
        cols = xp.asarray([in_map.positions[j * per_in + i] - j * block for i in range(per_in)])
        new[rows[:, None], cols[None, :]] = w[j * per_out:(j + 1) * per_out]
    return new
