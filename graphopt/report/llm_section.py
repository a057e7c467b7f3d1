"""The report's ``llm`` section (``graphopt.plan_llm``): decode and prefill tokens/s per batch
beside their bounds, the weight GEMMs' formats, and the KV cache in memory, as Markdown and
HTML.

Both renderers print the same cells from :func:`llm_tables` and the same facts from
:func:`llm_facts`, so the two reports cannot disagree on a value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from graphopt.report.format import (
    Fact,
    facts_md,
    fmt_bytes,
    fmt_count,
    fmt_seconds,
    fmt_si,
    md_table,
    md_text,
    yes_no,
)
from graphopt.report.html_text import esc

__all__ = ["llm_facts", "llm_html", "llm_md", "llm_tables"]

_DECODE = ["batch", "step", "tokens/s", "static cache", "bound", "of bound", "KV read",
           "weight GEMMs", "fits"]
_PREFILL = ["batch", "step (TTFT)", "tokens/s", "bound", "of bound", "bound by", "KV written"]


def _pct(x: Any) -> str:
    return "—" if not isinstance(x, (int, float)) else f"{x:.0%}"


def _classes(row: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} x{v}" for k, v in sorted((row.get("weight_gemm_classes") or {})
                                                     .items()))


def llm_tables(llm: Mapping[str, Any]) -> tuple[list[list[str]], list[list[str]]]:
    """(decode rows, prefill rows), formatted, one per batch."""
    decode = [[fmt_count(r.get("batch")), fmt_seconds(r.get("step_s")),
               fmt_si(r.get("tokens_per_s")), fmt_si(r.get("tokens_per_s_static_cache")),
               fmt_si(r.get("bound_tokens_per_s")), _pct(r.get("share_of_bound")),
               fmt_bytes(r.get("kv_read_bytes")), _classes(r), yes_no(r.get("fits"))]
              for r in llm.get("decode") or [] if isinstance(r, Mapping)]
    prefill = [[fmt_count(r.get("batch")), fmt_seconds(r.get("step_s")),
                fmt_si(r.get("tokens_per_s")), fmt_si(r.get("bound_tokens_per_s")),
                _pct(r.get("share_of_bound")), str(r.get("bound_by") or "—"),
                fmt_bytes(r.get("kv_write_bytes"))]
               for r in llm.get("prefill") or [] if isinstance(r, Mapping)]
    return decode, prefill


def _gemm_formats(llm: Mapping[str, Any]) -> str:
    """The weight GEMMs' formats: one list when both phases agree, else one per phase."""
    per = {p: ", ".join(f"{k} x{v}" for k, v in sorted(
        ((llm.get("weight_formats") or {}).get(p) or {}).get("gemm_formats", {}).items()))
        for p in ("decode", "prefill")}
    if per["decode"] == per["prefill"]:
        return f"{per['decode'] or '—'} weight GEMMs"
    return f"decode {per['decode'] or '—'} · prefill {per['prefill'] or '—'}"


def llm_facts(llm: Mapping[str, Any]) -> list[Fact]:
    m, mem, b = llm.get("model") or {}, llm.get("memory") or {}, llm.get("batch") or {}
    q = llm.get("quantize") or "none"
    asked = {"none": "none (as traced)", "auto": "auto (each GEMM's precision decision)"
             }.get(q, q)
    return [
        ("model", f"{m.get('layers')} layers · {m.get('heads')} heads · {m.get('kv_heads')} "
                  f"KV heads · head_dim {m.get('head_dim')}",
         f"{fmt_si(m.get('param_count'))} parameters, {fmt_bytes(m.get('param_bytes'))} "
         f"({m.get('dtype')})"),
        ("weights", _gemm_formats(llm),
         f"quantize={asked} · {fmt_bytes(mem.get('weight_bytes'))} of weights in the bound, "
         "the memory plan and the largest batch"),
        ("phases", f"prefill {fmt_count(llm.get('prompt_len'))} tokens · decode against "
                   f"{fmt_count(llm.get('cache_len'))} cached",
         f"batch {b.get('min')}–{b.get('max')}, planned at {b.get('opt')}"),
        ("KV cache", f"{fmt_bytes(mem.get('kv_bytes_per_sequence'))} per sequence",
         f"{fmt_bytes(mem.get('kv_bytes_per_token'))} per token"),
        ("at the max batch", f"{fmt_bytes(mem.get('kv_bytes_at_max'))} KV · "
                             f"{fmt_bytes(mem.get('required_bytes_at_max'))} in all",
         f"of {fmt_bytes(mem.get('usable_bytes'))} usable: fits {yes_no(mem.get('fits_at_max'))}"),
        ("largest batch that fits", fmt_count(mem.get("max_batch_size")),
         f"with {fmt_count(llm.get('cache_len'))} cached tokens each"),
        ("recommended decode batch", fmt_count(mem.get("recommended_batch_size")),
         f"decided by {mem.get('batch_decided_by') or '?'}: {mem.get('batch_advice') or ''}"),
    ]


def llm_md(llm: Mapping[str, Any], h: str) -> list[str]:
    decode, prefill = llm_tables(llm)
    out = [f"{h} LLM prefill and decode", "", *facts_md(llm_facts(llm)), ""]
    if decode:
        out += [f"{h}# Decode (one token per sequence)", "",
                *md_table(_DECODE, decode, "rrrrrrrll")]
    if prefill:
        out += [f"{h}# Prefill", "", *md_table(_PREFILL, prefill, "rrrrrlr")]
    notes = llm.get("notes") or []
    return out + [f"- {md_text(n)}" for n in notes] + ([""] if notes else [])


def llm_html(llm: Mapping[str, Any]) -> str:
    def table(head: list[str], rows: list[list[str]]) -> str:
        ths = "".join(f"<th>{esc(x)}</th>" for x in head)
        body = "".join("<tr>" + "".join(f'<td class="num">{esc(c)}</td>' for c in r) + "</tr>"
                       for r in rows)
        return f"<table><thead><tr>{ths}</tr></thead><tbody>{body}</tbody></table>"

    decode, prefill = llm_tables(llm)
    notes = "".join(f"<li>{esc(n)}</li>" for n in llm.get("notes") or [])
    facts = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}"
                    + (f' <span class="faint">{esc(d)}</span>' if d else "") + "</dd>"
                    for k, v, d in llm_facts(llm))
    return ('<div class="panel llm"><h3>LLM prefill and decode<span class="hint">tokens/s '
            'per batch beside the bandwidth bound</span></h3>'
            f'<dl class="facts">{facts}</dl>'
            + (f"<h4>Decode</h4>{table(_DECODE, decode)}" if decode else "")
            + (f"<h4>Prefill</h4>{table(_PREFILL, prefill)}" if prefill else "")
            + (f'<ul class="notes">{notes}</ul>' if notes else "") + "</div>")
