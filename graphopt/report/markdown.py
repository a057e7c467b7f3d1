"""Markdown rendering of a plan report (v1 schema), for terminals, PR comments and wikis.

Node and tensor names come from untrusted models, so every name is written as a code span and
every free text is backslash-escaped: a model cannot inject HTML or markdown structure into a
page that renders this file. The number formatters here are shared with the HTML renderer so the
two reports print the same values.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "BOTTLENECKS",
    "decision_summary",
    "finite",
    "fmt_bytes",
    "fmt_count",
    "fmt_dims",
    "fmt_rate",
    "fmt_seconds",
    "fmt_shape",
    "fmt_si",
    "plans_of",
    "render_markdown",
]

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
BOTTLENECKS = ("compute", "memory", "latency")
# Keys that name what a decision chose, most specific first; the first present is its "value".
_VALUE_KEYS = ("choice", "value", "selected", "action", "decision", "format", "path", "layout",
               "dtype", "precision", "device", "to", "status")
_DIM_ORDER = ("batch", "M", "N", "K")


# --------------------------------------------------------------------------- shared formatters

def finite(x: Any) -> float | None:
    """A finite float, or None for missing/non-numeric/NaN/inf (reports may hold any of them)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x) if math.isfinite(x) else None


def fmt_si(value: Any, unit: str = "", digits: int = 3) -> str:
    """Decimal SI prefix with ``digits`` significant digits: 1.23e12 -> ``1.23 T{unit}``."""
    v = finite(value)
    if v is None:
        return "—"
    prefixes = ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
    for scale, p in prefixes:
        if abs(v) >= scale:
            return f"{v / scale:.{digits}g} {p}{unit}".rstrip()
    return f"{v:.{digits}g} {unit}".rstrip()


def fmt_seconds(value: Any) -> str:
    """Seconds in the unit a profiler would pick (ns, µs, ms, s)."""
    v = finite(value)
    if v is None:
        return "—"
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if abs(v) >= scale:
            return f"{v / scale:.3g} {unit}"
    return f"{v * 1e9:.3g} ns"


def fmt_bytes(value: Any) -> str:
    """Sizes in IEC units (tensor and memory sizes are powers of two)."""
    v = finite(value)
    if v is None:
        return "—"
    for scale, unit in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if abs(v) >= scale:
            return f"{v / scale:.3g} {unit}"
    return f"{int(v)} B"


def fmt_rate(value: Any, unit: str = "B/s") -> str:
    """Rates in decimal SI, the way datasheets print bandwidth and FLOP/s."""
    return fmt_si(value, unit)


def fmt_count(value: Any) -> str:
    v = finite(value)
    return "—" if v is None else f"{int(v):,}"


def fmt_shape(shape: Any) -> str:
    """``[1, 'seq', 768]`` -> ``[1,seq,768]``; an unknown shape is ``?``."""
    if not isinstance(shape, (list, tuple)):
        return "?"
    return "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"


def fmt_dims(dims: Any) -> str:
    """GEMM dims first in the order people say them (batch M N K), then the rest sorted."""
    if not isinstance(dims, Mapping) or not dims:
        return ""
    keys = [k for k in _DIM_ORDER if k in dims] + sorted(k for k in dims if k not in _DIM_ORDER)
    return " ".join(f"{k}={dims[k]}" for k in keys)


def decision_summary(decision: Any) -> str:
    """The short value of one decision (``bf16``, ``nhwc``, ``pad_to=64``, ``not applied``)."""
    if not isinstance(decision, Mapping):
        return str(decision)
    applied = decision.get("applied")
    fields = [k for k in decision if k not in ("reason", "applied")]
    key = next((k for k in _VALUE_KEYS if k in fields), None)
    if key is not None or len(fields) == 1:
        value = str(decision[key if key is not None else fields[0]])
    elif fields:
        value = f"{fields[0]}={decision[fields[0]]}"
    else:
        return "not applied" if applied is False else "applied"
    return f"{value} (not applied)" if applied is False else value


def plans_of(report: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The plans of a single- or multi-target report, in report order."""
    version = report.get("schema_version")
    if version is not None and version != SCHEMA_VERSION:
        logger.warning("report schema_version %s; this renderer knows %d", version, SCHEMA_VERSION)
    plans = report.get("plans")
    if isinstance(plans, Sequence) and not isinstance(plans, (str, bytes)):
        return [p for p in plans if isinstance(p, Mapping)]
    return [report]


def _share(part: Any, whole: Any) -> str:
    p, w = finite(part), finite(whole)
    return "—" if p is None or not w else f"{100.0 * p / w:.1f}%"


# --------------------------------------------------------------------------- markdown escaping

_MD_SPECIAL = re.compile(r"([\\`*\[\]<>|&#~!])")
_LOOSE_UNDERSCORE = re.compile(r"(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])")


def _text(value: Any) -> str:
    """Free text made inert: structure characters backslash-escaped, one line."""
    s = " ".join(str(value).split())
    s = _MD_SPECIAL.sub(r"\\\1", s)
    return _LOOSE_UNDERSCORE.sub(r"\\_", s)


def _code(value: Any) -> str:
    """A name as a code span (no markdown or HTML is interpreted inside) safe in a table cell."""
    s = " ".join(str(value).split()).replace("|", "\\|")
    if not s:
        return ""
    fence = "`" * (max((len(r) for r in re.findall(r"`+", s)), default=0) + 1)
    pad = " " if s.startswith("`") or s.endswith("`") else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str = "") -> list[str]:
    """A GFM table; ``align`` holds one of ``l``/``r`` per column (default left)."""
    marks = ["---:" if a == "r" else "---" for a in align.ljust(len(header), "l")]
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join(marks) + " |"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out + [""]


# --------------------------------------------------------------------------- sections

def _model_lines(model: Mapping[str, Any]) -> list[str]:
    out = [f"- **Model:** {_code(model.get('name', '?'))} ({_text(model.get('source', '?'))}), "
           f"{fmt_count(model.get('num_nodes'))} nodes, {fmt_si(model.get('param_count'))} params"]
    for label, key in (("Inputs", "inputs"), ("Outputs", "outputs")):
        tensors = model.get(key) or []
        if tensors:
            items = ", ".join(f"{_code(t.get('name', '?'))} {fmt_shape(t.get('shape'))} "
                              f"{_text(t.get('dtype') or '?')}" for t in tensors
                              if isinstance(t, Mapping))
            out.append(f"- **{label}:** {items}")
    return out


def _target_line(target: Mapping[str, Any]) -> str:
    by_value: dict[float, list[str]] = {}  # dtypes sharing a peak print once: bf16/fp16 989 T
    for k, v in sorted((target.get("peak_flops") or {}).items()):
        if (finite(v) or 0.0) > 0:
            by_value.setdefault(float(v), []).append(str(k))
    peak_txt = ", ".join(f"{_text('/'.join(ks))} {fmt_rate(v, 'FLOP/s')}"
                         for v, ks in sorted(by_value.items(), reverse=True))
    cc = target.get("compute_capability")
    bits = [_text(target.get("kind", "?")), _text(target.get("generation", "?"))]
    if cc:
        bits.append(f"cc {_text(cc)}")
    return (f"- **Target:** {_text(target.get('display_name') or target.get('name', '?'))} "
            f"({_code(target.get('name', '?'))}; {', '.join(bits)}); peak {peak_txt or '—'}; "
            f"{fmt_rate(target.get('bandwidth_bytes_per_s'))} memory bandwidth, "
            f"{fmt_bytes(target.get('memory_bytes'))} memory")


def _plan_summary(plan: Mapping[str, Any], h: str) -> list[str]:
    s = plan.get("summary") or {}
    lat = s.get("est_latency_s")
    out = [f"- **Estimated latency:** {fmt_seconds(lat)}",
           f"- **Total work:** {fmt_si(s.get('total_flops'), 'FLOP')}, "
           f"{fmt_bytes(s.get('total_bytes'))} moved", ""]
    mix, tmix = s.get("bottleneck_mix") or {}, s.get("time_by_bottleneck_s") or {}
    out += [f"{h} Bottleneck mix", ""]
    out += _table(["bottleneck", "nodes", "est. time", "share"],
                  [[b, fmt_count(mix.get(b, 0)), fmt_seconds(tmix.get(b, 0.0)),
                    _share(tmix.get(b, 0.0), lat)] for b in BOTTLENECKS], "lrrr")
    times, counts = s.get("time_by_kernel_class_s") or {}, s.get("kernel_class_counts") or {}
    if times or counts:
        classes = sorted(set(times) | set(counts), key=lambda c: (-(finite(times.get(c)) or 0), c))
        out += [f"{h} Time by kernel class", ""]
        out += _table(["kernel class", "nodes", "est. time", "share"],
                      [[_code(c), fmt_count(counts.get(c, 0)), fmt_seconds(times.get(c)),
                        _share(times.get(c), lat)] for c in classes], "lrrr")
    costly = s.get("costliest_nodes") or []
    if costly:
        out += [f"{h} Costliest nodes", ""]
        out += _table(["#", "node", "kernel class", "est. time", "share"],
                      [[str(i), _code(n.get("name", "?")), _code(n.get("kernel_class", "?")),
                        fmt_seconds(n.get("est_time_s")),
                        f"{100.0 * (finite(n.get('share')) or 0.0):.1f}%"]
                       for i, n in enumerate(costly, 1)], "rllrr")
    for title, key, head in (("Patterns found", "patterns", "pattern"),
                             ("Unsupported ops", "unsupported_ops", "op"),
                             ("Flagged nodes", "flagged_nodes", "flag")):
        counts_map = s.get(key) or {}
        if counts_map:
            out += [f"{h} {title}", ""]
            out += _table([head, "count"], [[_code(k), fmt_count(v)]
                                            for k, v in sorted(counts_map.items())], "lr")
    warnings = plan.get("warnings") or []
    if warnings:
        out += [f"{h} Warnings", ""] + [f"- {_text(w)}" for w in warnings] + [""]
    return out


def _node_table(plan: Mapping[str, Any], h: str, max_nodes: int) -> list[str]:
    nodes = [n for n in plan.get("nodes") or [] if isinstance(n, Mapping)]
    if not nodes:
        return []
    order = sorted(range(len(nodes)), key=lambda i: (-(finite(nodes[i].get("est_time_s")) or 0), i))
    shown = order[: max(0, max_nodes)]
    title = "Nodes" if len(shown) == len(nodes) else f"Nodes (top {len(shown)} by est. time)"
    out = [f"{h} {title}", ""]
    if len(shown) < len(nodes):
        out += [f"_{len(nodes) - len(shown):,} more nodes not shown; "
                f"the HTML or JSON report lists all {len(nodes):,}._", ""]
    lat = (plan.get("summary") or {}).get("est_latency_s")
    rows = []
    for i in shown:
        n = nodes[i]
        decisions = n.get("decisions") or {}
        dec = "; ".join(f"{_text(k)}: {_text(decision_summary(decisions[k]))}"
                        for k in sorted(decisions))
        op = n.get("op_type") or n.get("op") or "?"  # canonical: aten.linear.default -> Linear
        rows.append([_code(n.get("name", "?")), _code(op), _code(n.get("kernel_class", "?")),
                     _text(fmt_dims(n.get("dims"))), _text(n.get("dtype") or "—"),
                     fmt_si(n.get("flops")), fmt_bytes(n.get("bytes")),
                     f"{finite(n.get('arithmetic_intensity')) or 0.0:.3g}",
                     _text(n.get("bottleneck", "?")), fmt_seconds(n.get("est_time_s")),
                     _share(n.get("est_time_s"), lat), dec or "—"])
    return out + _table(["node", "op", "kernel class", "dims", "dtype", "FLOPs", "bytes",
                         "FLOP/B", "bottleneck", "est. time", "share", "decisions"],
                        rows, "lllllrrrlrrl")


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
        return _code(min(t, key=lambda c: (-(finite(t[c]) or 0), c))) if t else "—"

    rows = [
        row("kind", [_text(f"{t.get('kind', '?')} / {t.get('generation', '?')}") for t in tgts]),
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
    header = ["", *[_text(t.get("display_name") or t.get("name", "?")) for t in tgts]]
    return _table(header, rows, "l" + "r" * len(plans))


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
    out = [f"# graphopt plan: {_code(model.get('name', '?'))}", "",
           f"_graphopt {_text(version)}, report schema v{_text(report.get('schema_version', 1))}_",
           "", *_model_lines(model)]
    if len(plans) == 1:
        out += [_target_line(first.get("target") or {}), *_plan_summary(first, "##")]
        out += _node_table(first, "##", max_nodes)
    else:
        out += ["", "## Targets compared", "", *_comparison(plans)]
        for plan in plans:
            tgt = plan.get("target") or {}
            out += [f"## {_text(tgt.get('display_name') or tgt.get('name', '?'))}", "",
                    _target_line(tgt), *_plan_summary(plan, "###")]
            out += _node_table(plan, "###", max_nodes)
    logger.debug("rendered markdown for %d plan(s)", len(plans))
    return "\n".join(out).rstrip("\n") + "\n"
