"""The choose/check split of the user's calibration batches, one rule for both backends.

The first half of the batches chooses (ranges, sensitivity, which nodes stay float) and the
rest, at most ``most`` of them, checks: checked on the batches it chose with, a lossy pass passes
by construction. With one batch nothing can be held out.
"""

from __future__ import annotations

from typing import TypeVar

__all__ = ["split"]

B = TypeVar("B")


def split(batches: list[B], most: int) -> tuple[list[B], list[B]]:
    """(the batches that choose, at most ``most`` held out to check): the first half chooses."""
    if len(batches) < 2:
        return batches, []
    cut = (len(batches) + 1) // 2
    return batches[:cut], batches[cut:cut + most]
