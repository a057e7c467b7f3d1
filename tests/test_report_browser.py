"""The HTML report in a real browser: headless Chromium runs the page's script, we read the DOM.

``--dump-dom`` prints the DOM after the script ran; the URL hash carries the view state (sort,
filter, kernel class, open rows), which is exactly what a shared link reproduces. Without
Chromium the tests skip locally but fail under CI (``CI`` set), so CI cannot pass without them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from graphopt.report.format import decision_fields, decision_head, decision_summary, fmt_dims
from graphopt.report.html import render_html
from tests.report_plans import typed
from tests.test_report_data import repeated_blocks
from tests.test_report_partition import ROWS, with_partition
from tests.test_report_render import (
    EVIL_NODE,
    EVIL_TENSOR,
    _hostile_everywhere,
    make_multi,
    make_optimized,
    make_plan,
)

pytestmark = pytest.mark.browser

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000")


@pytest.fixture(scope="module")
def chromium() -> str:
    found = [os.environ.get("GRAPHOPT_CHROMIUM"), shutil.which("chromium"),
             shutil.which("chromium-browser"), "/usr/bin/chromium"]
    path = next((p for p in found if p and os.access(p, os.X_OK)), None)
    if path is None:
        msg = "chromium not found (apt-get install chromium)"
        if os.environ.get("CI"):
            pytest.fail(f"{msg}: CI must run the browser tests")
        pytest.skip(msg)
    return path


_VOID = frozenset("area base br col embed hr img input link meta source track wbr".split())


class El:
    """A parsed element: enough of a DOM to query a dumped page."""

    def __init__(self, tag: str, attrs: dict[str, str | None]) -> None:
        self.tag, self.attrs = tag, attrs
        self.children: list[El | str] = []

    @property
    def cls(self) -> list[str]:
        return (self.attrs.get("class") or "").split()

    @property
    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text for c in self.children)

    def all(self, tag: str, cls: str | None = None) -> list[El]:
        out = []
        for c in self.children:
            if isinstance(c, El):
                if c.tag == tag and (cls is None or cls in c.cls):
                    out.append(c)
                out += c.all(tag, cls)
        return out


def _walk(el: El) -> list[El]:
    out = []
    for c in el.children:
        if isinstance(c, El):
            out += [c, *_walk(c)]
    return out


class Dom(HTMLParser):
    """A dumped DOM as an element tree, plus the queries the tests make."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.root = El("#root", {})
        self._stack = [self.root]
        self.feed(text)
        self.close()
        body = self.root.all("body")[0]
        self.ready = body.attrs.get("data-ready") == "1"
        self.rows = [{"idx": int(tr.attrs["data-idx"] or -1),
                      "name": tr.all("td")[1].attrs.get("title"),  # the cell also holds tags
                      "cells": [td.text for td in tr.all("td")]}
                     for tr in self.root.all("tr", "row")]
        self.details = [tr.text for tr in self.root.all("tr", "detail")]
        self.points = {svg.attrs.get("data-t") or "": len(svg.all("circle", "pt"))
                       for svg in self.root.all("svg", "roofline")}
        self.scripts = [e.attrs for e in self.root.all("script")]
        self.bold = [e.text for e in self.root.all("b")]
        self.ids = {e.attrs["id"] or "": e.text for e in _walk(self.root) if e.attrs.get("id")}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        el = El(tag, dict(attrs))
        self._stack[-1].children.append(el)
        if tag not in _VOID:
            self._stack.append(el)

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self._stack) - 1, 0, -1):
            if self._stack[i].tag == tag:
                del self._stack[i:]
                break

    def handle_data(self, data: str) -> None:
        self._stack[-1].children.append(data)


def _chrome(chromium: str, tmp: Path, page: Path, state: str, *args: str) -> tuple[str, str]:
    url = page.as_uri() + ("#" + state if state else "")
    proc = subprocess.run([chromium, *FLAGS, f"--user-data-dir={tmp / 'profile'}", *args, url],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    page_console = [line for line in proc.stderr.splitlines()
                    if ":CONSOLE" in line and "source: file://" in line]
    assert page_console == [], page_console  # no script error, no CSP violation
    return proc.stdout, proc.stderr


def _load(chromium: str, tmp: Path, report: dict[str, Any], state: str = "") -> Dom:
    page = tmp / "report.html"
    page.write_text(render_html(typed(report)), encoding="utf-8")
    dom = Dom(_chrome(chromium, tmp, page, state, "--dump-dom")[0])
    assert dom.ready, "the page script did not finish"
    return dom


def _names(dom: Dom) -> list[str]:
    return [r["name"] for r in dom.rows]


def test_rows_points_and_safe_names(chromium: str, tmp_path: Path) -> None:
    plan = make_plan()
    dom = _load(chromium, tmp_path, plan)
    assert len(dom.rows) == len(plan["nodes"])
    assert dom.ids["count"] == "Showing 8 of 8 matching nodes (8 total)"
    plottable = [n for n in plan["nodes"] if n["flops"] > 0 and n["est_time_s"] > 0]
    assert dom.points == {"0": len(plottable)}
    # the hostile name is text in its cell (its flag tag follows it), not markup
    assert EVIL_NODE in _names(dom)
    assert EVIL_NODE + "dynamic_shape" in [r["cells"][1] for r in dom.rows]
    assert [s.get("type") for s in dom.scripts] == ["application/json", None]
    assert "x" not in dom.bold


def test_sort_by_time_descending_and_ascending(chromium: str, tmp_path: Path) -> None:
    plan = make_plan(extra_nodes=5)
    by_time = sorted(plan["nodes"], key=lambda n: -n["est_time_s"])
    dom = _load(chromium, tmp_path, plan, "sort=est_time_s&desc=1")
    assert _names(dom)[0] == by_time[0]["name"] == plan["summary"]["costliest_nodes"][0]["name"]
    dom = _load(chromium, tmp_path, plan, "sort=est_time_s&desc=0")
    assert _names(dom)[-1] == by_time[0]["name"]
    dom = _load(chromium, tmp_path, plan, "sort=name&desc=0")
    assert _names(dom)[:2] == sorted(n["name"] for n in plan["nodes"])[:2]


def test_filters_by_class_text_and_bottleneck(chromium: str, tmp_path: Path) -> None:
    plan = make_plan(extra_nodes=5)
    dom = _load(chromium, tmp_path, plan, "class=gemm")
    assert sorted(_names(dom)) == ["layers.0.attn.q_proj", "lm_head"]
    assert {r["cells"][3] for r in dom.rows} == {"gemm"}
    dom = _load(chromium, tmp_path, plan, "filter=" + quote("ATTN."))
    assert sorted(_names(dom)) == ["layers.0.attn.q_proj", "layers.0.attn.sdpa"]
    dom = _load(chromium, tmp_path, plan, "bottleneck=compute")
    assert len(dom.rows) == sum(n["bottleneck"] == "compute" for n in plan["nodes"])


def test_open_row_shows_decisions_and_tensor_names(chromium: str, tmp_path: Path) -> None:
    plan = make_plan()
    idx = [n["name"] for n in plan["nodes"]].index(EVIL_NODE)
    dom = _load(chromium, tmp_path, plan, f"open={idx}")
    assert len(dom.details) == 1
    text = dom.details[0]
    assert EVIL_TENSOR in text and "layout: channels_last" in text
    assert "</script><script>alert(2)</script> reason" in text
    assert "x" not in dom.bold and len(dom.scripts) == 2


def test_markup_in_every_field_stays_text(chromium: str, tmp_path: Path) -> None:
    plan, bad = _hostile_everywhere()
    dom = _load(chromium, tmp_path, plan, "open=0")
    assert len(dom.scripts) == 2 and len(dom.details) == 1
    for tag in ("img", "marquee", "u", "em", "s", "q"):
        assert dom.root.all(tag) == [], tag
    assert all(e.cls == ["sw"] for e in dom.root.all("i"))  # only the colour swatches
    assert all("roofline" in svg.cls for svg in dom.root.all("svg"))
    text = dom.root.all("body")[0].text
    for raw in bad:
        assert raw in text, raw


def _table_rows(dom: Dom, cls: str) -> list[list[str]]:
    table = dom.root.all("table", cls)[0]
    return [[td.text for td in tr.all("td")] for tr in table.all("tbody")[0].all("tr")]


def test_deployment_panels_and_decisions(chromium: str, tmp_path: Path) -> None:
    plan = make_optimized()
    names = [n["name"] for n in plan["nodes"]]
    dom = _load(chromium, tmp_path, plan, f"open={names.index('lm_head')}")
    assert _table_rows(dom, "mem-table") == [
        ["parameters", "1.41 MiB", "1,478,840", "<0.01%"],
        ["activations (peak)", "132 KiB", "135,040", "<0.01%"],
        ["workspace", "32 MiB", "33,554,432", "0.04%"],
        ["reserve", "6.4 GiB", "6,871,947,673", "8.00%"],
        ["free", "73.6 GiB", "78,992,229,935", "91.96%"]]
    assert _table_rows(dom, "numerics") == [["0", "0.00399", "0.163", "0.425", "0.99999951", "✓"]]
    assert ["matmul_allow_tf32", "True", "rule 1: TF32 <ok> & precision 'bf16' tolerates it"] \
        in _table_rows(dom, "rt")
    assert [r[0] for r in _table_rows(dom, "alts")] == ["fp32", "fp8_e4m3", "nvfp4"]
    # the decisions column: precision and exec path in one chip, then the other decisions
    cells = {r["name"]: r["cells"][-1] for r in dom.rows}
    assert cells["lm_head"] == "bf16 · tma_wgmma"
    assert cells["layers.0.attn.q_proj"] == "bf16 · tma_wgmmapadding: not applied"
    assert len(dom.details) == 1
    for text in ("precision: bf16", "tensor cores run bf16 at 15x fp32 <fast>",
                 "exec_path: tma_wgmma", "TMA loads + wgmma <tile 64x128x64>",
                 "grid 132×1×1 · block 256×1×1 · 128 KiB shared memory · vector width 8",
                 "64×128×64 (m×n×k) · stages 4 · 90.0% of tile slots useful"):
        assert text in dom.details[0], text


def test_multi_target_deployment_columns(chromium: str, tmp_path: Path) -> None:
    report = make_multi()
    report["plans"][1]["quantization"].update(format="int8", display="INT8")
    dom = _load(chromium, tmp_path, report)
    rows = {r[0]: r[1:] for r in _table_rows(dom, "dep")}
    assert rows["recommended"] == ["FP8 (E4M3)", "INT8"]
    assert rows["max batch size"] == ["1,169,904", "1,169,904"]
    assert rows["sdpa_backends"] == ["flash, efficient, math"] * 2
    assert len(dom.root.all("details", "more")) == len(dom.root.all("table", "mem-table")) == 2


def test_partition_timeline_and_device_chip(chromium: str, tmp_path: Path) -> None:
    dom = _load(chromium, tmp_path, with_partition(make_plan()))
    [svg] = dom.root.all("svg", "gantt")
    assert [t.text for t in svg.all("text", "dev")] == ["cuda:0cuda:0 · h100-sxm",
                                                         "cuda:1cuda:1 · a100-sxm"]
    assert len(svg.all("rect", "link")) == 2 and len(svg.all("rect", "gx")) == 2
    bars = svg.all("rect", "gb")
    # lane by lane (cuda:0, cuda:1), each in start order
    assert [b.attrs["data-node"] for b in bars] == [r[0] for r in sorted(ROWS, key=lambda r: r[1:])]
    assert EVIL_NODE in [b.text.split("\n")[0] for b in bars]  # the tooltip, as text
    assert len(dom.scripts) == 2 and dom.root.all("table", "part-dev")
    # the decisions column: precision · exec path · device in one chip
    cells = {r["name"]: r["cells"][-1] for r in dom.rows}
    assert cells["lm_head"] == "bf16 · tma_wgmma · cuda:0"
    assert cells[EVIL_NODE] == "cuda:1layout: channels_last"


def test_decoded_rows_show_the_plan_decisions(chromium: str, tmp_path: Path) -> None:
    """The page expands the interned tables: open rows must say what the JSON says."""
    plan = repeated_blocks(30)  # 120 real nodes whose reasons repeat on every block
    picks = [0, 3, 61, 118, 119]
    dom = _load(chromium, tmp_path, plan, "sort=idx&desc=0&open=" + ",".join(map(str, picks)))
    assert [r["name"] for r in dom.rows] == [n["name"] for n in plan["nodes"]]
    assert len(dom.details) == len(picks)
    nodes = typed(plan).nodes
    for i, text in zip(picks, dom.details, strict=True):
        n = nodes[i]
        assert dom.rows[i]["cells"][-1] == decision_head(n.decisions)
        assert dom.rows[i]["cells"][4] == fmt_dims(n.analysis.dims)
        for kind, d in n.decisions.items():
            assert f"{kind}: {decision_summary(d)}" in text and d.reason in text, (i, kind)
            for _, field in decision_fields(d):
                assert field in text, (i, field)
        for t in n.inputs + n.outputs:
            assert t is not None and t.name in text


def test_paging_of_large_tables(chromium: str, tmp_path: Path) -> None:
    plan = make_plan(extra_nodes=492)  # 500 nodes
    dom = _load(chromium, tmp_path, plan)
    assert len(dom.rows) == 200 and dom.ids["more"] == "Show 200 more"
    dom = _load(chromium, tmp_path, plan, "n=450")
    assert len(dom.rows) == 450 and dom.ids["more"] == "Show 50 more"


def test_multi_target_column_groups(chromium: str, tmp_path: Path) -> None:
    report = make_multi()
    dom = _load(chromium, tmp_path, report, "sort=est_time_s.1&desc=1")
    assert dom.points == {"0": 7, "1": 7}
    assert len(dom.rows) == 8 and _names(dom)[0] == "lm_head"
    cells = dom.rows[0]["cells"]
    assert len(cells) == 8 + 2 * 3  # common columns, then est/bottleneck/decisions per target
    assert cells[8].endswith("µs") and cells[11].endswith("µs") and cells[9] == "compute"


def test_screenshot_is_a_real_page(chromium: str, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    page.write_text(render_html(typed(make_plan(extra_nodes=30))), encoding="utf-8")
    shot = tmp_path / "report.png"
    _chrome(chromium, tmp_path, page, "", "--window-size=1400,1000", f"--screenshot={shot}")
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1400, 1000)
    assert len(data) > 60_000  # a blank or unstyled page compresses to a few KB


def test_fusion_group_column(chromium: str, tmp_path: Path) -> None:
    """A plan with fusion groups shows each node's group beside its decisions; a node alone in
    its group shows a dash, and a report without groups has no such column (above)."""
    import torch

    import graphopt
    from tests.test_fusion import LinearGelu

    plan = graphopt.plan(LinearGelu().eval(), (torch.randn(64, 288),), target="h100")
    dom = _load(chromium, tmp_path, plan.to_dict())
    groups = {r["name"]: r["cells"][-2] for r in dom.rows}
    assert groups == {"linear": "k0 epilogue ×2", "gelu": "k0 epilogue ×2"}
    heads = [th.text for th in dom.root.all("th")]
    assert "Fusion group" in heads
    no_groups = _load(chromium, tmp_path, make_plan())
    assert "Fusion group" not in [th.text for th in no_groups.root.all("th")]
