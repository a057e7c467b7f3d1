"""The number, decision and markdown-escaping formatters both report renderers share.

They live apart from the renderers so every renderer and section module imports them one way:
``markdown``/``html`` import the sections, the sections import these, never back (an entry point
that also held the formatters made ``report/`` import itself in a cycle). Both reports print the
same values because they format them here.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from graphopt.ir.decision_details import Detail, ExecPathDetail, Launch, Tile

if TYPE_CHECKING:  # ir.plan imports the report package (its emitters): no import at run time
    from graphopt.ir.plan import Decision, Plan, PlanSet

__all__ = [
    "BOTTLENECKS",
    "HEAD_KINDS",
    "decision_fields",
    "decision_head",
    "decision_summary",
    "decision_texts",
    "finite",
    "fmt_bytes",
    "fmt_cosine",
    "fmt_count",
    "fmt_dims",
    "fmt_err",
    "fmt_pct",
    "fmt_rate",
    "fmt_seconds",
    "fmt_shape",
    "fmt_si",
    "fmt_value",
    "md_code",
    "md_table",
    "md_text",
    "ordered_kinds",
    "plans_of",
    "yes_no",
]

logger = logging.getLogger(__name__)

#: the plan report's layout this renderer reads (graphopt.ir.plan.SCHEMA_VERSION)
SCHEMA_VERSION = 2
BOTTLENECKS = ("compute", "memory", "latency")
# Keys that name what a decision chose, most specific first; the first present is its "value".
_VALUE_KEYS = ("choice", "value", "selected", "action", "decision", "format", "path", "layout",
               "dtype", "precision", "device", "to", "status")
_DIM_ORDER = ("batch", "M", "N", "K")
HEAD_KINDS = ("precision", "exec_path")  # shown together as "bf16 · tma_wgmma"
_HEAD_FIELDS = (("precision", "format"), ("exec_path", "path"))  # each one's detail field


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


def _detail_json(decision: Decision | Mapping[str, Any]) -> Mapping[str, Any]:
    """A decision's own fields as its JSON writes them (the keys it has, values as written);
    a decision given as its JSON (an ONNX artifact's node decisions are held so) as it is."""
    if isinstance(decision, Mapping):
        return {k: v for k, v in decision.items() if k not in ("reason", "applied")}
    return decision.detail.to_json()


def decision_summary(decision: Decision | Mapping[str, Any]) -> str:
    """The short value of one decision (``bf16``, ``nhwc``, ``pad_to=64``, ``not applied``):
    the field that names what it chose, else its only field, else its first as ``key=value``."""
    applied = decision.get("applied") if isinstance(decision, Mapping) else decision.applied
    return _summary(_detail_json(decision), applied)


def _dims_text(dims: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={dims[k]}" for k in sorted(dims, key=str))


def _resize_sentence(fields: Mapping[str, Any], applied: Any) -> str | None:
    """A padding-like decision (old and new dims) as words: ``padded C_out 30 → 32: 1.12x
    predicted``; one not taken as ``C_out 37 → 40: 0.58x predicted``, or ``kept K=288, N=864``
    when nothing was tried; a channel carry as ``carries 30 → 32 channels``. None for any
    other decision."""
    if "real" in fields and "padded" in fields:
        dirty = "" if fields.get("clean", True) else " (junk in the padding, read as zeros)"
        return f"carries {fields['real']} → {fields['padded']} channels{dirty}"
    old, new = fields.get("old"), fields.get("new")
    if not isinstance(old, Mapping) or not isinstance(new, Mapping):
        return None
    gain = finite(fields.get("predicted_gain"))
    said = f": {gain:.2f}x predicted" if gain is not None else ""
    candidate = fields.get("candidate")
    to = new if new != old or not isinstance(candidate, Mapping) else candidate
    changed = [f"{k} {old.get(k, '?')} → {to[k]}" for k in sorted(to, key=str)
               if old.get(k) != to[k]]
    if not changed:
        return f"kept {_dims_text(old)}" if old else None
    return ("padded " if applied is not False else "") + ", ".join(changed) + said


def _summary(fields: Mapping[str, Any], applied: Any) -> str:
    sentence = _resize_sentence(fields, applied)
    if sentence is not None:
        return f"{sentence} (not applied)" if applied is False else sentence
    key = next((k for k in _VALUE_KEYS if k in fields), None)
    if key is not None or len(fields) == 1:
        value = str(fields[key if key is not None else next(iter(fields))])
    elif fields:
        first = next(iter(fields))
        value = f"{first}={fields[first]}"
    else:
        return "not applied" if applied is False else "applied"
    return f"{value} (not applied)" if applied is False else value


def plans_of(report: Plan | PlanSet) -> tuple[Plan, ...]:
    """The plans of a single- or multi-target report (a Plan or a PlanSet), in report order."""
    plans = getattr(report, "plans", None)  # a PlanSet; duck-typed: ir.plan imports the report
    return (report,) if plans is None else tuple(plans)


def yes_no(value: Any) -> str:
    return "yes" if value is True else "no" if value is False else "—"


def fmt_value(value: Any) -> str:
    """A runtime setting as it would be written in code; ``None`` means "leave it alone"."""
    if value is None:
        return "not set"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, (list, tuple)):
        return ", ".join(fmt_value(v) for v in value)
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def fmt_pct(percent: Any, nbytes: Any = None) -> str:
    """A percentage given x100 (``8.0`` is 8 %); non-zero bytes never print as ``0.00%``."""
    p = finite(percent)
    if p is None:
        return "—"
    return "<0.01%" if p < 0.005 and (finite(nbytes) or 0) > 0 else f"{p:.2f}%"


def fmt_err(value: Any) -> str:
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    v = finite(value)
    return "—" if v is None else f"{v:.3g}"


def fmt_cosine(value: Any) -> str:
    """Enough digits to show how far from 1 it is: 0.99999951, 0.9987, 1."""
    c = finite(value)
    if c is None:
        return "—"
    if c >= 1.0:
        return "1"
    digits = min(12, max(4, 1 - math.floor(math.log10(1.0 - c)))) if c > 0 else 4
    return f"{c:.{digits}f}"


def _dims3(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "×".join(str(v) for v in value)
    return str(value)


def _tile(tile: Tile, instruction: str | None) -> str:
    parts = []
    if tile.m is not None and tile.n is not None and tile.k is not None:
        parts.append(f"{tile.m}×{tile.n}×{tile.k} (m×n×k)")
    for label, v in (("stages", tile.stages), ("k iterations", tile.k_iters),
                     ("waves", tile.waves)):
        if v is not None:
            parts.append(f"{label} {v}")
    if tile.swap_ab:
        parts.append("A/B swapped")
    if (efficiency := finite(tile.efficiency)) is not None:
        parts.append(f"{100 * efficiency:.1f}% of tile slots useful")
    if tile.instruction and tile.instruction != instruction:
        parts.append(tile.instruction)
    if tile.swizzle_bytes is not None:
        parts.append(f"swizzle_bytes={fmt_value(tile.swizzle_bytes)}")
    return " · ".join(parts)


def _launch(launch: Launch) -> str:
    parts = [f"{k} {_dims3(v)}" for k, v in (("grid", launch.grid), ("block", launch.block),
                                             ("cluster", launch.cluster)) if v is not None]
    if launch.smem_bytes is not None:
        parts.append(f"{fmt_bytes(launch.smem_bytes)} shared memory")
    if launch.vector_width is not None:
        parts.append(f"vector width {launch.vector_width}")
    if launch.threads is not None:
        parts.append(f"threads={fmt_value(launch.threads)}")
    return " · ".join(parts)


def decision_fields(decision: Decision) -> list[tuple[str, str]]:
    """A decision's fields besides its value, by name; a kernel's tile and launch compacted."""
    return _fields(decision.detail, decision.detail.to_json())


def decision_texts(decision: Decision) -> tuple[str, list[tuple[str, str]]]:
    """``decision_summary`` and ``decision_fields`` of one decision from one write of its JSON
    (the HTML report formats each distinct decision: 50k of them in a split plan)."""
    fields = decision.detail.to_json()
    return _summary(fields, decision.applied), _fields(decision.detail, fields)


def _fields(detail: Detail, fields: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``fields``: the detail's JSON (the fields it has, under their JSON names)."""
    out = []
    value_key = next((k for k in _VALUE_KEYS if k in fields), None)
    for key in sorted(fields):
        v = fields[key]
        if key == value_key or v is None or v in ("", {}, []):
            continue
        if key == "tile" and isinstance(detail, ExecPathDetail) and detail.tile is not None:
            text = _tile(detail.tile, detail.instruction)
        elif key == "launch" and isinstance(detail, ExecPathDetail) and detail.launch is not None:
            text = _launch(detail.launch)
        elif isinstance(v, bool):
            text = yes_no(v)
        elif isinstance(v, Mapping):
            text = ", ".join(f"{k}={fmt_value(v[k])}" for k in sorted(v, key=str))
        else:
            text = fmt_value(v)
        if text:
            out.append((key, text))
    return out


def ordered_kinds(decisions: Mapping[str, Decision]) -> list[str]:
    """Precision and execution path first (what a reader looks for), then the rest by name."""
    rest = sorted((k for k in decisions if k not in HEAD_KINDS), key=str)
    return [k for k in HEAD_KINDS if k in decisions] + rest


def decision_head(decisions: Mapping[str, Decision]) -> str:
    """``bf16 · tma_wgmma``: the precision format and the execution path of a node."""
    return " · ".join(str(getattr(decisions[kind].detail, field, None)
                          or decision_summary(decisions[kind]))
                      for kind, field in _HEAD_FIELDS if kind in decisions)


# --------------------------------------------------------------------------- markdown escaping

_MD_SPECIAL = re.compile(r"([\\`*\[\]<>|&#~!])")
_LOOSE_UNDERSCORE = re.compile(r"(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])")


def md_text(value: Any) -> str:
    """Free text made inert: structure characters backslash-escaped, one line."""
    s = " ".join(str(value).split())
    s = _MD_SPECIAL.sub(r"\\\1", s)
    return _LOOSE_UNDERSCORE.sub(r"\\_", s)


def md_code(value: Any) -> str:
    """A name as a code span (no markdown or HTML is interpreted inside) safe in a table cell."""
    s = " ".join(str(value).split()).replace("|", "\\|")
    if not s:
        return ""
    fence = "`" * (max((len(r) for r in re.findall(r"`+", s)), default=0) + 1)
    pad = " " if s.startswith("`") or s.endswith("`") else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str = "") -> list[str]:
    """A GFM table; ``align`` holds one of ``l``/``r`` per column (default left)."""
    marks = ["---:" if a == "r" else "---" for a in align.ljust(len(header), "l")]
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join(marks) + " |"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out + [""]


#: (label, value, detail) of one line of a report section
Fact = tuple[str, str, str]


def facts_md(facts: Sequence[Fact]) -> list[str]:
    return [f"- **{md_text(k)}:** {md_text(v)}" + (f" — {md_text(d)}" if d else "")
            for k, v, d in facts]
