"""Markdown rendering of plan reports built by hand (no model, no browser), and the formatting
helpers both renderers share.

The reports (tests/report_plans.py) hold hostile names on purpose: a node named
``<script>alert(1)</script>`` and a tensor named ``</script><b>x``; the renderer must keep them
inert. The HTML renderer is tested in test_report_render_html.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from graphopt.ir.decision_details import (
    ExecPath,
    ExecPathDetail,
    FoldDetail,
    GroupsCarryDetail,
    LayoutDetail,
    LayoutFormat,
    PaddingCarryDetail,
    PaddingDetail,
    PaddingSkip,
    PrecisionDetail,
)
from graphopt.ir.plan import Decision
from graphopt.ir.plan_memory import QuantizationPlan
from graphopt.report.format import (
    decision_head,
    decision_summary,
    fmt_cosine,
    fmt_pct,
    fmt_seconds,
)
from graphopt.report.html import render_html
from graphopt.report.markdown import render_markdown

# The report builders live in tests/report_plans.py. test_report_partition.py, test_report_data.py
# and test_report_browser.py import them from here: the ``as`` lines re-export the ones this file
# does not use itself.
from tests.report_plans import EVIL_NODE, make_multi, make_optimized, make_plan, typed
from tests.report_plans import EVIL_TENSOR as EVIL_TENSOR
from tests.report_plans import _hostile_everywhere as _hostile_everywhere
from tests.report_plans import _reversed_dicts as _reversed_dicts
from tests.report_plans import embedded_data as embedded_data

# ------------------------------------------------------------------------------------ markdown

def test_markdown_summary_sections() -> None:
    plan = make_plan()
    md = render_markdown(typed(plan))
    for text in ("# graphopt plan: `tiny-llama <test>`", "NVIDIA H100 SXM", "Estimated latency",
                 fmt_seconds(plan["summary"]["est_latency_s"]), "## Bottleneck mix",
                 "## Time by kernel class", "## Costliest nodes", "## Unsupported ops",
                 "`WeirdOp`", "## Warnings", "## Nodes", "| bf16 · tma_wgmma |",
                 "bf16 · tma_wgmma; padding: not applied |", "| `lm_head` |"):
        assert text in md, text
    # the costliest node leads the per-node table
    table = md[md.index("## Nodes"):]
    assert table.index("`lm_head`") < table.index("`layers.0.attn.q_proj`")


def test_markdown_keeps_hostile_text_inert() -> None:
    plan = make_plan()
    evil = next(n for n in plan["nodes"] if n["name"] == EVIL_NODE)
    # a decision's value that is free text (a layout is an enum, a precision format a string)
    evil["decisions"]["precision"] = {"format": "<b>nhwc</b>", "applied": True, "reason": "r"}
    md = render_markdown(typed(plan))
    # names only inside code spans; free text has its markup characters escaped
    assert md.count(EVIL_NODE) == md.count(f"`{EVIL_NODE}`") > 0
    assert "<i>" not in md and "\\<i\\>x\\</i\\> \\& co" in md
    assert md.count("<b>nhwc") == md.count("`<b>nhwc</b>`") and "\\<b\\>nhwc\\</b\\>" in md
    markdown_it = pytest.importorskip("markdown_it")
    rendered = markdown_it.MarkdownIt("commonmark").enable("table").render(md)
    assert "<script" not in rendered and "<b>" not in rendered and "<i>" not in rendered
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in rendered


def test_markdown_truncates_node_table() -> None:
    md = render_markdown(typed(make_plan(extra_nodes=20)), max_nodes=5)
    table = md[md.index("## Nodes (top 5 by est. time)"):]
    assert "23 more nodes not shown" in table
    assert sum(line.startswith("| `") for line in table.splitlines()) == 5


def test_markdown_multi_target_columns() -> None:
    md = render_markdown(typed(make_multi()))
    cmp_table = md[md.index("## Targets compared"):md.index("## NVIDIA H100 SXM")]
    assert cmp_table.splitlines()[2] == "|  | NVIDIA H100 SXM | NVIDIA A100 SXM |"
    assert "| **est. latency** |" in cmp_table and "1.00×" in cmp_table
    assert md.count("### Costliest nodes") == 2 and "## NVIDIA A100 SXM" in md


def test_markdown_deployment_sections() -> None:
    md = render_markdown(typed(make_optimized()))
    for text in (
            "**passes applied:** precision, padding", "**outputs within:** 1 of 1 — ✓",
            "| `layout` | reverted: output \\<0\\> cosine 0.98 |",
            "| 0 | 0.00399 | 0.163 | 0.425 | 0.99999951 | ✓ |", "casts inserted 4; fp32 islands 2",
            "runtime: allow_tf32=False", "carried 1; padded nodes 3; slices 1",
            "**layout:** conversions 2; inserted 2; regions 1",
            "| parameters | 1.41 MiB | 1,478,840 | \\<0.01% |",
            "| free | 73.6 GiB | 78,992,229,935 | 91.96% |",
            "**max batch size:** 1,169,904 — 1169910 samples fit",
            "**parameters vs fp32:** 2.00× smaller — 2.82 MiB in fp32 → 1.41 MiB (per-node)",
            "- activations \\<assumed\\> linear", "**recommended:** FP8 (E4M3) — fp8_e4m3",
            "| `fp8_e4m3` ← | 8 | 32.8 MiB | yes | yes | yes |",
            "| `nvfp4` | 4.5 | 32.8 MiB | yes | no | no | NVFP4 needs one of \\[fp4\\]",
            "_For device `cuda`, target `h100-sxm`._",
            "| `matmul_allow_tf32` | `True` | rule 1: TF32 \\<ok\\> \\& precision 'bf16' tolerates",
            "| `num_threads` | `not set` | rule 6 |",
            "| `sdpa_backends` | `flash, efficient, math` |",
            "  - **exec_path** `tma_wgmma`: TMA loads + wgmma \\<tile 64x128x64\\> (instruction: ",
            "launch: grid 132×1×1 · block 256×1×1 · 128 KiB shared memory · vector width 8; tile: "
            "64×128×64 (m×n×k) · stages 4 · 90.0% of tile slots useful; tma: yes)"):
        assert text in md, text
    heads = [md.index(f"## {h}\n") for h in ("Optimization", "Memory", "Quantization",
                                               "Runtime settings", "Nodes")]
    assert heads == sorted(heads)


def test_quantization_without_parameters() -> None:
    plan = make_plan()
    plan["quantization"] = QuantizationPlan.nothing_to_quantize(
        "the model has no parameters <none>").to_json()
    md = render_markdown(typed(plan))
    assert "**recommended:** none" in md and "no parameters \\<none\\>" in md
    page = render_html(typed(plan))
    assert "no parameters &lt;none&gt;" in page and "Formats considered" not in page


def test_multi_target_deployment_side_by_side() -> None:
    report = make_multi()
    a100 = report["plans"][1]
    a100["memory"]["max_batch_size"] = 1170344
    a100["quantization"].update(format="int8", display="INT8")
    md = render_markdown(typed(report))
    table = md[md.index("## Memory, format and runtime settings compared"):
               md.index("## NVIDIA H100 SXM\n")]
    for row in ("| max batch size | 1,169,904 | 1,170,344 |", "| recommended | FP8 (E4M3) | INT8 |",
                "| `matmul_allow_tf32` | True | True |", "| `num_threads` | not set | not set |",
                "| `sdpa_backends` | flash, efficient, math | flash, efficient, math |"):
        assert row in table, row
    assert md.count("### Memory") == 2 and md.count("### Runtime settings") == 2
    page = render_html(typed(report))
    dep = page[page.index('<table class="cmp dep">'):]
    dep = dep[:dep.index("</table>")]
    assert ('<td>max batch size</td><td class="num">1,169,904</td><td class="num">1,170,344</td>'
            in dep)
    assert '<td class="mono">sdpa_backends</td>' in dep and "INT8" in dep
    assert page.count('<details class="more">') == 2  # per-target panels, folded


def test_absent_sections_are_left_out() -> None:
    """A section the plan does not hold (None) prints nothing, and a dash beside a target that
    has it."""
    plan = make_plan()
    for key in ("memory", "quantization", "runtime_settings"):
        del plan[key]
    md = render_markdown(typed(plan))
    for head in ("## Memory", "## Quantization", "## Runtime settings", "## Deploy",
                 "## Optimization", "## LLM"):
        assert head not in md, head
    report = make_multi()
    del report["plans"][1]["memory"]
    md = render_markdown(typed(report))
    table = md[md.index("## Memory, format and runtime settings compared"):
               md.index("## NVIDIA H100 SXM\n")]
    assert "| fits | yes | — |" in table and "| max batch size | 1,169,904 | — |" in table
    assert md.count("### Memory") == 1


@pytest.mark.parametrize(("value", "expected"), [
    (0.999999512698278, "0.99999951"), (0.98765, "0.9877"), (1.0, "1"), (None, "—")])
def test_fmt_cosine(value: Any, expected: str) -> None:
    assert fmt_cosine(value) == expected


def test_fmt_pct_and_decision_head() -> None:
    assert [fmt_pct(0.0, 5), fmt_pct(0.0, 0), fmt_pct(91.96, 1)] == ["<0.01%", "0.00%", "91.96%"]
    assert decision_head({"precision": Decision("r", PrecisionDetail(format="bf16")),
                          "exec_path": Decision("r", ExecPathDetail(path=ExecPath.WGMMA)),
                          "padding": Decision("r", PaddingSkip(), applied=False)}
                         ) == "bf16 · wgmma"
    assert decision_head({"precision": Decision("r", PrecisionDetail(format="fp32"),
                                                applied=False)}) == "fp32"
    layout = Decision("r", LayoutDetail(LayoutFormat.CHANNELS_LAST, 0, None))
    assert decision_head({"layout": layout}) == decision_head({}) == ""


@pytest.mark.parametrize(("decision", "expected"), [
    (Decision("r", PrecisionDetail(format="bf16")), "bf16"),
    (Decision("r", PaddingSkip(), applied=False), "not applied"),
    (Decision("r", FoldDetail(into="conv_1")), "conv_1"),  # its one field
    (Decision("r", PaddingCarryDetail(real=3, padded=8, clean=True), applied=False),
     "carries 3 → 8 channels (not applied)"),
    (Decision("r", PaddingCarryDetail(real=3, padded=8, clean=False)),
     "carries 3 → 8 channels (junk in the padding, read as zeros)"),
    # a padding decision reads as a sentence, never a dict (issue 35, item 5)
    (Decision("r", PaddingDetail(old={"C_in": 3, "C_out": 30}, new={"C_in": 3, "C_out": 32},
                                 multiple=8, waste_pct=6.25, predicted_gain=1.12)),
     "padded C_out 30 → 32: 1.12x predicted"),
    (Decision("r", PaddingDetail(old={"K": 37}, new={"K": 37}, multiple=8, waste_pct=0.0,
                                 predicted_gain=0.58, candidate={"K": 40}), applied=False),
     "K 37 → 40: 0.58x predicted (not applied)"),
    (Decision("r", PaddingDetail(old={"K": 288}, new={"K": 288}, multiple=8, waste_pct=0.0,
                                 predicted_gain=1.0), applied=False), "kept K=288 (not applied)"),
    (Decision("r", GroupsCarryDetail(old={"groups": 30}, new={"groups": 32})),
     "padded groups 30 → 32"),
])
def test_decision_summary(decision: Decision, expected: str) -> None:
    assert decision_summary(decision) == expected


def test_nested_notes_stay_in_the_json() -> None:
    """A pass's nested notes (the device pass's per-graph changes) show as a count, never as a
    Python dict on the page (issue 35, item 5); flat ones still read as key=value."""
    from graphopt.report.optimization import note_items

    counts, texts = note_items({"devices": {"<root>": {"rewritten": ["a", "b"]}},
                                "buffers": ["x"], "runtime": {"allow_tf32": False}})
    assert ("devices", "1") in counts and ("buffers", "1") in counts
    assert texts == [("runtime", "allow_tf32=False")]
    assert not any("{" in t for _, t in texts)
