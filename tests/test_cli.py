"""The `graphopt` command: plan, targets, detect, and clean errors (exit 2, no traceback)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from graphopt.cli.main import main

ROOT = Path(__file__).resolve().parents[1]


def test_plan_python_spec_writes_reports(tmp_path, capsys):
    spec = tmp_path / "m.py"
    spec.write_text(textwrap.dedent("""
        import torch
        def build():
            return torch.nn.Sequential(torch.nn.Linear(16, 24), torch.nn.ReLU()).eval(), \\
                (torch.randn(4, 16),)
    """))
    rc = main(["plan", f"{spec}:build", "--target", "a100", "--json", str(tmp_path / "p.json"),
               "--md", str(tmp_path / "p.md"), "--html", str(tmp_path / "p.html")])
    out = capsys.readouterr().out
    assert rc == 0 and "estimated" in out and "wrote" in out
    plan = json.loads((tmp_path / "p.json").read_text())
    assert plan["target"]["name"] == "a100-80gb"
    assert [n["kernel_class"] for n in plan["nodes"]][:1] == ["gemm"]
    assert (tmp_path / "p.md").read_text().strip()


def test_targets_json_fields(capsys):
    assert main(["targets", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    names = {r["name"] for r in rows}
    assert {"v100", "t4", "a10", "a100-40gb", "a100-80gb", "rtx-3090", "rtx-4090", "l4", "l40s",
            "rtx-6000-ada", "h100-sxm", "h100-pcie", "h200", "b200", "rtx-5090", "cpu"} <= names
    for r in rows:
        assert {"name", "compute_capability", "generation", "sm_count", "memory_bytes",
                "bandwidth_bytes_per_s", "peak_flops"} <= set(r)
    h100 = next(r for r in rows if r["name"] == "h100-sxm")
    assert h100["compute_capability"] == "9.0" and h100["generation"] == "hopper"


def test_targets_table_and_detect(capsys):
    assert main(["targets"]) == 0
    assert "h100-sxm" in capsys.readouterr().out
    assert main(["detect", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert "cpu" in report
    assert main(["detect"]) == 0  # a table for a person: the same facts, no JSON
    text = capsys.readouterr().out
    assert not text.lstrip().startswith("{")
    assert report["cpu"]["model"] in text and report["host_profile"]["display_name"] in text
    assert " ".join(report["cpu"]["isa"]) in text and "GPUs     none usable" in text or \
        all(g["name"] in text for g in report["gpus"])


@pytest.mark.parametrize(
    ("args", "needle"),
    [(["plan", "missing.onnx"], "not found"),
     (["plan", "{tmp}/bad.onnx"], "onnx"),
     (["plan", "{tmp}/m.py:nothere"], "no function"),
     (["plan", "{tmp}/m.py:build", "--target", "h999"], "unknown target")],
)
def test_errors_are_clean(tmp_path, capsys, args, needle):
    (tmp_path / "bad.onnx").write_bytes(b"\x08\x07garbage" * 10)
    (tmp_path / "m.py").write_text("import torch\ndef build():\n"
                                   "    return torch.nn.Linear(4, 4), (torch.randn(2, 4),)\n")
    rc = main([a.format(tmp=tmp_path) for a in args])
    err = capsys.readouterr().err
    assert rc == 2
    assert needle in err.lower() and "fix:" in err and "Traceback" not in err


def test_console_script_runs_as_a_process(tmp_path):
    r = subprocess.run([sys.executable, "-m", "graphopt.cli", "plan", str(tmp_path / "x.onnx")],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "fix:" in r.stderr


def test_plan_with_devices_reports_the_partition(tmp_path, capsys):
    spec = tmp_path / "m.py"
    spec.write_text("import torch\ndef build():\n    torch.manual_seed(0)\n    return "
                    "torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), "
                    "torch.nn.Linear(256, 64)).eval(), (torch.randn(8, 64),)\n")
    out = tmp_path / "p.json"
    rc = main(["plan", f"{spec}:build", "--target", "h100", "--devices",
               "cuda:0=h100,cuda:1=a100:40GB,cpu", "--strategy", "pipeline", "--json", str(out)])
    assert rc == 0
    plan = json.loads(out.read_text())
    part = plan["partition"]
    assert part["strategy"] == "pipeline"
    assert [d["name"] for d in part["devices"]] == ["cuda:0", "cuda:1", "cpu"]
    assert all(n["decisions"]["device"]["device"] in ("cuda:0", "cuda:1", "cpu")
               for n in plan["nodes"])
    capsys.readouterr()
    rc = main(["plan", f"{spec}:build", "--devices", "cuda:0=h100:999TB"])
    assert rc == 2 and "fix:" in capsys.readouterr().err


def test_detect_table_names_each_gpu_and_its_profile():
    """The GPU rows, from a report as detect_report writes it for a machine with two GPUs."""
    from graphopt.cli.targets import detect_lines
    from graphopt.hardware.detect import detect_report

    report = detect_report()
    report["gpus"] = [
        {"index": 0, "name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0",
         "sm_count": 132, "memory_bytes": 80 * 2**30, "l2_bytes": 50 * 2**20,
         "generation": "hopper", "profile": "h100-sxm", "estimated": False},
        {"index": 1, "name": "Some GPU", "compute_capability": "12.7", "sm_count": 10,
         "memory_bytes": None, "l2_bytes": None, "generation": None, "profile": None,
         "error": "compute capability 12.7 is newer than graphopt's table"}]
    lines = detect_lines(report)
    assert any(line.startswith("GPU 0") and "target h100-sxm" in line and "80 GiB" in line
               for line in lines)
    assert any(line.startswith("GPU 1") and "no profile: compute capability 12.7" in line
               for line in lines)
