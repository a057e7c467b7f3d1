"""Size and render time of the HTML plan report at 50k nodes (issue 9).

The plan is real: the residual-MLP ONNX graph of ``bench_planning.py`` (MatMul, bias Add,
residual Add, LayerNorm per block), 12,500 blocks = 50,000 nodes, planned for an H100. Its reasons
repeat on every block, as in any deep model. Reported per run:

1. the HTML page: MB and render seconds (best of ``--repeat``), against the floors (<= 8 MB,
   <= 4 s at 50k nodes);
2. references measured in the same run: the JSON report's size, and the size the page would have
   with one array per node (the embedded tables decoded back into rows, i.e. the format before
   issue 9), so "before -> after" is a ratio of two numbers from this run;
3. the same plan split in two pipeline stages (``graphopt.partition``): every node then carries
   its own ``device`` decision (start, finish, stage);
4. a worst case: every node given its own times, so no two nodes share a profile (decisions and
   strings are still shared);
5. with ``--browser``, how long headless Chromium takes to load the page and run its script.

Floors apply to 1 only; 3 and 4 are printed so that a regression there shows too.

Usage: python benchmarks/bench_report_html.py [--nodes 50000] [--repeat 3] [--browser]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_planning import onnx_blocks  # noqa: E402
from two_trees import cpu_model  # noqa: E402

from graphopt.decisions.planner import build_plan  # noqa: E402
from graphopt.frontends.onnx_frontend import load_onnx  # noqa: E402
from graphopt.hardware import get_target  # noqa: E402
from graphopt.ir.plan import Plan  # noqa: E402
from graphopt.partition import apply_partition, split  # noqa: E402
from graphopt.report import render_json  # noqa: E402
from graphopt.report._html_data import decode  # noqa: E402
from graphopt.report.html import render_html  # noqa: E402

FLOOR_MB, FLOOR_S = 8.0, 4.0
DATA_OPEN = '<script type="application/json" id="graphopt-data">'


def timed_render(plan: Plan, repeat: int) -> tuple[str, float]:
    best, page = float("inf"), ""
    for _ in range(repeat):
        gc.collect()
        t = time.perf_counter()
        page = render_html(plan)
        best = min(best, time.perf_counter() - t)
    return page, best


def embedded(page: str) -> tuple[dict[str, Any], int]:
    """The page's JSON block and its length in characters."""
    start = page.index(DATA_OPEN) + len(DATA_OPEN)
    end = page.index("</script>", start)
    return json.loads(page[start:end]), end - start


def profiles(page: str) -> int:
    return len(embedded(page)[0]["profiles"])


def one_array_per_node(page: str) -> int:
    """Bytes of the page with its tables expanded into one array per node (the old layout)."""
    data, size = embedded(page)
    old = {k: v for k, v in data.items() if k in ("targets", "colors", "page", "merge",
                                                  "maxall", "fields", "tfields")}
    text = json.dumps({**old, "rows": decode(data)}, ensure_ascii=True, sort_keys=True,
                      separators=(",", ":"))
    return len(page.encode()) - size + len(text.encode())


def browser_load_s(page: str) -> str:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        return "chromium not found"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "plan.html"
        path.write_text(page, encoding="utf-8")
        t = time.perf_counter()
        out = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu",
                              f"--user-data-dir={tmp}/profile", "--virtual-time-budget=60000",
                              "--dump-dom", path.as_uri()], capture_output=True, text=True,
                             timeout=600, check=False).stdout
        dt = time.perf_counter() - t
    return f"{dt:.1f} s" + ("" if 'data-ready="1"' in out else " (script did NOT finish)")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=50_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--browser", action="store_true", help="also time a headless Chromium load")
    args = ap.parse_args()
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}, python {platform.python_version()}")
    t = time.perf_counter()
    plan = build_plan(load_onnx(onnx_blocks(max(1, args.nodes // 4))), get_target("h100"))
    n = len(plan.nodes)
    print(f"plan: {n:,} nodes (ONNX residual MLP, h100), built in {time.perf_counter() - t:.1f} s")
    json_mb = len(render_json(plan.to_dict()).encode()) / 1e6
    page, secs = timed_render(plan, args.repeat)
    mb, before_mb = len(page.encode()) / 1e6, one_array_per_node(page) / 1e6
    print(f"html: {mb:.2f} MB ({len(page.encode()) / n:.0f} B/node), render {secs:.2f} s "
          f"(best of {args.repeat})")
    print(f"references: JSON report {json_mb:.1f} MB; one array per node (old layout) "
          f"{before_mb:.1f} MB -> {before_mb / mb:.1f}x smaller")
    ok = mb <= FLOOR_MB and secs <= FLOOR_S
    print(f"floor (<= {FLOOR_MB:g} MB and <= {FLOOR_S:g} s at 50k nodes): "
          f"{'met' if ok else 'MISSED'}")
    if args.browser:
        print(f"chromium: page loaded and script done in {browser_load_s(page)}")
    t = time.perf_counter()
    split_plan = apply_partition(plan, split(plan, "cuda:0=h100,cuda:1=h100", "pipeline"))
    split_s = time.perf_counter() - t
    page, secs = timed_render(split_plan, args.repeat)
    print(f"split in 2 pipeline stages ({split_s:.1f} s to split, excluded): "
          f"{len(page.encode()) / 1e6:.2f} MB ({len(page.encode()) / n:.0f} B/node), "
          f"render {secs:.2f} s")
    own = replace(plan, nodes=tuple(  # worst case: every node its own times, apart in the 6
        replace(node, cost=replace(node.cost, **{  # significant digits the page keeps
            k: getattr(node.cost, k) * (1 + i * 1e-4)
            for k in ("est_time_s", "compute_time_s", "memory_time_s")}))
        for i, node in enumerate(plan.nodes)))
    page, secs = timed_render(own, args.repeat)
    print(f"worst case, every node its own times ({profiles(page):,} profiles): "
          f"{len(page.encode()) / 1e6:.2f} MB ({len(page.encode()) / n:.0f} B/node), "
          f"render {secs:.2f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
