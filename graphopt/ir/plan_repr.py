"""``repr(plan)``: a few lines a user reads at the prompt, not the ~60 kB the dataclass repr
prints (every node, every decision). The whole plan is in ``plan.to_json()`` and the reports."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from graphopt.ir.plan import Plan, PlanSet

__all__ = ["plan_repr", "plan_set_repr"]

#: the most costly nodes and decision kinds a repr names
_TOP = 3


def _seconds(s: float) -> str:
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us")):
        if abs(s) >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def _count(n: float) -> str:
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(int(n))


def _cut(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def _decisions(plan: Plan) -> str:
    """Applied decisions by kind (the most frequent first), with the formats a precision
    decision chose."""
    kinds: Counter[str] = Counter()
    formats: Counter[str] = Counter()
    for node in plan.nodes:
        for kind, d in node.decisions.items():
            if d.applied:
                kinds[kind] += 1
                if kind == "precision":
                    formats[str(getattr(d.detail, "format", "?"))] += 1
    if not kinds:
        return "no decision applied"
    parts = []
    for kind, n in kinds.most_common(_TOP):
        fmt = ", ".join(f"{_cut(f, 16)} x{c}" for f, c in formats.most_common(2))
        parts.append(f"{kind} x{n}" + (f" ({fmt})" if kind == "precision" and fmt else ""))
    more = len(kinds) - _TOP
    return "; ".join(parts) + (f"; {more} more kind(s)" if more > 0 else "")


def _bound(plan: Plan) -> str:
    by = plan.summary.time_by_bottleneck_s
    total = sum(by.values())
    if not total:
        return "no time estimated"
    name = max(sorted(by), key=lambda b: by[b])
    return f"{name}-bound ({by[name] / total:.0%} of the time)"


def plan_repr(plan: Plan) -> str:
    """Model, target, estimate, what bounds it, the top decisions and costliest nodes."""
    m, s = plan.model, plan.summary
    costly = ", ".join(f"{_cut(c.name, 40)} {c.share:.0%}" for c in s.costliest_nodes[:_TOP])
    sections = ", ".join(plan.sections()) or "none"
    return (f"<Plan {_cut(m.name)!r} ({_cut(m.source, 20)}, {m.num_nodes} nodes, "
            f"{_count(m.param_count)} params) on {_cut(plan.target.display_name)} "
            f"({plan.target.name}):\n"
            f"  est. {_seconds(s.est_latency_s)}, {_bound(plan)}\n"
            f"  decisions: {_decisions(plan)}\n"
            f"  costliest: {costly or 'none'}\n"
            f"  sections: {_cut(sections, 200)}; "
            f"{len(plan.warnings)} warning(s); the rest: plan.to_markdown(), plan.to_json()>")


def plan_set_repr(plans: PlanSet) -> str:
    """One line per target: its estimate and what bounds it."""
    rows = [f"  {_cut(p.target.name, 30)}: est. {_seconds(p.summary.est_latency_s)}, "
            f"{_bound(p)}" for p in plans.plans[:12]]
    more = len(plans.plans) - len(rows)
    name = plans.plans[0].model.name if plans.plans else "-"
    return (f"<PlanSet {_cut(name)!r} on {len(plans.plans)} target(s):\n" + "\n".join(rows)
            + (f"\n  ... {more} more" if more > 0 else "") + ">")
