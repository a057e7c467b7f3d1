"""The decision kinds, named once for the planner, both backends and the report."""

from __future__ import annotations

__all__ = ["REWRITE_KINDS"]

#: the decision kinds the rewrite passes make (padding, layout, precision, quantize); the
#: planner's own (exec_path, device...) are per plan
REWRITE_KINDS = ("padding", "layout", "precision", "quantize")
