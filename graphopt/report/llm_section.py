"""The report's ``llm`` section (``graphopt.plan_llm``, an
:class:`~graphopt.ir.plan_llm.LLMSection`): decode and prefill tokens/s per batch
beside their bounds, the weight GEMMs' formats, and the KV cache in memory, as Markdown and
HTML.

Both renderers print the same cells from :func:`llm_tables` and the same facts from
:func:`llm_facts`, so the two reports cannot disagree on a value.
"""

from __future__ import annotations

from collections.abc import Mapping

from graphopt.ir.plan_llm import DecodeRow, LLMSection, PrefillRow
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


def _pct(x: float) -> str:
    return f"{x:.0%}"


def _counts(counts: Mapping[str, int]) -> str:
    """``gemm x4, gemv x2``: how many weight GEMMs per kernel class or format, by name."""
    return ", ".join(f"{k} x{v}" for k, v in sorted(counts.items()))


def _decode_row(r: DecodeRow) -> list[str]:
    return [fmt_count(r.batch), fmt_seconds(r.step_s), fmt_si(r.tokens_per_s),
            fmt_si(r.tokens_per_s_static_cache), fmt_si(r.bound_tokens_per_s),
            _pct(r.share_of_bound), fmt_bytes(r.kv_read_bytes), _counts(r.weight_gemm_classes),
            yes_no(r.fits)]


def _prefill_row(r: PrefillRow) -> list[str]:
    return [fmt_count(r.batch), fmt_seconds(r.step_s), fmt_si(r.tokens_per_s),
            fmt_si(r.bound_tokens_per_s), _pct(r.share_of_bound), r.bound_by or "—",
            fmt_bytes(r.kv_write_bytes)]


def llm_tables(llm: LLMSection) -> tuple[list[list[str]], list[list[str]]]:
    """(decode rows, prefill rows), formatted, one per batch."""
    return [_decode_row(r) for r in llm.decode], [_prefill_row(r) for r in llm.prefill]


def _gemm_formats(llm: LLMSection) -> str:
    """The weight GEMMs' formats: one list when both phases agree, else one per phase."""
    decode = _counts(llm.weight_formats.decode.gemm_formats)
    prefill = _counts(llm.weight_formats.prefill.gemm_formats)
    if decode == prefill:
        return f"{decode or '—'} weight GEMMs"
    return f"decode {decode or '—'} · prefill {prefill or '—'}"


def llm_facts(llm: LLMSection) -> list[Fact]:
    m, mem, b = llm.model, llm.memory, llm.batch
    q = llm.quantize or "none"
    asked = {"none": "none (as traced)", "auto": "auto (each GEMM's precision decision)"
             }.get(q, q)
    return [
        ("model", f"{m.layers} layers · {m.heads} heads · {m.kv_heads} KV heads · "
                  f"head_dim {m.head_dim}",
         f"{fmt_si(m.param_count)} parameters, {fmt_bytes(m.param_bytes)} ({m.dtype})"),
        ("weights", _gemm_formats(llm),
         f"quantize={asked} · {fmt_bytes(mem.weight_bytes)} of weights in the bound, "
         "the memory plan and the largest batch"),
        ("phases", f"prefill {fmt_count(llm.prompt_len)} tokens · decode against "
                   f"{fmt_count(llm.cache_len)} cached",
         f"batch {b.min}–{b.max}, planned at {b.opt}"),
        ("KV cache", f"{fmt_bytes(mem.kv_bytes_per_sequence)} per sequence",
         f"{fmt_bytes(mem.kv_bytes_per_token)} per token"),
        ("at the max batch", f"{fmt_bytes(mem.kv_bytes_at_max)} KV · "
                             f"{fmt_bytes(mem.required_bytes_at_max)} in all",
         f"of {fmt_bytes(mem.usable_bytes)} usable: fits {yes_no(mem.fits_at_max)}"),
        ("largest batch that fits", fmt_count(mem.max_batch_size),
         f"with {fmt_count(llm.cache_len)} cached tokens each"),
        ("recommended decode batch", fmt_count(mem.recommended_batch_size),
         f"decided by {mem.batch_decided_by or '?'}: {mem.batch_advice or ''}"),
    ]


def llm_md(llm: LLMSection, h: str) -> list[str]:
    decode, prefill = llm_tables(llm)
    out = [f"{h} LLM prefill and decode", "", *facts_md(llm_facts(llm)), ""]
    if decode:
        out += [f"{h}# Decode (one token per sequence)", "",
                *md_table(_DECODE, decode, "rrrrrrrll")]
    if prefill:
        out += [f"{h}# Prefill", "", *md_table(_PREFILL, prefill, "rrrrrlr")]
    return out + [f"- {md_text(n)}" for n in llm.notes] + ([""] if llm.notes else [])


def llm_html(llm: LLMSection) -> str:
    def table(head: list[str], rows: list[list[str]]) -> str:
        ths = "".join(f"<th>{esc(x)}</th>" for x in head)
        body = "".join("<tr>" + "".join(f'<td class="num">{esc(c)}</td>' for c in r) + "</tr>"
                       for r in rows)
        return f"<table><thead><tr>{ths}</tr></thead><tbody>{body}</tbody></table>"

    decode, prefill = llm_tables(llm)
    notes = "".join(f"<li>{esc(n)}</li>" for n in llm.notes)
    facts = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}"
                    + (f' <span class="faint">{esc(d)}</span>' if d else "") + "</dd>"
                    for k, v, d in llm_facts(llm))
    return ('<div class="panel llm"><h3>LLM prefill and decode<span class="hint">tokens/s '
            'per batch beside the bandwidth bound</span></h3>'
            f'<dl class="facts">{facts}</dl>'
            + (f"<h4>Decode</h4>{table(_DECODE, decode)}" if decode else "")
            + (f"<h4>Prefill</h4>{table(_PREFILL, prefill)}" if prefill else "")
            + (f'<ul class="notes">{notes}</ul>' if notes else "") + "</div>")
