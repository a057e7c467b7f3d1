"""Emitters of the plan report: JSON (deterministic), Markdown and a self-contained HTML page."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["render_html", "render_json", "render_markdown"]


def render_json(report: dict[str, Any]) -> str:
    """Deterministic JSON: sorted keys, fixed separators, floats as Python's shortest repr."""
    return json.dumps(report, sort_keys=True, indent=1, allow_nan=False) + "\n"


def render_markdown(report: dict[str, Any]) -> str:
    from graphopt.report.markdown import render_markdown as render

    return render(report)


def render_html(report: dict[str, Any]) -> str:
    from graphopt.report.html import render_html as render

    return render(report)
