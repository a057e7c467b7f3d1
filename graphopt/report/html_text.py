"""The two pieces every HTML panel is made of: escaped text and a table.

A leaf module (it imports nothing of the report), so that any panel can use it without the
import cycles between the section modules.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

__all__ = ["breakable", "esc", "table"]


def esc(value: Any) -> str:
    """``value`` as HTML text: names come from untrusted models, so quotes are escaped too."""
    return html.escape(str(value), quote=True)


def breakable(value: Any) -> str:
    """``esc(value)`` with a line break allowed after each ``/`` and ``+``: a long node or fused
    kernel name (an ONNX path, nodes joined by +) then wraps at its steps, not mid-word."""
    text = esc(value)
    for sep in "/+":
        text = text.replace(sep, sep + "<wbr>")
    return text


def table(head: Sequence[str], align: str, rows: Sequence[str], cls: str = "") -> str:
    """A table of already rendered ``<tr>`` rows; a header cell is right-aligned where
    ``align`` has an ``r`` (left where ``align`` is shorter than ``head``). It sits in a
    ``scroll`` box: a table too wide for its panel (a long name, a narrow window) scrolls inside
    the panel instead of spilling out of it."""
    ths = "".join(f'<th{" class=num" if a == "r" else ""}>{esc(h)}</th>'
                  for h, a in zip(head, align.ljust(len(head), "l"), strict=False))
    return (f'<div class="scroll"><table class="{cls}"><thead><tr>{ths}</tr></thead><tbody>'
            f'{"".join(rows)}</tbody></table></div>')
