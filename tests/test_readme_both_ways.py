"""Issue 33, finding 3: one entry point, one answer. Each README command that writes a JSON
report (``plan``, ``lint``, ``optimize``, ``profile``, ``llm``) is run through the CLI and as
the Python call the README pairs it with, on the same small model, and the two JSON documents
must agree, only wall times and measured times left out. Targets are pinned (h100, and ``cpu``
with a table CPU's ISA), and nothing is timed to decide (``--no-measure``/``measure=False``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphopt
from graphopt.api.llm import plan_llm
from graphopt.cli.main import main
from graphopt.decisions.lint import lint
from graphopt.hardware.detect import HOST_ISA_ENV
from graphopt.measure import profile

MODEL = '''
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 24, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(24)
        self.fc = torch.nn.Linear(24, 10)

    def forward(self, x):
        h = torch.relu(self.bn(self.conv(x)))
        return self.fc(h.mean((2, 3)))


def build():
    return Net().eval(), (torch.randn(2, 3, 16, 16),)
'''

LLM = '''
import torch
import transformers


def build():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, vocab_size=256, max_position_embeddings=4096)
    return transformers.LlamaForCausalLM(config).eval(), (torch.ones(1, 8, dtype=torch.long),)
'''

#: keys whose values are wall or measured times of this run, or where it ran: left out
_TIMES = {"timings", "measured", "export_s", "generated_at", "measured_s", "prediction",
          "seconds", "wall_s", "created", "path", "graphopt_version"}


def _plain(doc: Any) -> Any:
    """``doc`` without the times of this run (both ways run the same work once each), and
    without the note on the machine's load while it measured (another job's, not the model's)."""
    if isinstance(doc, dict):
        return {k: _plain(v) for k, v in doc.items() if k not in _TIMES}
    if isinstance(doc, list):
        return [_plain(v) for v in doc
                if not (isinstance(v, str) and v.startswith("the host was busy"))]
    return doc


@pytest.fixture()
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setenv(HOST_ISA_ENV, "xeon-8380")  # the cpu target, whatever runs the test
    from graphopt.hardware.detect import host_cpu_profile

    host_cpu_profile.cache_clear()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.py").write_text(MODEL)
    w = np.random.default_rng(0).standard_normal((64, 48)).astype(np.float32) / 8
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
        "mm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 48])],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "model.onnx"))
    yield {"py": str(tmp_path / "model.py") + ":build", "onnx": str(tmp_path / "model.onnx")}
    host_cpu_profile.cache_clear()


def _cli(args: list[str], out: Path) -> Any:
    main(args + ["--json", str(out)])
    return json.loads(out.read_text())


def _both(cli: Any, api: Any) -> None:
    assert _plain(cli) == _plain(api)


CASES: dict[str, tuple[list[str], Callable[[dict[str, str]], Any]]] = {
    "plan onnx": (["plan", "{onnx}", "--target", "a100-80gb", "--dynamic", "batch=8"],
                  lambda f: graphopt.plan(f["onnx"], target="a100-80gb",
                                          dynamic_shapes={"batch": 8})),
    "plan py, three targets": (["plan", "{py}", "--target", "a100,h100,b200"],
                               lambda f: graphopt.plan(f["py"], target=["a100", "h100", "b200"])),
    "plan py, devices": (["plan", "{py}", "--devices", "cuda:0=h100,cuda:1=a100:40GB,cpu:8GB",
                          "--strategy", "pipeline"],
                         lambda f: graphopt.plan(f["py"], devices="cuda:0=h100,cuda:1=a100:40GB,"
                                                 "cpu:8GB", strategy="pipeline")),
    "plan onnx, dynamic": (["plan", "{onnx}", "--dynamic", "batch=1:8:64"],
                           lambda f: graphopt.plan(f["onnx"],
                                                   dynamic_shapes={"batch": (1, 8, 64)})),
    "optimize onnx": (["optimize", "{onnx}", "-o", "fast.onnx", "--target", "cpu",
                       "--no-measure", "--dynamic", "batch=8"],
                      lambda f: graphopt.optimize(f["onnx"], target="cpu", measure=False,
                                                  dynamic_shapes={"batch": 8}).plan),
    "optimize py to pt2": (["optimize", "{py}", "--target", "h100", "-o", "model.pt2"],
                           lambda f: graphopt.optimize(f["py"], target="h100").plan),
    "optimize py to a deploy folder": (
        ["optimize", "{py}", "--target", "cpu", "-o", "out/", "--no-measure"],
        lambda f: graphopt.optimize(f["py"], target="cpu", measure=False).plan),
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_cli_writes_the_api_json(name: str, files: dict[str, str], tmp_path: Path) -> None:
    args, call = CASES[name]
    cli = _cli([a.format(**files) for a in args], tmp_path / "cli.json")
    api = json.loads(call(files).to_json())
    _both(cli, api)


def test_lint_json_is_the_api_lint(files: dict[str, str], capsys: pytest.CaptureFixture[str]
                                   ) -> None:
    main(["lint", files["py"], "--target", "a100", "--json"])
    cli = json.loads(capsys.readouterr().out)
    p = graphopt.plan(files["py"], target="a100")
    assert cli == [{"target": p.target.name, **i.to_dict()} for i in lint(p)]


def test_profile_json_is_the_api_profile(files: dict[str, str], tmp_path: Path) -> None:
    cli = _cli(["profile", files["py"], "--target", "cpu", "--runs", "2", "--warmup", "1",
                "--threads", "1"], tmp_path / "cli.json")
    api = json.loads(profile(files["py"], target="cpu", runs=2, warmup=1, threads=1).to_json())
    _both(cli, api)


def test_llm_json_is_the_api_llm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("transformers")
    spec = tmp_path / "llm.py"
    spec.write_text(LLM)
    cli = _cli(["llm", f"{spec}:build", "--target", "h100", "--batch", "1:64", "--prompt",
                "512", "--cache", "2048"], tmp_path / "cli.json")
    from graphopt.frontends.python_spec import load_python_spec

    model = load_python_spec(f"{spec}:build")[0]
    api = plan_llm(model, "h100", batch=(1, 64), prompt_len=512, cache_len=2048)
    _both(cli, json.loads(api.decode.to_json()))
