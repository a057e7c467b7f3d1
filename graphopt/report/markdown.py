"""Markdown rendering of a plan report (v1 schema), for terminals, PR comments and wikis.

Node and tensor names come from untrusted models, so every name is written as a code span and
every free text is backslash-escaped: a model cannot inject HTML or markdown structure into a
page that renders this file. The number and decision formatters are shared with the HTML
renderer (``format``) so the two reports print the same values; the per-plan sections (summary,
memory, quantization, runtime settings, optimization, nodes) live in ``sections_md``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from graphopt.report import sections_md as sec
from graphopt.report.format import (
    BOTTLENECKS,
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

__all__ = ["render_markdown"]

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------- sections

def _model_lines(model: Mapping[str, Any]) -> list[str]:
    out = [f"- **Model:** {md_code(model.get('name', '?'))} ({md_text(model.get('source', '?'))}), "
           f"{fmt_count(model.get('num_nodes'))} nodes, {fmt_si(model.get('param_count'))} params"]
    for label, key in (("Inputs", "inputs"), ("Outputs", "outputs")):
        tensors = model.get(key) or []
        if tensors:
            items = ", ".join(f"{md_code(t.get('name', '?'))} {fmt_shape(t.get('shape'))} "
                              f"{md_text(t.get('dtype') or '?')}" for t in tensors
                              if isinstance(t, Mapping))
            out.append(f"- **{label}:** {items}")
    return out


def _target_line(target: Mapping[str, Any]) -> str:
    by_value: dict[float, list[str]] = {}  # dtypes sharing a peak print once: bf16/fp16 989 T
    for k, v in sorted((target.get("peak_flops") or {}).items()):
        if (finite(v) or 0.0) > 0:
            by_value.setdefault(float(v), []).append(str(k))
    peak_txt = ", ".join(f"{md_text('/'.join(ks))} {fmt_rate(v, 'FLOP/s')}"
                         for v, ks in sorted(by_value.items(), reverse=True))
    cc = target.get("compute_capability")
    bits = [md_text(target.get("kind", "?")), md_text(target.get("generation", "?"))]
    if cc:
        bits.append(f"cc {md_text(cc)}")
    return (f"- **Target:** {md_text(target.get('display_name') or target.get('name', '?'))} "
            f"({md_code(target.get('name', '?'))}; {', '.join(bits)}); peak {peak_txt or '—'}; "
            f"{fmt_rate(target.get('bandwidth_bytes_per_s'))} memory bandwidth, "
            f"{fmt_bytes(target.get('memory_bytes'))} memory")


def _comparison(plans: Sequence[Mapping[str, Any]]) -> list[str]:
    """One column per target: the numbers a reader compares across targets."""
    sums = [p.get("summary") or {} for p in plans]
    tgts = [p.get("target") or {} for p in plans]
    lats = [finite(s.get("est_latency_s")) for s in sums]
    best = min((x for x in lats if x), default=None)

    def row(label: str, cells: Sequence[str]) -> list[str]:
        return [f"**{label}**", *cells]

    def top_class(s: Mapping[str, Any]) -> str:
        t = s.get("time_by_kernel_class_s") or {}
        return md_code(min(t, key=lambda c: (-(finite(t[c]) or 0), c))) if t else "—"

    rows = [
        row("kind", [md_text(f"{t.get('kind', '?')} / {t.get('generation', '?')}") for t in tgts]),
        row("peak FLOP/s", [fmt_rate(max((finite(v) or 0 for v in
                                          (t.get("peak_flops") or {}).values()), default=None),
                                     "FLOP/s") for t in tgts]),
        row("bandwidth", [fmt_rate(t.get("bandwidth_bytes_per_s")) for t in tgts]),
        row("est. latency", [fmt_seconds(x) for x in lats]),
        row("vs fastest", [f"{x / best:.2f}×" if x and best else "—" for x in lats]),
        *[row(f"{b}-bound nodes / time",
              [f"{fmt_count((s.get('bottleneck_mix') or {}).get(b, 0))} / "
               f"{fmt_seconds((s.get('time_by_bottleneck_s') or {}).get(b, 0.0))}"
               for s in sums]) for b in BOTTLENECKS],
        row("top kernel class", [top_class(s) for s in sums]),
        row("unsupported ops", [fmt_count(sum((s.get("unsupported_ops") or {}).values()))
                                for s in sums]),
        row("warnings", [fmt_count(len(p.get("warnings") or [])) for p in plans]),
    ]
    header = ["", *[md_text(t.get("display_name") or t.get("name", "?")) for t in tgts]]
    return md_table(header, rows, "l" + "r" * len(plans))


def render_markdown(report: Mapping[str, Any], *, max_nodes: int = 50) -> str:
    """Render a single- or multi-target plan report as GitHub-flavoured markdown.

    Args:
        report: the v1 report dict (a plan, or ``{"plans": [...]}``).
        max_nodes: per-node tables list only the costliest ``max_nodes`` nodes (with a note).
    """
    plans = plans_of(report)
    if not plans:
        return "# graphopt plan\n\n_The report holds no plans._\n"
    first = plans[0]
    model = first.get("model") or {}
    version = first.get("graphopt_version") or report.get("graphopt_version") or "?"
    out = [f"# graphopt plan: {md_code(model.get('name', '?'))}", "",
           f"_graphopt {md_text(version)}, report schema v"
           f"{md_text(report.get('schema_version', 1))}_", "", *_model_lines(model)]
    if len(plans) == 1:
        out += [_target_line(first.get("target") or {}), *sec.plan_summary(first, "##"),
                *shape_range_md(first, "##"), *fusion_md(first, "##"), *prediction_md(first, "##")]
        out += sec.deployment_md(first, "##") + sec.node_table(first, "##", max_nodes)
    else:
        out += ["", "## Targets compared", "", *_comparison(plans)]
        deploy = sec.deployment_table(plans)
        out += ["## Memory, format and runtime settings compared", "", *deploy] if deploy else []
        for plan in plans:
            tgt = plan.get("target") or {}
            out += [f"## {md_text(tgt.get('display_name') or tgt.get('name', '?'))}", "",
                    _target_line(tgt), *sec.plan_summary(plan, "###"),
                    *shape_range_md(plan, "###"), *fusion_md(plan, "###")]
            out += sec.deployment_md(plan, "###") + sec.node_table(plan, "###", max_nodes)
    logger.debug("rendered markdown for %d plan(s)", len(plans))
    return "\n".join(out).rstrip("\n") + "\n"
