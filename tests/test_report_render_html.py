"""HTML rendering of plan reports built by hand (no model, no browser): escaping of untrusted
names and of every string field, a self-contained page whose CSP pins its one script,
determinism, the deployment panels, the roofline, several targets, NaN, a plan without nodes
and a set without plans.

The reports come from tests/report_plans.py; the Markdown renderer is tested in
test_report_render.py.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import hashlib
import html
import math
import re

import pytest

from graphopt.ir.plan import PlanSet
from graphopt.report.html import render_html
from graphopt.report.markdown import render_markdown
from tests.report_plans import (
    DATA_OPEN,
    EVIL_NODE,
    EVIL_TENSOR,
    _hostile_everywhere,
    embedded_data,
    make_multi,
    make_optimized,
    make_plan,
    typed,
)

# ---------------------------------------------------------------------------------------- html

def test_html_escapes_untrusted_names() -> None:
    page = render_html(typed(make_plan()))
    assert page.count("<script") == 2 and page.count("</script") == 2
    assert DATA_OPEN in page and "\n<script>(() => {" in page
    for raw in ("<script>alert", "<b>x", "<b>nhwc", "<i>x", "alert(2)</script"):
        assert raw not in page, raw
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # costliest/issues are Python-made
    data = embedded_data(page)
    names = [row[data["fields"].index("name")] for row in data["rows"]]
    assert EVIL_NODE in names
    ins = data["rows"][names.index(EVIL_NODE)][data["fields"].index("inputs")]
    assert ins[0] == [EVIL_TENSOR, "[512,seq]", "bf16"]


def test_every_string_field_is_escaped() -> None:
    plan, bad = _hostile_everywhere()
    for report in (plan, {"schema_version": 2, "plans": [plan, make_plan("a100-sxm")]}):
        page = render_html(typed(report))
        assert page.count("<script") == 2
        for raw in bad:
            assert raw not in page, raw
        data = embedded_data(page)
        assert data["rows"][0][data["fields"].index("op")] == bad[4]  # raw in the data block
        assert html.escape(bad[1]) in page  # a summary's kernel class, escaped
        md = render_markdown(typed(report))
        markdown_it = pytest.importorskip("markdown_it")
        rendered = markdown_it.MarkdownIt("commonmark").enable("table").render(md)
        for raw in bad:
            assert raw not in rendered, raw


def test_html_is_self_contained_and_csp_pins_the_script() -> None:
    page = render_html(typed(make_plan()))
    assert re.findall(r"https?://[^\s\"']+", page) == ["http://www.w3.org/2000/svg"]
    assert not re.search(r"\b(src|href)=", page) and "@import" not in page
    script = page[page.index("\n<script>") + 9:page.rindex("</script>")]
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in page and "default-src 'none'" in page


def test_html_is_deterministic() -> None:
    plan = make_optimized()
    page = render_html(typed(plan))
    assert render_html(typed(copy.deepcopy(plan))) == page
    assert render_markdown(typed(copy.deepcopy(plan))) == render_markdown(typed(plan))


def test_html_deployment_panels() -> None:
    page = render_html(typed(make_optimized()))
    for text in ('<table class="mem-table">', "1,478,840</td>", "&lt;0.01%", "91.96%",
                 "1,169,904", "FP8 (E4M3)", '<tr class="pick"><td class="mono">fp8_e4m3</td>',
                 '<td class="mono">matmul_allow_tf32</td><td class="mono">True</td>',
                 "rule 1: TF32 &lt;ok&gt; &amp; precision &#x27;bf16&#x27; tolerates it",
                 "flash, efficient, math", '<table class="numerics">', ">0.99999951</td>",
                 ">0.163</td>", "reverted: output &lt;0&gt; cosine 0.98",
                 "fp32 islands <b>2</b>", "padded nodes <b>3</b>", "conversions <b>2</b>",
                 "max abs ≤ 4% of the output&#x27;s scale, cosine ≥ 0.999",
                 "activations &lt;assumed&gt; linear in the batch"):
        assert text in page, text
    assert page.count('class="panel') == 8 and "<details" not in page
    data = embedded_data(page)
    names = [row[0] for row in data["rows"]]
    per = data["rows"][names.index("lm_head")][data["fields"].index("per")][0]
    assert per[data["tfields"].index("dhead")] == "bf16 · tma_wgmma"
    decisions = per[data["tfields"].index("decisions")]
    assert [d[0] for d in decisions] == ["precision", "exec_path"]
    assert [d[5] for d in decisions] == [1, 1]
    assert ["launch", "grid 132×1×1 · block 256×1×1 · 128 KiB shared memory · vector width 8"] \
        in decisions[1][3]


def test_html_roofline_frame() -> None:
    page = render_html(typed(make_plan()))
    assert page.count('class="roofline"') == 1
    # fp64=fp32, fp16=bf16 share a roof: 4 distinct peaks, one bandwidth slope
    assert page.count("roof-peak") == 4 and page.count("roof-bw") == 1
    assert "fp32/fp64" in page and "bf16/fp16" in page
    assert "7 of 8 nodes plotted" in page  # the view node has no FLOPs


def test_html_multi_target() -> None:
    page = render_html(typed(make_multi()))
    assert "Targets compared" in page and page.count('class="roofline"') == 2
    head = page[page.index('<table class="cmp">'):page.index("</thead>", page.index("cmp"))]
    assert head.index("NVIDIA H100 SXM") < head.index("NVIDIA A100 SXM")
    data = embedded_data(page)
    assert [t["name"] for t in data["targets"]] == ["h100-sxm", "a100-sxm"]
    per = data["fields"].index("per")
    est = data["tfields"].index("est_time_s")
    q = data["rows"][0][per]
    assert len(q) == 2 and q[1][est] > q[0][est]  # the A100 is slower on the same GEMM


def test_html_survives_nan_and_empty() -> None:
    plan = make_plan()
    plan["nodes"][0]["est_time_s"] = math.nan
    data = embedded_data(render_html(typed(plan)))
    assert data["rows"][0][data["fields"].index("per")][0][0] is None
    bare = dataclasses.replace(typed(make_plan()), nodes=())  # e.g. a graph of constants
    page = render_html(bare)
    assert embedded_data(page)["rows"] == [] and "0 of 0 nodes plotted" in page
    nothing = PlanSet(())
    assert embedded_data(render_html(nothing))["rows"] == []
    assert "# graphopt plan" in render_markdown(nothing)


def test_shape_range_panel_and_its_checks() -> None:
    plan = make_optimized()
    plan["shape_range"] = {"dims": [{"name": "seq", "min": 4, "opt": 16, "max": None,
                                     "source": "dynamic_shapes"}],
                           "inputs": {"input_ids": [1, "seq"]},
                           "est_latency_s": {"min": 1e-5, "opt": 2e-5, "max": 2e-5},
                           "hints": ["seq a multiple of 8 <keeps> tensor cores full"]}
    checks = [{"point": p, "dims": {"seq": n}, "scaled_down": p == "max",
               "input_shapes": f"(1, {n})", "within": p == "min",
               "numerics": plan["optimization"]["numerics"]} for p, n in (("min", 4), ("max", 64))]
    plan["optimization"]["range_checks"] = checks
    page = render_html(typed(plan))
    for text in ('<td class="mono">seq</td><td class="num">4</td><td class="num">16</td>'
                 '<td class="num">inf</td><td class="num">dynamic_shapes</td>',
                 "<li>seq a multiple of 8 &lt;keeps&gt; tensor cores full</li>",
                 "<li>checked min at seq=4, inputs (1, 4): within tolerance</li>",
                 "<li>checked max at seq=64, inputs (1, 64) (scaled down from the range&#x27;s "
                 "max: a check holds at most"):
        assert text in page, text
    assert "OUT OF tolerance" in page and "Shape range" not in render_html(typed(make_plan()))


def test_prediction_panel_lists_the_nodes_furthest_off() -> None:
    plan = make_plan()
    for i, n in enumerate(plan["nodes"]):
        n["measured_s"] = n["est_time_s"] * (1 + i) if n["est_time_s"] else 1e-6
    plan["summary"]["prediction"] = {
        "spearman": 0.9, "median_ratio": 0.5, "model_ratio": 0.4, "nodes_measured": 8,
        "measured_model_s": 1e-3, "measured_nodes_s": 9e-4, "runs": 10, "warmup": 3,
        "threads": None, "method": "torch.profiler <median> of 10 runs"}
    page, md = render_html(typed(plan)), render_markdown(typed(plan))
    assert "Predicted vs measured" in page and "Predicted vs measured" in md
    assert "torch.profiler &lt;median&gt; of 10 runs" in page
    assert page.count("<circle") == 7  # the view node has no estimate to plot
    worst = page[page.index("<h4>Furthest off</h4>"):]
    assert worst.index(">lm_head<") < worst.index(">layers.0.softmax<")  # 8x off, then 6x
    assert "| `lm_head` | `gemm` |" in md and "| 0.125× |" in md
    assert "Predicted vs measured" not in render_html(typed(make_plan()))
