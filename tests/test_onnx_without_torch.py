"""Planning, optimizing and exporting an ``.onnx`` file never imports torch (issue 10, item 5).

torch takes about 2 s to import and is not needed to read, decide on or rewrite an ONNX graph:
the decisions both backends share live in ``graphopt.decisions`` and import no torch. Each
check runs in a fresh interpreter, since this test process has torch loaded already.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import graphopt

# The child records who imports torch first (without blocking it), runs the ONNX entry points
# and prints a JSON verdict on its last line.
_CHILD = r"""
import json, sys, traceback

first = []


class _Watch:
    def find_spec(self, name, path=None, target=None):
        if (name == "torch" or name.startswith("torch.")) and not first:
            first.append("".join(traceback.format_stack(limit=25)))
        return None


sys.meta_path.insert(0, _Watch())
folder = sys.argv[1]
model = folder + "/m.onnx"

import graphopt
from graphopt.cli.main import main

codes = [main(["plan", model, "--target", "h100,cpu", "--json", folder + "/plan.json"])]
opt = graphopt.optimize(model, target="cpu")
opt.export_onnx(folder + "/api.onnx")
gpu = graphopt.optimize(model, target="h100", pad="always", measure=False)
gpu.export_onnx(folder + "/h100.onnx")
graphopt.ort_session(folder + "/api.onnx")
codes.append(main(["optimize", model, "-o", folder + "/cli.onnx", "--target", "cpu"]))
print(json.dumps({"codes": codes, "gpu_passes": gpu.info.passes_applied,
                  "torch": "torch" in sys.modules, "first": first[:1]}))
"""


def _model(path: Path) -> None:
    """MatMul 67 -> 129 with odd dims (a padding candidate on GPUs), then Softmax (an fp32
    island when reduced precision applies), so the padding and precision passes both run."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((67, 129)).astype(np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]),
         helper.make_node("Softmax", ["h"], ["y"], axis=-1)],
        "mm_softmax", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 67])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 129])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)


def test_onnx_paths_never_import_torch(tmp_path: Path) -> None:
    _model(tmp_path / "m.onnx")
    root = str(Path(graphopt.__file__).resolve().parent.parent)
    done = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path)], capture_output=True,
                          text=True, timeout=300, cwd=root,
                          env={**os.environ, "PYTHONPATH": root})
    assert done.returncode == 0, done.stderr[-3000:]
    verdict = json.loads(done.stdout.strip().splitlines()[-1])
    assert verdict["codes"] == [0, 0]
    assert verdict["gpu_passes"] == ["padding", "precision"]  # both passes ran, not just loaded
    for name in ("plan.json", "api.onnx", "api.graphopt.json", "h100.onnx", "cli.onnx",
                 "cli.graphopt.json"):
        assert (tmp_path / name).is_file(), name
    assert not verdict["torch"], "torch was imported by:\n" + "".join(verdict["first"])
