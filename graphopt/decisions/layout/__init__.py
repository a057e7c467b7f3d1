"""The layout family: which convs run channels_last (NHWC), decided once on the plan and applied
by each backend. Its cases are numbered in :mod:`.channels_last`; the conv regions it decides
over are :mod:`.regions`. Entry: :func:`decide_layout`.
"""

from __future__ import annotations

from graphopt.decisions.layout.channels_last import (
    ConvLayout,
    LayoutEstimate,
    LayoutPlan,
    can_channels_last,
    decide_layout,
)

__all__ = ["ConvLayout", "LayoutEstimate", "LayoutPlan", "can_channels_last", "decide_layout"]
