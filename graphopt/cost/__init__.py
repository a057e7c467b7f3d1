"""Cost model: roofline time per node per target, and transfers between devices."""

from __future__ import annotations

from graphopt.cost.roofline import (
    NodeCost,
    alignment_efficiency,
    estimate,
    estimate_all,
    tc_alignment,
)
from graphopt.cost.transfer import link_between, transfer_time_s

__all__ = ["NodeCost", "alignment_efficiency", "estimate", "estimate_all", "link_between",
           "tc_alignment", "transfer_time_s"]
