"""The report's fusion section: the kernels a deploying runtime launches after fusing, and the
fused estimate beside the unfused one (Markdown and HTML)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from graphopt.ir.plan_sections import FusionPlan
from graphopt.report.format import fmt_seconds, md_table, md_text
from graphopt.report.html_text import esc

if TYPE_CHECKING:  # ir.plan imports the report package (its emitters): no import at run time
    from graphopt.ir.plan import Plan

__all__ = ["fusion_html", "fusion_md", "fusion_rows", "group_labels", "node_labels"]

_SHOWN = 12  # the groups that save the most


def _members(nodes: tuple[str, ...]) -> str:
    return ", ".join(nodes[:4]) + (f" +{len(nodes) - 4}" if len(nodes) > 4 else "")


def group_labels(plan: Plan) -> dict[str, str]:
    """Group id -> the label the node tables show for its nodes ("k3 FusedGemm ×3"), for the
    groups of more than one node; a node alone in its group gets no label."""
    if plan.fusion is None:
        return {}
    return {g.id: f"{g.id} {g.fused_op or g.kind} ×{len(g.nodes)}" for g in plan.fusion.groups}


def node_labels(plan: Plan) -> dict[str, str]:
    """Node name -> its group's label (:func:`group_labels`), for the nodes of labelled groups."""
    labels = group_labels(plan)
    if plan.fusion is None or not labels:
        return {}
    return {n: labels[g] for n, g in plan.fusion.group_of.items() if g in labels}


def _rules(f: FusionPlan) -> str:
    return f.runtime.rules or ("as Inductor, TensorRT and ONNX Runtime fuse: patterns, GEMM/conv "
                               "epilogues, pointwise chains with one reduction")


def fusion_rows(plan: Plan) -> tuple[str, list[list[str]]]:
    """The headline and one row per multi-node group (most time saved first)."""
    f = plan.fusion
    if f is None:
        return "", []
    head = (f"fused estimate {fmt_seconds(f.est_latency_fused_s)} against "
            f"{fmt_seconds(f.est_latency_unfused_s)} unfused: {f.kernels_fused} "
            f"kernels for {f.nodes} nodes (groups {_rules(f)})")
    groups = sorted(f.groups, key=lambda g: g.est_time_s - g.unfused_s)
    rows = [[g.id, str(g.fused_op or g.kind), _members(g.nodes), fmt_seconds(g.unfused_s),
             fmt_seconds(g.est_time_s)] for g in groups[:_SHOWN]]
    return head, rows


def fusion_md(plan: Plan, h: str) -> list[str]:
    head, rows = fusion_rows(plan)
    if not head:
        return []
    out = [f"{h} Fusion groups", "", md_text(head), ""]
    if rows:
        out += md_table(["group", "kind", "nodes", "unfused", "fused"], rows, "lllrr")
    return out


def fusion_html(plan: Plan) -> str:
    head, rows = fusion_rows(plan)
    if not head:
        return ""
    body = "".join("<tr>" + "".join(f'<td class="{"num" if i > 2 else "mono"}">{esc(c)}</td>'
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    table = ("<table><thead><tr><th>group</th><th>kind</th><th>nodes</th><th>unfused</th>"
             f"<th>fused</th></tr></thead><tbody>{body}</tbody></table>" if rows else "")
    return (f'<div class="panel"><h3>Fusion groups<span class="hint">what a runtime '
            f'launches</span></h3><p>{esc(head)}</p>{table}</div>')
