"""Cost model: roofline time per node per target, transfers between devices, and the
what-if calculator (``estimate_op``) over the same model."""

from __future__ import annotations

from graphopt.cost.roofline import (
    NodeCost,
    alignment_efficiency,
    estimate,
    estimate_all,
    tc_alignment,
)
from graphopt.cost.transfer import link_between, transfer_time_s
from graphopt.cost.whatif import OpEstimate, estimate_op

__all__ = ["NodeCost", "OpEstimate", "alignment_efficiency", "estimate", "estimate_all",
           "estimate_op", "link_between", "tc_alignment", "transfer_time_s"]
