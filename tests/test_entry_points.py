"""Issue 33, finding 3: one entry point, one answer. The CLI builds a ``file.py:build`` module
once and hands the module to the same API call, so ``graphopt plan`` writes the plan JSON that
``graphopt.plan`` returns for the same arguments (the 2-D strategy included, which needs the
module itself)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import graphopt
from graphopt.cli.main import main

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
NODES = "cuda:0=h100@a,cuda:1=h100@a,cuda:2=h100@b,cuda:3=h100@b,net=400Gb/s"


def test_cli_plan_is_the_api_plan_with_the_module(tmp_path: Path) -> None:
    spec = tmp_path / "m.py"
    spec.write_text(f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n"
                    "from tests.arch_zoo import build as _b\n"
                    "def build():\n    return _b('llama')\n")
    out = tmp_path / "cli.json"
    assert main(["plan", f"{spec}:build", "--devices", NODES, "--strategy", "auto",
                 "--json", str(out)]) == 0
    cli = json.loads(out.read_text())
    api = json.loads(graphopt.plan(f"{spec}:build", devices=NODES, strategy="auto").to_json())
    assert cli["strategy"] == api["strategy"]
    assert not any("no nn.Module given" in str(c) for c in cli["strategy"]["candidates"])
    assert cli == api
