"""Issue 35, item 5: the HTML report's layout, measured in headless Chromium at 1280 and 1920 px.

The report spilled: the quantization formats table ran out of its panel (and the page scrolled
sideways), the costliest-kernels table with ONNX names did too, the target card showed
"NVIDIA H100 S…" and the strategy table's notes were cut at the panel's edge. ``--dump-dom``
cannot report layout, so each test renders a page, adds a measuring script to a copy of it (the
test's own: the report never ships it; its hash joins the page's Content-Security-Policy) and
reads the script's findings back from the dumped DOM:

- spill: a card or panel whose content is wider than it, or any element past its right edge;
- scroll: a box that scrolls sideways. Only the node table's frame may (a wide sortable grid
  with a sticky header); a panel's table must fit at these widths, not hide a column;
- cut: text cut by an ellipsis. Only the node table's cells may be, each with its whole text in
  a title (the opened row shows everything);
- the page itself never scrolls sideways.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import graphopt
from graphopt.report.html import render_html
from tests import test_report_browser
from tests.report_plans import typed
from tests.test_report_browser import FLAGS
from tests.test_report_partition import with_partition
from tests.test_report_render import _hostile_everywhere, make_multi, make_optimized, make_plan

pytestmark = pytest.mark.browser

WIDTHS = (1280, 1920)
chromium = test_report_browser.chromium  # the fixture: skips without Chromium, fails under CI

# Runs after the page's own script (on load); writes its findings into <pre id="layout-result">.
MEASURE = r"""window.addEventListener("load", () => {
  const out = {spill: [], scroll: [], cut: []};
  for (const d of document.querySelectorAll("details")) d.open = true;  // folded panels too
  const name = (e) => e.tagName.toLowerCase() + (e.id ? "#" + e.id : "")
    + (typeof e.className === "string" && e.className.trim()
       ? "." + e.className.trim().split(/\s+/).join(".") : "");
  const where = (e) => {
    const box = e.closest(".card,.panel,.tablewrap,section");
    return (box && box !== e ? name(box) + " > " : "") + name(e) + " "
      + JSON.stringify(e.textContent.slice(0, 50));
  };
  const clips = (e) => getComputedStyle(e).overflowX !== "visible";
  for (const box of document.querySelectorAll(".card,.panel")) {
    if (clips(box)) continue;  // it scrolls: counted below
    if (box.scrollWidth > box.clientWidth + 1) out.spill.push(where(box));
    const r = box.getBoundingClientRect();
    const right = r.right - parseFloat(getComputedStyle(box).borderRightWidth);
    let last = null;  // the outermost element past the edge stands for what is inside it
    for (const el of box.querySelectorAll("*")) {
      if (last && last.contains(el)) continue;
      let inner = false;
      for (let p = el.parentElement; p && p !== box; p = p.parentElement) inner ||= clips(p);
      const er = el.getBoundingClientRect();
      if (!inner && er.width > 0 && er.right > right + 1) out.spill.push(where(last = el));
    }
  }
  for (const el of document.querySelectorAll("body *")) {
    const cs = getComputedStyle(el);
    if (el.scrollWidth <= el.clientWidth + 1 || el.clientWidth === 0) continue;
    if (cs.textOverflow === "ellipsis") {
      out.cut.push({at: where(el), nodes: el.closest("#nodes") !== null,
                    titled: el.title !== ""});
    } else if (clips(el)) {
      out.scroll.push(where(el));
    }
  }
  out.page = [document.documentElement.scrollWidth, window.innerWidth];
  const pre = document.createElement("pre");
  pre.id = "layout-result";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});"""


def measure(chromium: str, tmp: Path, page: str, width: int) -> dict[str, Any]:
    """The findings of ``MEASURE`` on ``page`` in a window ``width`` px wide."""
    digest = base64.b64encode(hashlib.sha256(MEASURE.encode()).digest()).decode()
    assert page.count("script-src 'sha256-") == 1 and page.count("</body>") == 1
    page = page.replace("script-src 'sha256-", f"script-src 'sha256-{digest}' 'sha256-")
    path = tmp / f"measure-{width}.html"
    path.write_text(page.replace("</body>", f"<script>{MEASURE}</script></body>"),
                    encoding="utf-8")
    proc = subprocess.run([chromium, *FLAGS, f"--user-data-dir={tmp / 'profile'}",
                           f"--window-size={width},1000", "--dump-dom", path.as_uri()],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = re.search(r'<pre id="layout-result">(.*?)</pre>', proc.stdout, re.S)
    assert found, "the measuring script did not run: " + proc.stderr[-2000:]
    return json.loads(html.unescape(found.group(1)))


def faults(result: dict[str, Any]) -> dict[str, Any]:
    """What the page must not have; empty when its layout holds."""
    bad = {"spill": result["spill"],
           "scroll": [s for s in result["scroll"] if not s.startswith("div.tablewrap ")],
           "cut": [c for c in result["cut"] if not (c["nodes"] and c["titled"])]}
    scroll_w, inner_w = result["page"]
    if scroll_w > inner_w:
        bad["page"] = f"the page scrolls sideways: {scroll_w} px wide in a {inner_w} px window"
    return {k: v for k, v in bad.items() if v}


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(256, 768)
        self.out = nn.Linear(256, 256)
        self.up = nn.Linear(256, 1024)
        self.down = nn.Linear(1024, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, -1)
        x = x + self.out(nn.functional.scaled_dot_product_attention(q, k, v))
        return x + self.down(nn.functional.gelu(self.up(x)))


def _planned() -> dict[str, Any]:
    """A real plan: the planner's own target name, formats table with its notes, costliest
    kernels, runtime settings, partition and the strategy table (auto over three devices)."""
    model = nn.Sequential(_Block(), _Block()).eval()
    plan = graphopt.plan(model, (torch.randn(4, 128, 256),), target="h100",
                         devices="cuda:0=h100,cuda:1=a100:40GB,cpu:8GB", strategy="auto")
    assert plan.strategy is not None and plan.quantization is not None
    return plan.to_dict()


def _onnx_names() -> dict[str, Any]:
    """An optimized plan named like an ONNX export: long paths, fused kernels joined by +."""
    plan = make_optimized()
    names = {n["name"]: f"/model/encoder/layers.{i}/self_attention/{n['name']}/MatMul_{i}"
             for i, n in enumerate(plan["nodes"])}
    for n in plan["nodes"]:
        n["name"] = names[n["name"]]
    s = plan["summary"]
    for c in s["costliest_nodes"]:
        c["name"] = names[c["name"]]
    group = [n["name"] for n in plan["nodes"][:3]]
    s["costliest_kernels"] = [{"kernel": "k0", "name": "+".join(group), "nodes": group,
                               "kind": "epilogue", "fused": True, "kernel_class": "gemm",
                               "est_time_s": 2e-5, "unfused_s": 3e-5, "share": 0.5}]
    return plan


PAGES = {
    "plan": lambda: make_plan(extra_nodes=30),
    "optimized": make_optimized,
    "multi": make_multi,
    "partition": lambda: with_partition(make_plan()),
    "pipeline": lambda: with_partition(make_plan(), "pipeline"),
    "hostile": lambda: _hostile_everywhere()[0],
    "onnx-names": _onnx_names,
    "planned": _planned,
}


@pytest.mark.parametrize("which", list(PAGES))
def test_nothing_spills_scrolls_or_is_cut(chromium: str, tmp_path: Path, which: str) -> None:
    page = render_html(typed(PAGES[which]()))
    for width in WIDTHS:
        bad = faults(measure(chromium, tmp_path, page, width))
        assert not bad, f"at {width} px: {json.dumps(bad, indent=1)}"


def test_the_target_card_shows_the_whole_name(chromium: str, tmp_path: Path) -> None:
    """The finding as the issue put it: "NVIDIA H100 SXM5 80GB" cut to "NVIDIA H100 S…"."""
    plan = make_plan()
    plan["target"] = {**plan["target"], "display_name": "NVIDIA H100 SXM5 80GB"}
    page = render_html(typed(plan))
    assert '<div class="v sm" title="NVIDIA H100 SXM5 80GB">NVIDIA H100 SXM5 80GB</div>' in page
    for width in WIDTHS:
        result = measure(chromium, tmp_path, page, width)
        assert [c for c in result["cut"] if "card" in c["at"]] == [], width


def test_the_probe_sees_a_spill_a_scroll_and_a_cut(chromium: str, tmp_path: Path) -> None:
    """The measuring script itself: a page with each fault must show each one."""
    page = render_html(typed(make_plan())).replace(
        "<main>", '<main><div class="cards"><div class="card"><div class="v" style="white-space:'
        'nowrap;overflow:hidden;text-overflow:ellipsis">' + "W" * 80 + '</div></div></div>'
        '<div class="panel"><div class="scroll"><table><tr><td>' + "x" * 400 + "</td></tr>"
        '</table></div><table><tr><td><div style="width:3000px">wide</div></td></tr></table>'
        '</div>', 1)
    found = faults(measure(chromium, tmp_path, page, 1280))
    assert set(found) == {"spill", "scroll", "cut", "page"}, found
