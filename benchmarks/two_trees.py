"""What the benchmarks that compare this tree with a baseline revision share: the baseline
checked out from ``git archive``, a worker script run in a fresh Python process per tree, and
the machine's CPU named for the results."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def baseline_tree(revision: str, folder: Path) -> Path:
    """``revision`` extracted under ``folder`` (a temporary directory): the tree to compare."""
    base = folder / "baseline"
    base.mkdir()
    archive = folder / "baseline.tar"
    subprocess.run(["git", "archive", "-o", str(archive), revision], cwd=ROOT, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(base, filter="data")
    return base


def head_revision() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                          capture_output=True, check=True).stdout.strip()


def run_worker(worker: str, tree: Path) -> Any:
    """Run ``worker`` (a template with ``{tree}``) in a fresh process in ``tree``; it prints
    one ``RESULT <json>`` line, which is returned decoded."""
    proc = subprocess.run([sys.executable, "-c", worker.format(tree=str(tree))], cwd=tree,
                          capture_output=True, text=True, check=False)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"worker failed in {tree}:\n{proc.stderr[-3000:]}")
    return json.loads(line.removeprefix("RESULT "))


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
