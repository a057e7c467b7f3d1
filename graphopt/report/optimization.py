"""The optimization sections of a report, one per artifact: the facts, the measured error and
the pass notes of the torch module (``optimization``) and of the ONNX file ``export_onnx``
wrote (``onnx_optimization``, with its own per-node decisions), so a report never shows one
artifact's decisions for the other. Shared by the Markdown and HTML reports.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from graphopt.ir.kinds import REWRITE_KINDS
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

__all__ = ["ARTIFACTS", "artifacts_md", "decision_rows", "note_items", "numerics_rows",
           "optimization_facts", "optimization_md"]

#: report key -> section title, in the order the report shows them
ARTIFACTS = (("optimization", "Optimization"),
             ("onnx_optimization", "Optimization of the ONNX file (export_onnx)"))


def _tolerance(tol: Any) -> str:
    if not isinstance(tol, Mapping):
        return "—"
    rel, cos = finite(tol.get("rel_to_scale")), finite(tol.get("min_cosine"))
    parts = ([f"max abs ≤ {100 * rel:g}% of the output's scale"] if rel is not None else [])
    return ", ".join(parts + ([f"cosine ≥ {cos:g}"] if cos is not None else [])) or "—"


def optimization_facts(opt: Mapping[str, Any]) -> list[Fact]:
    nums = [n for n in opt.get("numerics") or [] if isinstance(n, Mapping)]
    within = sum(n.get("within") is True for n in nums)
    reverted = [r for r in opt.get("passes_reverted") or [] if isinstance(r, Mapping)]
    return [
        ("passes applied", ", ".join(str(p) for p in opt.get("passes_applied") or []) or "none",
         ""),
        ("passes reverted", ", ".join(str(r.get("pass", "?")) for r in reverted) or "none", ""),
        ("compute dtype", str(opt.get("compute_dtype") or "—"), ""),
        ("tolerance", _tolerance(opt.get("tolerance")), ""),
        ("outputs within", f"{within} of {len(nums)}" if nums else "—",
         "✓" if nums and within == len(nums) else "✗" if nums else ""),
        *_fusion_fact(opt.get("fusion")),
    ]


def _fusion_fact(f: Any) -> list[Fact]:
    """The artifact's kernels as its runtime fuses them (an ONNX file: ONNX Runtime's EP)."""
    if not isinstance(f, Mapping):
        return []
    rt = f.get("runtime") if isinstance(f.get("runtime"), Mapping) else {}
    who = " ".join(str(x) for x in (rt.get("name"), rt.get("execution_provider")) if x)
    return [("fusion groups", f"{fmt_count(f.get('kernels_fused'))} kernels for "
             f"{fmt_count(f.get('nodes'))} nodes ({who or 'generic'} fusions)", "")]


def numerics_rows(opt: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """(output, max abs, limit, max rel, cosine, within) per compared output."""
    rows = []
    for n in opt.get("numerics") or []:
        if not isinstance(n, Mapping):
            continue
        tol = n.get("tolerance") if isinstance(n.get("tolerance"), Mapping) else \
            opt.get("tolerance") or {}
        rel, scale = finite(tol.get("rel_to_scale")), finite(n.get("scale"))
        limit = fmt_err(rel * scale) if rel is not None and scale is not None else "—"
        ok = n.get("within")
        rows.append((str(n.get("output", "?")), fmt_err(n.get("max_abs")), limit,
                     fmt_err(n.get("max_rel")), fmt_cosine(n.get("cosine")),
                     "✓" if ok is True else "✗" if ok is False else "—"))
    return rows


def note_items(group: Any) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(counts, texts) of one optimization-notes group; a list counts as its length."""
    if not isinstance(group, Mapping):
        return [], [("value", fmt_value(group))]
    counts, texts = [], []
    for key in sorted(group, key=str):
        v, label = group[key], str(key).replace("_", " ")
        if isinstance(v, (list, tuple)):
            counts.append((label, fmt_count(len(v))))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            counts.append((label, fmt_value(v) if isinstance(v, float) else fmt_count(v)))
        elif isinstance(v, Mapping):
            texts.append((label, ", ".join(f"{k}={fmt_value(v[k])}" for k in sorted(v, key=str))))
        elif v is not None and v != "":
            texts.append((label, fmt_value(v)))
    return counts, texts


def decision_rows(opt: Mapping[str, Any]) -> list[list[str]]:
    """[node, padding, layout, precision, quantize] for an artifact's own node decisions."""
    decisions = opt.get("decisions")
    if not isinstance(decisions, Mapping):
        return []
    return [[str(node), *(decision_summary(d[k]) if isinstance(d, Mapping) and k in d else "—"
                          for k in REWRITE_KINDS)]
            for node, d in decisions.items()]


def optimization_md(opt: Mapping[str, Any], h: str, title: str = "Optimization") -> list[str]:
    out = [f"{h} {title}", "", *facts_md(optimization_facts(opt)), ""]
    reverted = [r for r in opt.get("passes_reverted") or [] if isinstance(r, Mapping)]
    if reverted:
        out += md_table(["reverted pass", "reason"], [[md_code(r.get("pass", "?")),
                                                       md_text(r.get("reason") or "—")]
                                                      for r in reverted])
    rows = numerics_rows(opt)
    if rows:
        out += [f"{h}# Measured error (optimized vs original)", ""]
        out += md_table(["output", "max abs", "limit", "max rel", "cosine", "within"],
                        [[md_text(c) for c in r] for r in rows], "lrrrrl")
    notes = opt.get("notes") if isinstance(opt.get("notes"), Mapping) else {}
    lines = []
    for group in sorted(notes, key=str):
        counts, texts = note_items(notes[group])
        bits = [f"{md_text(k)} {md_text(v)}" for k, v in counts]
        bits += [f"{md_text(k)}: {md_text(v)}" for k, v in texts]
        lines.append(f"- **{md_text(group)}:** " + "; ".join(bits or ["—"]))
    out += [f"{h}# Pass notes", "", *lines, ""] if lines else []
    return out + sensitivity_md(opt, h) + _decisions_md(opt, h)


def _decisions_md(opt: Mapping[str, Any], h: str) -> list[str]:
    rows = decision_rows(opt)
    if not rows:
        return []
    return [f"{h}# Decisions on its nodes", "",
            *md_table(["node", *REWRITE_KINDS], [[md_code(r[0]), *(md_text(c) for c in r[1:])]
                                          for r in rows]), ""]


def artifacts_md(plan: Mapping[str, Any], h: str) -> list[str]:
    """One optimization section per artifact the plan holds."""
    out: list[str] = []
    for key, title in ARTIFACTS:
        section = plan.get(key)
        if isinstance(section, Mapping) and section:
            out += optimization_md(section, h, title)
    return out
