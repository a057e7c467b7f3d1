"""The ``partition`` section (a model split across devices) in the markdown and HTML reports.

The report is made by hand: the 8 nodes of ``make_plan`` on two devices with one copy each way,
on whole microseconds so every printed value can be checked. The hostile node name
``<script>alert(1)</script>`` runs on cuda:1 and a hostile tensor crosses back. The section is
built from the plan's records (:mod:`graphopt.ir.plan_partition`) and written as their JSON, so
it reads back as a real one does.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from typing import Any

import pytest

from graphopt.ir.plan import Plan
from graphopt.ir.plan_partition import (
    DeviceRow,
    HeftNotes,
    PartitionPlan,
    PipelineNotes,
    ScheduleRow,
    Strategy,
    TransferRow,
)
from graphopt.report.html import render_html
from graphopt.report.markdown import render_markdown
from graphopt.report.partition_html import DETAIL_BARS, _ticks, gantt, partition_panel
from tests.report_plans import typed
from tests.test_report_render import (
    EVIL_NODE,
    EVIL_TENSOR,
    make_multi,
    make_plan,
)

US = 1e-6
MIB = 2**20
GIB = 2**30
# (node, device, start µs, finish µs): a chain; sdpa's output goes to cuda:1 and comes back
ROWS = [("layers.0.attn.q_proj", "cuda:0", 0, 40), ("layers.0.attn.sdpa", "cuda:0", 40, 60),
        (EVIL_NODE, "cuda:1", 65, 70), ("layers.0.norm", "cuda:1", 70, 80),
        ("layers.0.view", "cuda:0", 90, 90), ("layers.0.softmax", "cuda:0", 90, 100),
        ("weird", "cuda:0", 100, 101), ("lm_head", "cuda:0", 101, 200)]
COPIES = [("layers.0.attn.sdpa.out", "cuda:0", "cuda:1", 4 * MIB, 60, 65),
          (EVIL_TENSOR, "cuda:1", "cuda:0", 8 * MIB, 80, 90)]
DEVICES = (DeviceRow("cuda:0", "h100-sxm", 64 * GIB, 16 * GIB, 170 * US),
           DeviceRow("cuda:1", "a100-sxm", 32 * GIB, 4 * GIB, 15 * US))
_MEMORY = {"parameter_bytes": {"cuda:0": 16 * GIB, "cuda:1": 4 * GIB},
           "usable_bytes": {"cuda:0": 64 * GIB, "cuda:1": 32 * GIB}, "transfer_bytes": 12 * MIB}


def _notes(strategy: str) -> HeftNotes | PipelineNotes:
    """HEFT's notes (one start and a greedy baseline tried, cuda:1 alone does not fit), or a
    pipeline's with the third stage's time left out (its nodes' times are summed)."""
    if strategy == "pipeline":
        return PipelineNotes(stage_times_s=(60 * US, 15 * US), bottleneck_s=110 * US,
                             throughput_per_s=1 / (110 * US), makespan_is="one batch, no overlap",
                             stage_memory_model="parameters", **_MEMORY)
    return HeftNotes(chosen="heft", candidates_s={"heft": 200 * US, "greedy": 250 * US,
                                                  "single:cuda:1": None},
                     refined_moves=0, refinement="iterated local search",
                     greedy_makespan_s=250 * US, greedy_naive_total_s=300 * US,
                     greedy_fits_memory=True, best_single_device_s=300 * US,
                     link_model="one FIFO per ordered device pair", **_MEMORY)


def _partition(strategy: str) -> PartitionPlan:
    """ROWS and COPIES as the plan's ``partition`` record; a pipeline in three stages."""
    stages, stage_devices = (), ()
    if strategy == "pipeline":
        stages = (tuple(r[0] for r in ROWS[:2]), tuple(r[0] for r in ROWS[2:4]),
                  tuple(r[0] for r in ROWS[4:]))
        stage_devices = ("cuda:0", "cuda:1", "cuda:0")
    return PartitionPlan(
        strategy=Strategy(strategy), makespan_s=200 * US, devices=DEVICES,
        schedule=tuple(ScheduleRow(n, d, a * US, b * US) for n, d, a, b in ROWS),
        transfers=tuple(TransferRow(t, s, d, nb, a * US, b * US) for t, s, d, nb, a, b in COPIES),
        stages=stages, stage_devices=stage_devices, notes=_notes(strategy))


def with_partition(plan: dict[str, Any], strategy: str = "heft") -> dict[str, Any]:
    """``plan`` split as ROWS / COPIES say, with each node's device decision, as the CLI does."""
    plan = copy.deepcopy(plan)
    for node, dev, a, b in ROWS:
        n = next(n for n in plan["nodes"] if n["name"] == node)
        n["decisions"]["device"] = {"device": dev, "start_s": a * US, "finish_s": b * US,
                                    "applied": True, "reason": f"HEFT: earliest finish on {dev}"}
    plan["partition"] = _partition(strategy).to_json()
    return plan


def _section(md: str, title: str = "## Partition across devices") -> str:
    start = md.index(title)
    return md[start:md.index("\n## ", start + 1)]


def _svg(page: str) -> str:
    start = page.index('<svg class="gantt"')
    return page[start:page.index("</svg>", start)]


# ------------------------------------------------------------------------------------ markdown

def test_markdown_partition_section() -> None:
    md = render_markdown(typed(with_partition(make_plan())))
    sec = _section(md)
    for text in (
            "- **strategy:** heft — the heft schedule",
            "- **devices:** 2 — cuda:0 (h100-sxm), cuda:1 (a100-sxm)",
            "- **makespan:** 200 µs — 1.50× faster than the best single device (300 µs)",
            "- **transfers:** 2 copies — 12 MiB in 15 µs on links",
            "- **schedules tried:** heft 200 µs, greedy 250 µs, single:cuda:1 does not fit",
            "| `cuda:0` | `h100-sxm` | 16 GiB | 64 GiB | 25.0% | 170 µs | 85.0% | 6 |",
            "| `cuda:1` | `a100-sxm` | 4 GiB | 32 GiB | 12.5% | 15 µs | 7.5% | 2 |",
            "| `cuda:0` | `cuda:1` | 1 | 4 MiB | 5 µs | 2.5% |",
            "| `cuda:1` | `cuda:0` | 1 | 8 MiB | 10 µs | 5.0% |",
            "_Every copy, largest first:_"):
        assert text in sec, text
    top = sec[sec.index("| tensor |"):].splitlines()
    assert top[2] == f"| `{EVIL_TENSOR}` | `cuda:1` | `cuda:0` | 8 MiB | 80 µs | 10 µs |"
    assert top[3].startswith("| `layers.0.attn.sdpa.out` |")
    assert "Pipeline stages" not in sec
    # after the deployment sections, before the nodes; the decisions cell names the device
    heads = [md.index(f"## {h}\n") for h in ("Memory", "Runtime settings",
                                               "Partition across devices", "Nodes")]
    assert heads == sorted(heads)
    assert "| bf16 · tma_wgmma · cuda:0 |" in md  # lm_head
    assert "| bf16 · tma_wgmma · cuda:0; padding: not applied |" in md  # q_proj
    assert "| layout: channels_last; " not in md
    assert "| cuda:1; layout: channels_last |" in md  # EVIL_NODE: no precision, a device


def test_markdown_pipeline_stages() -> None:
    sec = _section(render_markdown(typed(with_partition(make_plan(), "pipeline"))))
    assert "- **strategy:** pipeline — 3 contiguous stages in execution order" in sec
    assert "- **makespan:** 200 µs — one batch, no overlap" in sec
    assert "- **slowest stage:** 110 µs — 9,090.9 batches/s when stages overlap" in sec
    rows = sec[sec.index("### Pipeline stages"):].splitlines()[4:7]
    assert rows == [
        "| 1 | `cuda:0` | 2 | `layers.0.attn.q_proj` | `layers.0.attn.sdpa` | 60 µs |",
        f"| 2 | `cuda:1` | 2 | `{EVIL_NODE}` | `layers.0.norm` | 15 µs |",
        "| 3 | `cuda:0` | 4 | `layers.0.view` | `lm_head` | 110 µs |"]  # summed: no note


def test_markdown_partition_stays_inert() -> None:
    plan = with_partition(make_plan())
    plan["partition"]["notes"]["link_model"] = "<img src=x onerror=alert(5)> | pipes"
    md = _section(render_markdown(typed(plan)))
    assert md.count(EVIL_NODE) == md.count(f"`{EVIL_NODE}`") == 0  # not a stage: not listed
    assert f"`{EVIL_TENSOR}`" in md and "\\<img src=x onerror=alert(5)\\> \\| pipes" in md
    markdown_it = pytest.importorskip("markdown_it")
    rendered = markdown_it.MarkdownIt("commonmark").enable("table").render(
        render_markdown(typed(with_partition(make_plan(), "pipeline"))))
    assert "<script" not in rendered and "<b>" not in rendered and "<img" not in rendered


def test_markdown_multi_target_keeps_partition_in_its_target() -> None:
    report = make_multi()
    report["plans"][0] = with_partition(report["plans"][0])
    md = render_markdown(typed(report))
    assert md.count("Partition across devices") == 1
    h100, a100 = md.index("## NVIDIA H100 SXM\n"), md.index("## NVIDIA A100 SXM\n")
    assert h100 < md.index("### Partition across devices") < a100


# ---------------------------------------------------------------------------------------- html

def test_html_gantt_lanes_and_bars() -> None:
    page = render_html(typed(with_partition(make_plan())))
    svg = _svg(page)
    assert svg.count('class="lane dev"') == 2 and svg.count('class="lane link"') == 2
    assert svg.count('<rect class="gb"') == len(ROWS) and svg.count('<rect class="gx"') == 2
    assert 'data-merged="0"' in svg and ' m"' not in svg
    # lm_head: 101..200 µs of 200 on the 868-wide plot after the 118-wide label column
    assert ('<rect class="gb" data-node="lm_head" x="556.34" y="8.0" width="429.66" height="22" '
            'fill="#2f64d0"><title>lm_head\ncuda:0 · gemm\n101 µs → 200 µs (99 µs)</title>'
            in svg)
    # the zero-length view still shows; copies have their own lanes below the devices
    assert 'data-node="layers.0.view" x="508.60" y="8.0" width="0.80"' in svg
    assert ('<title>layers.0.attn.sdpa.out: cuda:0 → cuda:1, 4 MiB\n60 µs → 65 µs (5 µs)'
            '</title>' in svg)
    labels = re.findall(r'text-anchor="middle">([^<]+)</text>', svg)
    assert labels == ["0", "50 µs", "100 µs", "150 µs", "200 µs"]
    for text in ('<table class="part-dev">', "25.0%", "85.0%", "7.5%", '<table class="part-xfer">',
                 "Split across devices", "2 · heft", "makespan 200 µs · 2 copies"):
        assert text in page, text
    assert "Pipeline stages" not in page


def test_html_partition_escapes_names() -> None:
    plan = with_partition(make_plan())
    plan["partition"]["devices"][1]["target"] = "<b>gpu</b>"
    page = render_html(typed(plan))
    assert page.count("<script") == 2 and page.count("</script") == 2
    for raw in ("<script>alert", "<b>x", "<b>gpu"):
        assert raw not in page, raw
    svg = _svg(page)
    assert 'data-node="&lt;script&gt;alert(1)&lt;/script&gt;"' in svg
    assert "<title>&lt;script&gt;alert(1)&lt;/script&gt;\ncuda:1 · elementwise\n" in svg
    assert "<title>&lt;/script&gt;&lt;b&gt;x: cuda:1 → cuda:0, 8 MiB\n" in svg
    assert "cuda:1 · &lt;b&gt;gpu&lt;/b&gt;" in svg


def test_html_pipeline_stages_panel() -> None:
    page = render_html(typed(with_partition(make_plan(), "pipeline")))
    table = page[page.index('<table class="part-stages">'):]
    table = table[:table.index("</table>")]
    assert table.count("<tr>") == 4  # header + 3 stages
    assert "&lt;script&gt;alert(1)&lt;/script&gt; … layers.0.norm" in table
    assert '110 µs<span class="sharebar"><span style="width:100.0%">' in table


def test_partition_is_deterministic() -> None:
    plan = typed(with_partition(make_plan(), "pipeline"))
    page, md = render_html(plan), render_markdown(plan)
    again = Plan.from_json(json.loads(json.dumps(plan.to_dict())))  # through its JSON text
    assert render_html(again) == page and render_markdown(again) == md


def test_no_partition_no_panel() -> None:
    plan = make_plan()
    assert "Partition" not in render_markdown(typed(plan))
    page = render_html(typed(plan))
    assert '<svg class="gantt"' not in page and '"panel part"' not in page
    assert typed(plan).partition is None
    assert partition_panel(typed(plan)) == "" and gantt(typed(plan)) == ""


def test_html_multi_target_partition_is_folded_in_its_target() -> None:
    report = make_multi()
    report["plans"][0] = with_partition(report["plans"][0])
    page = render_html(typed(report))
    assert page.count('<svg class="gantt"') == 1
    first = page.index('<details class="more">')
    assert first < page.index('<svg class="gantt"') < page.index("</details>", first)
    assert ("<summary>Memory, quantization, runtime settings and partition on NVIDIA H100 SXM"
            in page)
    assert "<summary>Memory, quantization, runtime settings on NVIDIA A100 SXM" in page


def test_large_schedule_merges_sub_pixel_bars() -> None:
    n, devices = 50_000, ("cuda:0", "cuda:1", "cpu")
    sched = tuple(ScheduleRow(f"n{i}", devices[i % 3], (i // 3) * US, (i // 3 + 1) * US)
                  for i in range(n))
    xfers = tuple(TransferRow(f"t{i}", "cuda:0", "cuda:1", 1024, i * US, (i + 1) * US)
                  for i in range(5000))
    part = PartitionPlan(strategy=Strategy.HEFT, makespan_s=(n // 3 + 1) * US,
                         devices=tuple(DeviceRow(d, "h100-sxm", GIB, 0, 0.0) for d in devices),
                         schedule=sched, transfers=xfers, stages=(), stage_devices=(),
                         notes=_notes("heft"))
    plan = dataclasses.replace(typed(make_plan()), partition=part)
    assert n > DETAIL_BARS
    svg = gantt(plan)
    lanes = 3 + 1
    assert 'data-merged="1"' in svg and svg.count('class="lane ') == lanes
    assert svg.count("<rect") - lanes <= lanes * 868
    # one run per lane where the columns are busy with one class; the cpu and the copies end
    # in a part-busy column (fainter), so their lanes have two runs
    assert svg.count('class="gb m"') == 4 and svg.count('class="gx m"') == 2
    assert 'width="1" height="22" fill="#9aa3ad" fill-opacity="0.9"><title>18 short' in svg
    assert "16,667 short nodes on cuda:0, 16.7 ms busy\nfirst: n0\nlast: n49998" in svg
    assert len(svg) < 20_000


@pytest.mark.parametrize(("span", "ticks"), [
    (200e-6, [0, 50e-6, 100e-6, 150e-6, 200e-6]), (1.0, [0, 0.2, 0.4, 0.6, 0.8, 1.0]),
    (7e-3, [0, 1e-3, 2e-3, 3e-3, 4e-3, 5e-3, 6e-3, 7e-3])])
def test_ticks(span: float, ticks: list[float]) -> None:
    assert _ticks(span) == pytest.approx(ticks)
