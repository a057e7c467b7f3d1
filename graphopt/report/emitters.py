"""The plan's reports as methods: ``plan.to_json()``, ``plan.save(json=..., html=...)``.

:class:`ReportEmitters` is the base of :class:`graphopt.ir.plan.Plan` and ``PlanSet``: the
records hold what was planned, and their rendering lives here with the renderers, so the plan
module never imports the report's sections (which read the plan's decision kinds).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from graphopt.files.outputs import OutputSet
from graphopt.report import render_html, render_json, render_markdown

__all__ = ["ReportEmitters"]


class ReportEmitters:
    """JSON/Markdown/HTML rendering and atomic saving for a record with ``to_dict`` (Plan,
    PlanSet): the records in ``graphopt.ir.plan`` hold data, this renders them."""

    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:  # pragma: no cover - overridden
        raise NotImplementedError

    @property
    def input_files(self) -> tuple[str, ...]:  # pragma: no cover - overridden
        raise NotImplementedError

    def to_json(self) -> str:
        return render_json(self.to_dict())

    def to_markdown(self) -> str:
        return render_markdown(self)  # type: ignore[arg-type]  # self is a Plan or PlanSet

    def to_html(self) -> str:
        return render_html(self)  # type: ignore[arg-type]

    def save(self, json: str | None = None, md: str | None = None,
             html: str | None = None, *, protect: Iterable[Any] = ()) -> list[str]:
        """Write the requested reports, all whole or none; returns the paths written.

        ``protect``: input files no report may overwrite (the CLI passes the model's).
        """
        outputs = OutputSet((*protect, *self.input_files))
        self.stage_reports(outputs, json=json, md=md, html=html)
        return [str(p) for p in outputs.commit()]

    def stage_reports(self, outputs: Any, json: str | None = None, md: str | None = None,
                      html: str | None = None) -> None:
        """Render the requested reports into ``outputs`` (a ``graphopt.files.outputs.OutputSet``),
        checking every path before the first (slow) render."""
        wanted = [(path, render) for path, render in ((json, self.to_json),
                                                     (md, self.to_markdown),
                                                     (html, self.to_html)) if path]
        fresh = [path for path, _ in wanted if not outputs.claimed(path)]
        for path in fresh:  # the same path twice in this call is refused here
            outputs.claim(path, "report")
        for path, render in wanted:
            outputs.write(path, render())
