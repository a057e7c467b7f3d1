"""The version has one source, ``graphopt/_version.py``: the package, the report and the
package metadata (pyproject's dynamic version) all read it, so they cannot disagree."""

from __future__ import annotations

from pathlib import Path

from setuptools.config.pyprojecttoml import read_configuration

import graphopt
from graphopt.decisions.planner import build_plan
from graphopt.hardware import get_target
from tests.irbuild import G

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_reads_the_version_from_version_module() -> None:
    """setuptools resolves the dynamic version the way ``pip install`` does."""
    path = ROOT / "pyproject.toml"
    raw = read_configuration(path, expand=False)
    assert "version" not in raw["project"] and "version" in raw["project"]["dynamic"]
    assert raw["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "graphopt._version.__version__"}
    assert read_configuration(path)["project"]["version"] == graphopt.__version__


def test_plan_report_carries_the_package_version() -> None:
    g = G()
    y = g.op("Relu", [g.input("x", (4, 8))], (4, 8))
    plan = build_plan(g.build([y]), get_target("h100"))
    assert plan.to_dict()["graphopt_version"] == graphopt.__version__

