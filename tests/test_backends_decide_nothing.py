"""Backends apply decisions; they do not make them (issue 20, item 3).

Inductor's ``pad_mm`` split, across graphopt's two IRs: ``decisions/`` answers "should we" from
the plan and the target (the cost model, measured thresholds), and a backend answers only "can I
apply this here" and makes the edits. This test lists every backend function that reads the cost
model (a node's estimated time, FLOPs or bytes, a target's peaks or bandwidth, anything from
``graphopt.cost``) or a profitability rule (``should_*``, ``*_pays*``, a measured threshold such
as ``CONV_INT8_MEASURED``). Each one found is decision logic left in a backend.

``_NOT_YET_MOVED`` lists those still to move, each with where it goes; the list may only shrink.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import graphopt

BACKENDS = Path(graphopt.__file__).parent / "backends"

#: what a plan node or a target knows from the cost model
_COST_FIELDS = {"est_time_s", "cost", "flops", "bytes_read", "bytes_written", "peak_flops",
                "bandwidth_bytes_per_s", "measured_rates", "vector_flops"}
_RULE = re.compile(r"should_\w+|\w*_pays\w*|[A-Z][A-Z0-9_]*_MEASURED")

#: decision logic still in a backend: (module under backends/, function) -> where it goes
_NOT_YET_MOVED: dict[tuple[str, str], str] = {}


def decision_logic(root: Path = BACKENDS) -> dict[tuple[str, str], list[str]]:
    """(module, function) -> the cost-model fields and rules it reads, for every backend
    function that reads any."""
    found: dict[tuple[str, str], list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        from_cost = {a.asname or a.name for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                         "graphopt.cost") for a in node.names}
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            reads = set()
            for node in ast.walk(fn):
                if isinstance(node, ast.Attribute) and node.attr in _COST_FIELDS:
                    reads.add(node.attr)
                elif isinstance(node, ast.Name) and (node.id in from_cost
                                                     or _RULE.fullmatch(node.id)):
                    reads.add(node.id)
            if reads:
                found[(path.relative_to(root).as_posix(), fn.name)] = sorted(reads)
    return found


def test_no_new_decision_logic_in_the_backends() -> None:
    found = decision_logic()
    new = {k: v for k, v in found.items() if k not in _NOT_YET_MOVED}
    assert new == {}, "decision logic in a backend (move it to graphopt/decisions): " + \
        "; ".join(f"{m}::{f} reads {', '.join(r)}" for (m, f), r in sorted(new.items()))


def test_the_not_yet_moved_list_only_shrinks() -> None:
    """An entry that no longer reads the cost model was moved: take it off the list."""
    stale = sorted(set(_NOT_YET_MOVED) - set(decision_logic()))
    assert stale == [], f"moved already, remove from _NOT_YET_MOVED: {stale}"


def test_the_scan_sees_a_cost_read_and_a_rule(tmp_path: Path) -> None:
    """The checker itself: a plan node's time and a profitability rule are found."""
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "probe.py").write_text(
        "from graphopt.cost.roofline import estimate\n"
        "def pick(node):\n    return node.cost.est_time_s > 1e-6\n"
        "def rule(t):\n    return int8_pays_on_cpu(t)\n"
        "def edit(gm):\n    return gm.graph\n")
    assert decision_logic(tmp_path) == {("torch/probe.py", "pick"): ["cost", "est_time_s"],
                                        ("torch/probe.py", "rule"): ["int8_pays_on_cpu"]}
