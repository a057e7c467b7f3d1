"""Markdown rendering of a plan report (a typed ``Plan`` or ``PlanSet``), for terminals, PR
comments and wikis.

Node and tensor names come from untrusted models, so every name is written as a code span and
every free text is backslash-escaped: a model cannot inject HTML or markdown structure into a
page that renders this file. The number and decision formatters are shared with the HTML
renderer (``format``) so the two reports print the same values; the per-plan sections (summary,
memory, quantization, runtime settings, optimization, nodes) live in ``sections_md``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from graphopt._version import __version__
from graphopt.hardware.profile import HardwareProfile
from graphopt.ir.plan_summary import ModelInfo, Summary
from graphopt.report import sections_md as sec
from graphopt.report.format import (
    BOTTLENECKS,
    SCHEMA_VERSION,
    finite,
    fmt_bytes,
    fmt_count,
    fmt_rate,
    fmt_seconds,
    fmt_shape,
    fmt_si,
    md_code,
    md_table,
    md_text,
    plans_of,
)
from graphopt.report.fusion import fusion_md
from graphopt.report.prediction import prediction_md
from graphopt.report.shape_range import shape_range_md

if TYPE_CHECKING:  # ir.plan imports the report package (its emitters): no import at run time
    from graphopt.ir.plan import Plan, PlanSet

__all__ = ["render_markdown"]

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------- sections

def _model_lines(model: ModelInfo) -> list[str]:
    out = [f"- **Model:** {md_code(model.name)} ({md_text(model.source)}), "
           f"{fmt_count(model.num_nodes)} nodes, {fmt_si(model.param_count)} params"]
    for label, tensors in (("Inputs", model.inputs), ("Outputs", model.outputs)):
        if tensors:
            items = ", ".join(f"{md_code(t.name)} {fmt_shape(t.shape)} {md_text(t.dtype or '?')}"
                              for t in tensors)
            out.append(f"- **{label}:** {items}")
    return out


def _target_name(target: HardwareProfile) -> str:
    return target.display_name or target.name


def _target_line(target: HardwareProfile) -> str:
    by_value: dict[float, list[str]] = {}  # dtypes sharing a peak print once: bf16/fp16 989 T
    for k, v in sorted(target.peak_flops.items()):
        if (finite(v) or 0.0) > 0:
            by_value.setdefault(float(v), []).append(str(k))
    peak_txt = ", ".join(f"{md_text('/'.join(ks))} {fmt_rate(v, 'FLOP/s')}"
                         for v, ks in sorted(by_value.items(), reverse=True))
    cc = target.compute_capability
    bits = [md_text(target.kind), md_text(target.generation)]
    if cc:
        bits.append(f"cc {md_text(f'{cc[0]}.{cc[1]}')}")
    return (f"- **Target:** {md_text(_target_name(target))} "
            f"({md_code(target.name)}; {', '.join(bits)}); peak {peak_txt or '—'}; "
            f"{fmt_rate(target.bandwidth_bytes_per_s)} memory bandwidth, "
            f"{fmt_bytes(target.memory_bytes)} memory")


def _top_class(s: Summary) -> str:
    t = s.time_by_kernel_class_s
    return md_code(min(t, key=lambda c: (-(finite(t[c]) or 0), c))) if t else "—"


def _comparison(plans: Sequence[Plan]) -> list[str]:
    """One column per target: the numbers a reader compares across targets."""
    sums = [p.summary for p in plans]
    tgts = [p.target for p in plans]
    lats = [finite(s.est_latency_s) for s in sums]
    best = min((x for x in lats if x), default=None)

    def row(label: str, cells: Sequence[str]) -> list[str]:
        return [f"**{label}**", *cells]

    rows = [
        row("kind", [md_text(f"{t.kind} / {t.generation}") for t in tgts]),
        row("peak FLOP/s", [fmt_rate(max((finite(v) or 0 for v in t.peak_flops.values()),
                                         default=None), "FLOP/s") for t in tgts]),
        row("bandwidth", [fmt_rate(t.bandwidth_bytes_per_s) for t in tgts]),
        row("est. latency", [fmt_seconds(x) for x in lats]),
        row("vs fastest", [f"{x / best:.2f}×" if x and best else "—" for x in lats]),
        *[row(f"{b}-bound nodes / time",
              [f"{fmt_count(s.bottleneck_mix[b])} / {fmt_seconds(s.time_by_bottleneck_s[b])}"
               for s in sums]) for b in BOTTLENECKS],
        row("top kernel class", [_top_class(s) for s in sums]),
        row("unsupported ops", [fmt_count(sum(s.unsupported_ops.values())) for s in sums]),
        row("warnings", [fmt_count(len(p.warnings)) for p in plans]),
    ]
    header = ["", *[md_text(_target_name(t)) for t in tgts]]
    return md_table(header, rows, "l" + "r" * len(plans))


def render_markdown(report: Plan | PlanSet, *, max_nodes: int = 50) -> str:
    """Render a single- or multi-target plan report as GitHub-flavoured markdown.

    Args:
        report: the plan, or the plan set of a multi-target report.
        max_nodes: per-node tables list only the costliest ``max_nodes`` nodes (with a note).
    """
    plans = plans_of(report)
    if not plans:
        return "# graphopt plan\n\n_The report holds no plans._\n"
    first = plans[0]
    out = [f"# graphopt plan: {md_code(first.model.name)}", "",
           f"_graphopt {md_text(__version__)}, report schema v{md_text(SCHEMA_VERSION)}_", "",
           *_model_lines(first.model)]
    if len(plans) == 1:
        out += [_target_line(first.target), *sec.plan_summary(first, "##"),
                *shape_range_md(first, "##"), *fusion_md(first, "##"), *prediction_md(first, "##")]
        out += sec.deployment_md(first, "##") + sec.node_table(first, "##", max_nodes)
    else:
        out += ["", "## Targets compared", "", *_comparison(plans)]
        deploy = sec.deployment_table(plans)
        out += ["## Memory, format and runtime settings compared", "", *deploy] if deploy else []
        for plan in plans:
            out += [f"## {md_text(_target_name(plan.target))}", "",
                    _target_line(plan.target), *sec.plan_summary(plan, "###"),
                    *shape_range_md(plan, "###"), *fusion_md(plan, "###")]
            out += sec.deployment_md(plan, "###") + sec.node_table(plan, "###", max_nodes)
    logger.debug("rendered markdown for %d plan(s)", len(plans))
    return "\n".join(out).rstrip("\n") + "\n"
