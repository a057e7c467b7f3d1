"""The two pieces every HTML panel is made of: escaped text and a table.

A leaf module (it imports nothing of the report), so that any panel can use it without the
import cycles between the section modules.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

__all__ = ["esc", "table"]


def esc(value: Any) -> str:
    """``value`` as HTML text: names come from untrusted models, so quotes are escaped too."""
    return html.escape(str(value), quote=True)


def table(head: Sequence[str], align: str, rows: Sequence[str], cls: str = "") -> str:
    """A table of already rendered ``<tr>`` rows; a header cell is right-aligned where
    ``align`` has an ``r`` (left where ``align`` is shorter than ``head``)."""
    ths = "".join(f'<th{" class=num" if a == "r" else ""}>{esc(h)}</th>'
                  for h, a in zip(head, align.ljust(len(head), "l"), strict=False))
    return (f'<table class="{cls}"><thead><tr>{ths}</tr></thead><tbody>{"".join(rows)}'
            f"</tbody></table>")
