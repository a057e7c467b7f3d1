"""The optimization sections of a report, one per artifact: the facts, the measured error and
the pass notes of the torch module (``optimization``) and of the ONNX file ``export_onnx``
wrote (``onnx_optimization``, with its own per-node decisions), so a report never shows one
artifact's decisions for the other. Shared by the Markdown and HTML reports.

The runs are typed records (:mod:`graphopt.ir.plan_run`); a pass's ``notes`` stay free-form
JSON (each pass chooses its keys), so :func:`note_items` walks them as they come.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from graphopt.ir.kinds import REWRITE_KINDS
from graphopt.ir.plan_run import OnnxExport, OnnxOptimization, ToleranceBudget, TorchOptimization
from graphopt.ir.plan_sections import FusionPlan
from graphopt.report.format import (
    Fact,
    decision_summary,
    facts_md,
    finite,
    fmt_cosine,
    fmt_count,
    fmt_err,
    fmt_value,
    md_code,
    md_table,
    md_text,
)
from graphopt.report.sensitivity import sensitivity_md

if TYPE_CHECKING:  # ir.plan imports the report package (its emitters): no import at run time
    from graphopt.ir.plan import Plan

__all__ = ["ARTIFACTS", "Run", "artifacts_md", "decision_rows", "note_items", "numerics_rows",
           "optimization_facts", "optimization_md"]

#: a backend's run as the plan holds it: the torch module's, the ONNX model's, or the ONNX
#: export of a torch model (an :class:`OnnxExport`, which is an :class:`OnnxOptimization`)
Run = TorchOptimization | OnnxOptimization

#: plan attribute -> section title, in the order the report shows them
ARTIFACTS = (("optimization", "Optimization"),
             ("onnx_optimization", "Optimization of the ONNX file (export_onnx)"))


def _tolerance(tol: ToleranceBudget) -> str:
    rel, cos = finite(tol.rel_to_scale), finite(tol.min_cosine)
    parts = ([f"max abs ≤ {100 * rel:g}% of the output's scale"] if rel is not None else [])
    return ", ".join(parts + ([f"cosine ≥ {cos:g}"] if cos is not None else [])) or "—"


def optimization_facts(opt: Run) -> list[Fact]:
    within = sum(n.within is True for n in opt.numerics)
    total = len(opt.numerics)
    return [
        ("passes applied", ", ".join(opt.passes_applied) or "none", ""),
        ("passes reverted", ", ".join(r.name for r in opt.passes_reverted) or "none", ""),
        ("compute dtype", opt.compute_dtype or "—", ""),
        ("tolerance", _tolerance(opt.tolerance), ""),
        ("outputs within", f"{within} of {total}" if total else "—",
         "✓" if total and within == total else "✗" if total else ""),
        *_fusion_fact(opt.fusion if isinstance(opt, OnnxExport) else None),
    ]


def _fusion_fact(f: FusionPlan | None) -> list[Fact]:
    """The artifact's kernels as its runtime fuses them (an ONNX file: ONNX Runtime's EP)."""
    if f is None:
        return []
    who = " ".join(x for x in (f.runtime.name, f.runtime.execution_provider) if x)
    return [("fusion groups", f"{fmt_count(f.kernels_fused)} kernels for "
             f"{fmt_count(f.nodes)} nodes ({who or 'generic'} fusions)", "")]


def numerics_rows(opt: Run) -> list[tuple[str, ...]]:
    """(output, max abs, limit, max rel, cosine, within) per compared output."""
    rows = []
    for n in opt.numerics:
        rel, scale = finite(n.tolerance.rel_to_scale), finite(n.scale)
        limit = fmt_err(rel * scale) if rel is not None and scale is not None else "—"
        rows.append((str(n.output), fmt_err(n.max_abs), limit, fmt_err(n.max_rel),
                     fmt_cosine(n.cosine), "✓" if n.within else "✗"))
    return rows


def note_items(group: Any) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(counts, texts) of one optimization-notes group (free-form JSON: each pass chooses its
    keys); a list counts as its length."""
    if not isinstance(group, Mapping):
        return [], [("value", fmt_value(group))]
    counts, texts = [], []
    for key in sorted(group, key=str):
        v, label = group[key], str(key).replace("_", " ")
        if isinstance(v, (list, tuple)):
            counts.append((label, fmt_count(len(v))))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            counts.append((label, fmt_value(v) if isinstance(v, float) else fmt_count(v)))
        elif isinstance(v, Mapping) and any(isinstance(x, (Mapping, list, tuple))
                                            for x in v.values()):
            counts.append((label, fmt_count(len(v))))  # its internals stay in the JSON
        elif isinstance(v, Mapping):
            texts.append((label, ", ".join(f"{k}={fmt_value(v[k])}" for k in sorted(v, key=str))))
        elif v is not None and v != "":
            texts.append((label, fmt_value(v)))
    return counts, texts


def decision_rows(opt: Run) -> list[list[str]]:
    """[node, padding, layout, precision, quantize] for an artifact's own node decisions (only
    an ONNX export has its own: its nodes are the ONNX graph's)."""
    if not isinstance(opt, OnnxExport):
        return []
    return [[node, *(decision_summary(d[k]) if k in d else "—" for k in REWRITE_KINDS)]
            for node, d in opt.decisions.items()]


def optimization_md(opt: Run, h: str, title: str = "Optimization") -> list[str]:
    out = [f"{h} {title}", "", *facts_md(optimization_facts(opt)), ""]
    if opt.passes_reverted:
        out += md_table(["reverted pass", "reason"], [[md_code(r.name), md_text(r.reason or "—")]
                                                      for r in opt.passes_reverted])
    rows = numerics_rows(opt)
    if rows:
        out += [f"{h}# Measured error (optimized vs original)", ""]
        out += md_table(["output", "max abs", "limit", "max rel", "cosine", "within"],
                        [[md_text(c) for c in r] for r in rows], "lrrrrl")
    lines = []
    for group in sorted(opt.notes, key=str):
        counts, texts = note_items(opt.notes[group])
        bits = [f"{md_text(k)} {md_text(v)}" for k, v in counts]
        bits += [f"{md_text(k)}: {md_text(v)}" for k, v in texts]
        lines.append(f"- **{md_text(group)}:** " + "; ".join(bits or ["—"]))
    out += [f"{h}# Pass notes", "", *lines, ""] if lines else []
    return out + sensitivity_md(opt, h) + _decisions_md(opt, h)


def _decisions_md(opt: Run, h: str) -> list[str]:
    rows = decision_rows(opt)
    if not rows:
        return []
    return [f"{h}# Decisions on its nodes", "",
            *md_table(["node", *REWRITE_KINDS], [[md_code(r[0]), *(md_text(c) for c in r[1:])]
                                          for r in rows]), ""]


def artifacts_md(plan: Plan, h: str) -> list[str]:
    """One optimization section per artifact the plan holds."""
    out: list[str] = []
    for key, title in ARTIFACTS:
        section = getattr(plan, key)
        if section is not None:
            out += optimization_md(section, h, title)
    return out
