"""The report's fusion section: the kernels a deploying runtime launches after fusing, and the
fused estimate beside the unfused one (Markdown and HTML)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from graphopt.report.format import fmt_seconds, md_table, md_text
from graphopt.report.html_text import esc

__all__ = ["fusion_html", "fusion_md", "fusion_rows", "group_labels"]

_SHOWN = 12  # the groups that save the most


def _members(nodes: list[str]) -> str:
    return ", ".join(nodes[:4]) + (f" +{len(nodes) - 4}" if len(nodes) > 4 else "")


def group_labels(plan: Mapping[str, Any]) -> dict[str, str]:
    """Group id -> the label the node tables show for its nodes ("k3 FusedGemm ×3"), for the
    groups of more than one node; a node alone in its group gets no label."""
    f = plan.get("fusion")
    if not isinstance(f, Mapping):
        return {}
    out = {}
    for g in f.get("groups") or []:
        if isinstance(g, Mapping) and g.get("id") is not None:
            what = g.get("fused_op") or g.get("kind") or "group"
            out[str(g["id"])] = f"{g['id']} {what} ×{len(g.get('nodes') or [])}"
    return out


def _rules(f: Mapping[str, Any]) -> str:
    rt = f.get("runtime")
    if isinstance(rt, Mapping) and rt.get("rules"):
        return str(rt["rules"])
    return ("as Inductor, TensorRT and ONNX Runtime fuse: patterns, GEMM/conv epilogues, "
            "pointwise chains with one reduction")


def fusion_rows(plan: Mapping[str, Any]) -> tuple[str, list[list[str]]]:
    """The headline and one row per multi-node group (most time saved first)."""
    f = plan.get("fusion")
    if not isinstance(f, Mapping):
        return "", []
    head = (f"fused estimate {fmt_seconds(f.get('est_latency_fused_s'))} against "
            f"{fmt_seconds(f.get('est_latency_unfused_s'))} unfused: {f.get('kernels_fused')} "
            f"kernels for {f.get('nodes')} nodes (groups {_rules(f)})")
    groups = sorted((g for g in f.get("groups") or [] if isinstance(g, Mapping)),
                    key=lambda g: g.get("est_time_s", 0) - g.get("unfused_s", 0))
    rows = [[str(g.get("id")), str(g.get("fused_op") or g.get("kind")),
             _members(list(g.get("nodes") or [])),
             fmt_seconds(g.get("unfused_s")), fmt_seconds(g.get("est_time_s"))]
            for g in groups[:_SHOWN]]
    return head, rows


def fusion_md(plan: Mapping[str, Any], h: str) -> list[str]:
    head, rows = fusion_rows(plan)
    if not head:
        return []
    out = [f"{h} Fusion groups", "", md_text(head), ""]
    if rows:
        out += md_table(["group", "kind", "nodes", "unfused", "fused"], rows, "lllrr")
    return out


def fusion_html(plan: Mapping[str, Any]) -> str:
    head, rows = fusion_rows(plan)
    if not head:
        return ""
    body = "".join("<tr>" + "".join(f'<td class="{"num" if i > 2 else "mono"}">{esc(c)}</td>'
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    table = ("<table><thead><tr><th>group</th><th>kind</th><th>nodes</th><th>unfused</th>"
             f"<th>fused</th></tr></thead><tbody>{body}</tbody></table>" if rows else "")
    return (f'<div class="panel"><h3>Fusion groups<span class="hint">what a runtime '
            f'launches</span></h3><p>{esc(head)}</p>{table}</div>')
