"""How sure a measured speedup is: the 95% interval of paired rounds' speedups.

A measured choice (keep a pass, pick an artifact) changes the simpler default only when the
whole interval clears its margin (``backends/timing``, ``decisions/deploy``). Rounds are paired:
both candidates timed back to back in one round, so a busy machine's drift cancels in each
round's ratio and shows up as a wider interval instead of a flipped answer.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

__all__ = ["clears", "speedup_interval"]

#: two-sided 95% Student-t quantiles by degrees of freedom (NIST/SEMATECH e-Handbook of
#: Statistical Methods, table 1.3.6.7.2); past 30 the normal's 1.96
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131,
        16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086, 25: 2.060, 30: 2.042}


def _t95(df: int) -> float:
    return _T95.get(df) or next((v for k, v in sorted(_T95.items()) if k >= df), 1.96)


def speedup_interval(slow: Sequence[float], fast: Sequence[float]) -> tuple[float, float]:
    """95% interval of ``slow / fast`` from paired rounds' times (the mean log ratio, Student
    t); (0, inf) with fewer than two pairs."""
    logs = [math.log(a / max(b, 1e-12)) for a, b in zip(slow, fast, strict=False)
            if a > 0 and b > 0]
    if len(logs) < 2:
        return 0.0, math.inf
    mean, sd = statistics.fmean(logs), statistics.stdev(logs)
    half = _t95(len(logs) - 1) * sd / math.sqrt(len(logs))
    return math.exp(mean - half), math.exp(mean + half)


def clears(interval: tuple[float, float], margin: float) -> bool:
    """Whether the whole interval is above ``1 + margin``."""
    return interval[0] > 1 + margin
