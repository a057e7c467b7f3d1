"""Markdown and HTML rendering of plan reports built by hand (no model, no browser).

The reports hold hostile names on purpose: a node named ``<script>alert(1)</script>`` and a tensor
named ``</script><b>x``; both renderers must keep them inert.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import math
import re
from typing import Any

import pytest

from graphopt.report.html import render_html
from graphopt.report.markdown import decision_summary, fmt_seconds, render_markdown

EVIL_NODE = "<script>alert(1)</script>"
EVIL_TENSOR = "</script><b>x"
DATA_OPEN = '<script type="application/json" id="graphopt-data">'

TARGETS: dict[str, dict[str, Any]] = {
    "h100-sxm": {"name": "h100-sxm", "display_name": "NVIDIA H100 SXM", "kind": "gpu",
                 "generation": "hopper", "compute_capability": "9.0",
                 "peak_flops": {"fp64": 67e12, "fp32": 67e12, "tf32": 494.7e12,
                                "bf16": 989.4e12, "fp16": 989.4e12, "fp8": 1978.9e12},
                 "bandwidth_bytes_per_s": 3.35e12, "memory_bytes": 80 * 2**30},
    "a100-sxm": {"name": "a100-sxm", "display_name": "NVIDIA A100 SXM", "kind": "gpu",
                 "generation": "ampere", "compute_capability": "8.0",
                 "peak_flops": {"fp64": 19.5e12, "fp32": 19.5e12, "tf32": 156e12,
                                "bf16": 312e12, "fp16": 312e12},
                 "bandwidth_bytes_per_s": 2.039e12, "memory_bytes": 80 * 2**30},
}
LAUNCH_S = 2e-6


def _t(name: str, shape: list[Any] | None, dtype: str = "bf16") -> dict[str, Any]:
    return {"name": name, "shape": shape, "dtype": dtype}


def _node(name: str, op: str, kc: str, flops: int, nbytes: int, target: dict[str, Any],
          **extra: Any) -> dict[str, Any]:
    """One node costed like graphopt's roofline: max(compute, memory) plus a launch."""
    peak = target["peak_flops"]["bf16"]
    ct, mt = flops / peak, nbytes / target["bandwidth_bytes_per_s"]
    bottleneck = "latency" if max(ct, mt) < LAUNCH_S else ("compute" if ct >= mt else "memory")
    node = {"name": name, "op": op, "op_type": op, "kernel_class": kc,
            "dims": {"numel": nbytes // 4}, "dtype": "bf16", "flops": flops, "bytes": nbytes,
            "bytes_read": nbytes * 2 // 3, "bytes_written": nbytes - nbytes * 2 // 3,
            "arithmetic_intensity": round(flops / nbytes, 6) if nbytes else 0.0, "params": 0,
            "bottleneck": bottleneck, "est_time_s": max(ct, mt) + LAUNCH_S,
            "compute_time_s": ct, "memory_time_s": mt, "peak_flops_used": peak,
            "pattern": None, "flags": [], "inputs": [_t(f"{name}.in", [4, 128])],
            "outputs": [_t(f"{name}.out", [4, 128])], "decisions": {}}
    node.update(extra)
    return node


def make_plan(target: str = "h100-sxm", extra_nodes: int = 0) -> dict[str, Any]:
    """A small transformer-ish plan with one hostile node; ``extra_nodes`` pads it out."""
    tgt = TARGETS[target]
    prec = {"precision": {"format": "bf16", "applied": True,
                          "reason": "tensor cores run bf16 at 15x fp32 <fast>"}}
    nodes = [
        _node("layers.0.attn.q_proj", "linear", "gemm", 2 * 512 * 4096 * 4096,
              2 * (512 * 4096 * 2 + 4096 * 4096), tgt,
              dims={"M": 512, "N": 4096, "K": 4096, "batch": 1}, params=4096 * 4096,
              decisions={**prec, "padding": {"applied": False,
                                             "reason": "dims already multiples of 64"}}),
        _node("layers.0.attn.sdpa", "scaled_dot_product_attention", "attention",
              4 * 32 * 512 * 512 * 128, 4 * 32 * 512 * 128 * 2, tgt, pattern="attention:0"),
        _node(EVIL_NODE, "mul", "elementwise", 512 * 4096, 3 * 512 * 4096 * 2, tgt,
              inputs=[_t(EVIL_TENSOR, [512, "seq"]), _t("ok", None, "fp32")],
              flags=["dynamic_shape"],
              decisions={"layout": {"choice": "<b>nhwc</b>", "applied": True,
                                    "reason": "</script><script>alert(2)</script> reason"}}),
        _node("layers.0.norm", "rms_norm", "rmsnorm", 5 * 512 * 4096, 2 * 512 * 4096 * 2, tgt,
              pattern="rmsnorm:0"),
        _node("layers.0.view", "view", "view", 0, 0, tgt, bottleneck="latency",
              est_time_s=0.0, compute_time_s=0.0, memory_time_s=0.0),
        _node("layers.0.softmax", "softmax", "softmax", 5 * 32 * 512 * 512,
              2 * 32 * 512 * 512 * 2, tgt),
        _node("weird", "WeirdOp", "other", 1000, 8000, tgt, flags=["unsupported_op"]),
        _node("lm_head", "linear", "gemm", 2 * 512 * 4096 * 32000,
              2 * (512 * 4096 + 4096 * 32000 + 512 * 32000), tgt,
              dims={"M": 512, "N": 32000, "K": 4096}, decisions=prec),
    ]
    nodes += [_node(f"pad.{i}", "add", "elementwise", 4096 * (i + 1), 3 * 4096 * (i + 1) * 2, tgt)
              for i in range(extra_nodes)]
    return {"schema_version": 1, "graphopt_version": "0.1.0",
            "model": {"name": "tiny-llama <test>", "source": "torch", "num_nodes": len(nodes),
                      "param_count": 4096 * 4096 + 4096 * 32000,
                      "inputs": [_t("input_ids", [1, 512], "int64")],
                      "outputs": [_t("logits", [1, 512, 32000])]},
            "target": tgt, "summary": summarize(nodes),
            "warnings": ["1 nodes have dynamic dimensions <i>x</i> & co",
                         "ops graphopt does not know are kept: WeirdOp x1"],
            "nodes": nodes}


def summarize(nodes: list[dict[str, Any]]) -> dict[str, Any]:
    total = sum(n["est_time_s"] for n in nodes)
    kernels = [n for n in nodes if n["kernel_class"] != "view"]
    mix = {b: sum(n["bottleneck"] == b for n in kernels) for b in ("compute", "memory", "latency")}
    tb = {b: sum(n["est_time_s"] for n in nodes if n["bottleneck"] == b) for b in mix}
    classes = sorted({n["kernel_class"] for n in nodes})
    costly = sorted(kernels, key=lambda n: (-n["est_time_s"], n["name"]))[:5]
    return {"est_latency_s": total, "total_flops": sum(n["flops"] for n in nodes),
            "total_bytes": sum(n["bytes"] for n in nodes), "bottleneck_mix": mix,
            "time_by_bottleneck_s": tb,
            "kernel_class_counts": {c: sum(n["kernel_class"] == c for n in nodes) for c in classes},
            "time_by_kernel_class_s": {c: sum(n["est_time_s"] for n in nodes
                                              if n["kernel_class"] == c) for c in classes},
            "patterns": {"attention": 1, "rmsnorm": 1},
            "costliest_nodes": [{"name": n["name"], "kernel_class": n["kernel_class"],
                                 "est_time_s": n["est_time_s"], "share": n["est_time_s"] / total}
                                for n in costly],
            "unsupported_ops": {"WeirdOp": 1}, "flagged_nodes": {"dynamic_shape": 1}}


def make_multi() -> dict[str, Any]:
    return {"schema_version": 1, "plans": [make_plan("h100-sxm"), make_plan("a100-sxm")]}


def embedded_data(page: str) -> dict[str, Any]:
    start = page.index(DATA_OPEN) + len(DATA_OPEN)
    return json.loads(page[start:page.index("</script>", start)])


def _reversed_dicts(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _reversed_dicts(v) for k, v in reversed(list(value.items()))}
    if isinstance(value, list):
        return [_reversed_dicts(v) for v in value]
    return value


# ------------------------------------------------------------------------------------ markdown

def test_markdown_summary_sections() -> None:
    plan = make_plan()
    md = render_markdown(plan)
    for text in ("# graphopt plan: `tiny-llama <test>`", "NVIDIA H100 SXM", "Estimated latency",
                 fmt_seconds(plan["summary"]["est_latency_s"]), "## Bottleneck mix",
                 "## Time by kernel class", "## Costliest nodes", "## Unsupported ops",
                 "`WeirdOp`", "## Warnings", "## Nodes", "precision: bf16",
                 "padding: not applied", "| `lm_head` |"):
        assert text in md, text
    # the costliest node leads the per-node table
    table = md[md.index("## Nodes"):]
    assert table.index("`lm_head`") < table.index("`layers.0.attn.q_proj`")


def test_markdown_keeps_hostile_text_inert() -> None:
    md = render_markdown(make_plan())
    # names only inside code spans; free text has its markup characters escaped
    assert md.count(EVIL_NODE) == md.count(f"`{EVIL_NODE}`") > 0
    assert "<i>" not in md and "\\<i\\>x\\</i\\> \\& co" in md
    assert "<b>nhwc" not in md and "\\<b\\>nhwc\\</b\\>" in md
    markdown_it = pytest.importorskip("markdown_it")
    rendered = markdown_it.MarkdownIt("commonmark").enable("table").render(md)
    assert "<script" not in rendered and "<b>" not in rendered and "<i>" not in rendered
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in rendered


def test_markdown_truncates_node_table() -> None:
    md = render_markdown(make_plan(extra_nodes=20), max_nodes=5)
    table = md[md.index("## Nodes (top 5 by est. time)"):]
    assert "23 more nodes not shown" in table
    assert sum(line.startswith("| `") for line in table.splitlines()) == 5


def test_markdown_multi_target_columns() -> None:
    md = render_markdown(make_multi())
    cmp_table = md[md.index("## Targets compared"):md.index("## NVIDIA H100 SXM")]
    assert cmp_table.splitlines()[2] == "|  | NVIDIA H100 SXM | NVIDIA A100 SXM |"
    assert "| **est. latency** |" in cmp_table and "1.00×" in cmp_table
    assert md.count("### Costliest nodes") == 2 and "## NVIDIA A100 SXM" in md


@pytest.mark.parametrize(("decision", "expected"), [
    ({"format": "bf16", "applied": True, "reason": "r"}, "bf16"),
    ({"applied": False, "reason": "r"}, "not applied"),
    ({"pad_to": 64, "applied": True, "reason": "r"}, "64"),
    ({"m": 1, "n": 2, "applied": False, "reason": "r"}, "m=1 (not applied)"),
])
def test_decision_summary(decision: dict[str, Any], expected: str) -> None:
    assert decision_summary(decision) == expected


# ---------------------------------------------------------------------------------------- html

def test_html_escapes_untrusted_names() -> None:
    page = render_html(make_plan())
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


def _hostile_everywhere() -> tuple[dict[str, Any], list[str]]:
    """A plan with markup in every string a model or a caller can put in it."""
    plan = make_plan()
    bad = ["<img src=x onerror=alert(3)>", "<svg onload=alert(4)>", "<u>pat</u>", "<i>flag</i>",
           "<marquee>op</marquee>", "<em>dtype</em>", "<s>kind</s>", "<q>src</q>"]
    plan["target"] = {**plan["target"], "display_name": bad[0], "generation": bad[0]}
    plan["model"] = {**plan["model"], "name": bad[0], "source": bad[7]}
    node = plan["nodes"][0]
    node.update(kernel_class=bad[1], pattern=bad[2], flags=[bad[3]], op=bad[4], op_type=bad[4],
                dtype=bad[5], dims={bad[6]: 1}, cost={bad[6]: bad[6]})
    node["decisions"] = {bad[6]: {bad[6]: bad[6], "applied": True, "reason": bad[6]}}
    s = plan["summary"]
    s["unsupported_ops"] = {bad[4]: 1}
    s["flagged_nodes"] = {bad[3]: 1}
    s["patterns"] = {bad[2]: 1}
    s["time_by_kernel_class_s"] = {**s["time_by_kernel_class_s"], bad[1]: 1e-6}
    s["costliest_nodes"][0]["kernel_class"] = bad[1]
    return plan, bad


def test_every_string_field_is_escaped() -> None:
    plan, bad = _hostile_everywhere()
    for report in (plan, {"schema_version": 1, "plans": [plan, make_plan("a100-sxm")]}):
        page = render_html(report)
        assert page.count("<script") == 2
        for raw in bad:
            assert raw not in page, raw
        data = embedded_data(page)
        assert data["rows"][0][data["fields"].index("kernel_class")] == bad[1]
        md = render_markdown(report)
        markdown_it = pytest.importorskip("markdown_it")
        rendered = markdown_it.MarkdownIt("commonmark").enable("table").render(md)
        for raw in bad:
            assert raw not in rendered, raw


def test_html_is_self_contained_and_csp_pins_the_script() -> None:
    page = render_html(make_plan())
    assert re.findall(r"https?://[^\s\"']+", page) == ["http://www.w3.org/2000/svg"]
    assert not re.search(r"\b(src|href)=", page) and "@import" not in page
    script = page[page.index("\n<script>") + 9:page.rindex("</script>")]
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in page and "default-src 'none'" in page


def test_html_is_deterministic() -> None:
    plan = make_plan()
    page = render_html(plan)
    assert render_html(copy.deepcopy(plan)) == page
    assert render_html(_reversed_dicts(plan)) == page
    assert render_markdown(_reversed_dicts(plan)) == render_markdown(plan)


def test_html_roofline_frame() -> None:
    page = render_html(make_plan())
    assert page.count('class="roofline"') == 1
    # fp64=fp32, fp16=bf16 share a roof: 4 distinct peaks, one bandwidth slope
    assert page.count("roof-peak") == 4 and page.count("roof-bw") == 1
    assert "fp32/fp64" in page and "bf16/fp16" in page
    assert "7 of 8 nodes plotted" in page  # the view node has no FLOPs


def test_html_multi_target() -> None:
    page = render_html(make_multi())
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
    plan["nodes"][1]["arithmetic_intensity"] = math.inf
    data = embedded_data(render_html(plan))
    assert data["rows"][0][data["fields"].index("per")][0][0] is None
    empty = render_html({"schema_version": 1, "model": {"name": "e"}, "target": {},
                         "summary": {}, "nodes": []})
    assert embedded_data(empty)["rows"] == []
    assert "# graphopt plan" in render_markdown({"schema_version": 1, "plans": []})
