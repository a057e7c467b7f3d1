"""Export time at scale: graphopt's ONNX export vs ``torch.onnx.export(dynamo=True)`` (issue 6).

Model: ``tests/zoo.py`` ``ResidualMLP(1000)`` (1,000 blocks ``x = LayerNorm(x + Linear64(x))``,
batch 16). Each measurement runs once in a fresh Python process (so no exporter warms caches
for another; imports and model construction excluded from the time):

1. ``graphopt.frontends.onnx_export.export_torch``: the TorchScript exporter (opset 17), checked
once in
   ONNX Runtime against torch (dynamo only as a fallback, which this model does not need);
2. the same plus ``optimize_onnx(--target cpu)`` and writing the model and its session
   config: what ``graphopt optimize model.py:fn -o out.onnx --target cpu`` does;
3. ``torch.onnx.export(model, args, dynamo=True)`` written to a file.

Floor: (1) <= 1/5 of (3). Every written model is run in ORT and compared with torch.

Run: ``python benchmarks/bench_onnx_export.py [--blocks N]``.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_WORKER = r"""
import json, sys, time, warnings
sys.path.insert(0, {root!r})
warnings.simplefilter("ignore")
import numpy as np, onnx, onnxruntime as ort, torch
from tests.zoo import ResidualMLP
torch.manual_seed(0)
model, x = ResidualMLP({blocks}).eval(), torch.randn(16, 64)
with torch.no_grad():
    ref = model(x).numpy()
out, kind = {out!r}, {kind!r}
if kind == "dynamo":
    t0 = time.perf_counter()
    program = torch.onnx.export(model, (x,), dynamo=True, verbose=False)
    program.save(out)
    seconds, exporter = time.perf_counter() - t0, "dynamo"
else:
    from graphopt.frontends.onnx_export import export_torch
    from graphopt.backends.onnx.pipeline import optimize_onnx, save_onnx
    t0 = time.perf_counter()
    exported = export_torch(model, (x,))
    if kind == "graphopt":
        onnx.save(exported.model, out)
    else:
        done = optimize_onnx(exported.model, "cpu", samples=[exported.feeds])
        opt, info = done.model, done.report
        save_onnx(opt, out, info["session"])
    seconds, exporter = time.perf_counter() - t0, exported.exporter
sess = ort.InferenceSession(out, providers=["CPUExecutionProvider"])
got = sess.run(None, {{sess.get_inputs()[0].name: x.numpy()}})[0]
err = float(np.abs(got - ref).max() / np.abs(ref).max())
print(json.dumps({{"seconds": seconds, "exporter": exporter, "err": err,
                  "nodes": len(onnx.load(out).graph.node)}}))
"""


def _measure(kind: str, blocks: int, out: Path) -> dict[str, float | str]:
    code = _WORKER.format(root=str(ROOT), blocks=blocks, out=str(out), kind=kind)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{kind} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=1000)
    args = p.parse_args()
    import onnx
    import onnxruntime as ort
    import torch

    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"onnx {onnx.__version__}, onnxruntime {ort.__version__}; ResidualMLP({args.blocks}),"
          " batch 16; each measurement in a fresh process")
    with tempfile.TemporaryDirectory() as tmp:
        ours = _measure("graphopt", args.blocks, Path(tmp) / "graphopt.onnx")
        print(f"graphopt export ({ours['exporter']} exporter, {ours['nodes']} ONNX nodes, "
              f"checked in ORT): {ours['seconds']:.1f} s (max err {ours['err']:.2g} of scale)",
              flush=True)
        full = _measure("graphopt+optimize", args.blocks, Path(tmp) / "full.onnx")
        print(f"graphopt export + optimize --target cpu + write: {full['seconds']:.1f} s "
              f"(max err {full['err']:.2g} of scale)", flush=True)
        dyn = _measure("dynamo", args.blocks, Path(tmp) / "dynamo.onnx")
        print(f"torch.onnx.export(dynamo=True) ({dyn['nodes']} ONNX nodes): "
              f"{dyn['seconds']:.1f} s (max err {dyn['err']:.2g} of scale)")
    ratio = float(ours["seconds"]) / float(dyn["seconds"])
    ratio_full = float(full["seconds"]) / float(dyn["seconds"])
    print(f"\ngraphopt export / dynamo export: {ratio:.3f} (1/{1 / ratio:.1f}; floor <= 0.200); "
          f"with optimize + write: {ratio_full:.3f} (1/{1 / ratio_full:.1f})")
    ok = ratio <= 0.2 and float(ours["err"]) <= 1e-5 and float(full["err"]) <= 1e-5
    print("floor met" if ok else "FLOOR NOT MET")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
