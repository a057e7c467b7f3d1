"""The kernel-class colours of the HTML report, one table for every panel that draws a class.

The roofline, the node table and the partition timeline colour a node by its kernel class; they
take the colours from here so a class looks the same everywhere on the page.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # ir.plan imports the report package (its emitters): no import at run time
    from graphopt.ir.plan import Plan

__all__ = ["CLASS_COLORS", "class_colors"]

# Fixed colours for the kernel classes graphopt emits; others take the spare palette in name order.
CLASS_COLORS = {"gemm": "#2f64d0", "gemv": "#6f9be8", "attention": "#8a55d4",
               "quant_gemm": "#3d3fa8", "quant_dot": "#8285dc", "conv": "#16a08a",
               "rmsnorm": "#c7a020", "norm": "#9c7f16", "softmax": "#e35d5d", "rope": "#d2476f",
               "silu": "#f2a54e", "elementwise": "#e57d2f", "reduction": "#a0522d",
               "data_movement": "#7c8a9c", "view": "#c3cad3", "control_flow": "#4f7f5a",
               "other": "#5b6470"}
_SPARE = ("#2a9d8f", "#e76f51", "#6d597a", "#bc6c25", "#457b9d", "#9c89b8", "#588157", "#d4a373")


def class_colors(plans: Sequence[Plan]) -> dict[str, str]:
    """Fixed colours for the known classes, spare ones for the rest in name order."""
    classes = sorted({n.analysis.kernel_class.value for p in plans for n in p.nodes})
    spare = iter(_SPARE * (len(classes) // len(_SPARE) + 1))
    return {c: CLASS_COLORS.get(c) or next(spare) for c in classes}
