"""Emitters of the plan report: JSON (deterministic), Markdown and a self-contained HTML page."""

from __future__ import annotations

import json
import logging
import math
from typing import TYPE_CHECKING, Any

from graphopt.report import html as _html
from graphopt.report import markdown as _markdown

if TYPE_CHECKING:  # ir.plan imports this package (its emitters): no import at run time
    from graphopt.ir.plan import Plan, PlanSet

__all__ = ["render_html", "render_json", "render_markdown"]

logger = logging.getLogger(__name__)


def _dump(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(", ", ": "), allow_nan=False)


def _finite(value: Any, path: str, found: list[str]) -> Any:
    """A copy of ``value`` with each NaN/inf float as None, its path appended to ``found``."""
    if isinstance(value, float) and not math.isfinite(value):
        found.append(path)
        return None
    if isinstance(value, dict):
        return {k: _finite(v, f"{path}.{k}" if path else str(k), found) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v, f"{path}[{i}]", found) for i, v in enumerate(value)]
    return value


def _without_non_finite(report: dict[str, Any]) -> dict[str, Any]:
    """The report with NaN/inf as null and their fields listed under ``non_finite``.

    ``NaN``/``Infinity`` are not JSON (RFC 8259): strict parsers (JavaScript's JSON.parse, jq,
    Go) refuse the whole file. Like JSON.stringify and serde_json, the value becomes null; unlike
    them the report says which fields, so a reader can tell "not computed" from "unknown". The
    Markdown and HTML reports already show such a number as a dash or null.
    """
    found: list[str] = []
    clean = _finite(report, "", found)
    if not found:
        return report
    logger.warning("report: %d non-finite number(s) written as null: %s", len(found),
                   ", ".join(found[:5]) + (" ..." if len(found) > 5 else ""))
    return {**clean, "non_finite": {"fields": found,
                                    "why": "NaN or infinite, which JSON cannot hold: "
                                           "written as null"}}


def render_json(report: dict[str, Any], indent: str = "") -> str:
    """Deterministic JSON: sorted keys, floats as Python's shortest repr, one node per line.

    One line per node keeps 50k-node reports diffable and lets the C encoder do the work
    (``json.dumps(indent=...)`` falls back to the pure-Python encoder, ~15x slower). It is
    always valid JSON: a NaN or infinity is written as null (``_without_non_finite``).
    """
    try:
        return _render(report, indent)
    except ValueError:  # allow_nan=False met a NaN or inf: the slow path, rarely taken
        return _render(_without_non_finite(report), indent)


def _render(report: dict[str, Any], indent: str) -> str:
    items = []
    for key in sorted(report):
        value = report[key]
        if key == "nodes" and isinstance(value, list):
            body = "[\n" + ",\n".join(f"{indent}  {_dump(n)}" for n in value) + f"\n{indent} ]"
        elif key == "plans" and isinstance(value, list):
            body = ("[\n" + ",\n".join(f"{indent}  " + _render(p, indent + "  ").rstrip()
                                        for p in value) + f"\n{indent} ]")
        else:
            body = _dump(value)
        items.append(f"{indent} {_dump(key)}: {body}")
    return "{\n" + ",\n".join(items) + f"\n{indent}}}" + ("\n" if not indent else "")


def render_markdown(report: Plan | PlanSet) -> str:
    """The Markdown report of a plan or a plan set (read a JSON report with ``Plan.from_json``)."""
    return _markdown.render_markdown(report)


def render_html(report: Plan | PlanSet) -> str:
    """The HTML report of a plan or a plan set (read a JSON report with ``Plan.from_json``)."""
    return _html.render_html(report)

