"""Emitters of the plan report: JSON (deterministic), Markdown and a self-contained HTML page."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["render_html", "render_json", "render_markdown"]


def _dump(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(", ", ": "), allow_nan=False)


def render_json(report: dict[str, Any], indent: str = "") -> str:
    """Deterministic JSON: sorted keys, floats as Python's shortest repr, one node per line.

    One line per node keeps 50k-node reports diffable and lets the C encoder do the work
    (``json.dumps(indent=...)`` falls back to the pure-Python encoder, ~15x slower).
    """
    items = []
    for key in sorted(report):
        value = report[key]
        if key == "nodes" and isinstance(value, list):
            body = "[\n" + ",\n".join(f"{indent}  {_dump(n)}" for n in value) + f"\n{indent} ]"
        elif key == "plans" and isinstance(value, list):
            body = ("[\n" + ",\n".join(f"{indent}  " + render_json(p, indent + "  ").rstrip()
                                        for p in value) + f"\n{indent} ]")
        else:
            body = _dump(value)
        items.append(f"{indent} {_dump(key)}: {body}")
    return "{\n" + ",\n".join(items) + f"\n{indent}}}" + ("\n" if not indent else "")


def render_markdown(report: dict[str, Any]) -> str:
    from graphopt.report.markdown import render_markdown as render

    return render(report)


def render_html(report: dict[str, Any]) -> str:
    from graphopt.report.html import render_html as render

    return render(report)
