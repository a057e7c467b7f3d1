"""Did a refactor change what graphopt produces? Snapshot every zoo model's results, compare two.

For each model of the test zoos (``tests/zoo.py`` and the transformers architectures of
``tests/arch_zoo.py``) and each target (default h100 and cpu), it records:

- the plan's JSON report (``graphopt.plan``);
- the torch module's outputs and JSON report (``graphopt.optimize(measure=False)``: timing
  decides nothing, so two runs on one machine give the same module);
- the ONNX artifact's outputs in ONNX Runtime and its JSON report (``export_onnx``).

``snapshot DIR`` writes them under DIR; ``compare OLD NEW`` says, per model and target, whether
the outputs are bit-identical and the reports equal. Fields that time the run (``*_s`` of
export and check durations) are left out; ``--allow KEY`` leaves out more (a refactor that adds
a decision kind names it). Exit status 1 if anything differs.

Usage:
  python benchmarks/compare_outputs.py snapshot /tmp/before [--models llama,odd_mlp]
  python benchmarks/compare_outputs.py compare /tmp/before /tmp/after [--allow padding]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import graphopt  # noqa: E402
from tests import arch_zoo, zoo  # noqa: E402

#: report fields that time the run, not what was decided
_VOLATILE = {"export_s", "seconds", "elapsed_s", "plan_s", "check_s", "guard_s", "wall_s",
             "time_s", "optimize_s", "timings"}


def _models() -> dict[str, Any]:
    builders: dict[str, Any] = {name: (lambda n=name: zoo.zoo()[n]) for name in zoo.zoo()}
    builders.update({a.name: (lambda n=a.name: arch_zoo.build(n)) for a in arch_zoo.ARCHS})
    return builders


def _arrays(out: Any, prefix: str = "out") -> dict[str, np.ndarray]:
    """Every tensor of a (nested) output, keyed by its path."""
    if isinstance(out, torch.Tensor):
        return {prefix: out.detach().float().numpy()}
    if isinstance(out, np.ndarray):
        return {prefix: out.astype(np.float32)}
    items = (out.items() if isinstance(out, dict) else
             vars(out).items() if hasattr(out, "__dataclass_fields__") else enumerate(out))
    found: dict[str, np.ndarray] = {}
    for k, v in items:
        if v is not None and not isinstance(v, (int, float, str, bool)):
            found.update(_arrays(v, f"{prefix}.{k}"))
    return found


def _scrub(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _scrub(v) for k, v in value.items() if k not in _VOLATILE}
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    return value


def _snapshot_one(name: str, build: Any, target: str, folder: Path) -> None:
    import onnxruntime as ort

    model, inputs = build()
    plan = graphopt.plan(model, inputs, target=target)
    (folder / "plan.json").write_text(plan.to_json())
    opt = graphopt.optimize(model, inputs, target=target, measure=False)
    with torch.no_grad():
        np.savez(folder / "torch.npz", **_arrays(opt.module(*inputs)))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{name}.onnx"
        opt.export_onnx(path)
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        feeds = {i.name: a.numpy() for i, a in zip(session.get_inputs(), inputs, strict=False)}
        np.savez(folder / "onnx.npz", **_arrays(session.run(None, feeds)))
    (folder / "optimize.json").write_text(opt.plan.to_json())


def snapshot(out: Path, names: list[str], targets: list[str]) -> None:
    builders = _models()
    out.mkdir(parents=True, exist_ok=True)
    (out / "machine.txt").write_text(f"{platform.processor() or platform.machine()} "
                                     f"torch {torch.__version__} graphopt "
                                     f"{graphopt.__version__}\n")
    for name in names or list(builders):
        for target in targets:
            folder = out / name / target
            folder.mkdir(parents=True, exist_ok=True)
            try:
                _snapshot_one(name, builders[name], target, folder)
                print(f"{name:28} {target:6} recorded", flush=True)
            except Exception as e:  # recorded as a result too: the same failure must recur
                (folder / "error.txt").write_text(f"{type(e).__name__}: {e}\n")
                print(f"{name:28} {target:6} error: {type(e).__name__}: {e}", flush=True)


def _json_diff(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append(f"{path}/{k}: only in {'new' if k in b else 'old'}")
            else:
                out += _json_diff(a[k], b[k], f"{path}/{k}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True))
                for d in _json_diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {str(a)[:80]} -> {str(b)[:80]}"]


def _drop(value: Any, allow: set[str]) -> Any:
    if isinstance(value, dict):
        return {k: _drop(v, allow) for k, v in value.items() if k not in allow}
    if isinstance(value, list):
        return [_drop(v, allow) for v in value]
    return value


def _compare_one(old: Path, new: Path, allow: set[str]) -> list[str]:
    problems = []
    for f in ("error.txt", "plan.json", "optimize.json", "torch.npz", "onnx.npz"):
        a, b = old / f, new / f
        if a.exists() != b.exists():
            problems.append(f"{f}: only in {'new' if b.exists() else 'old'}")
        elif not a.exists():
            continue
        elif f.endswith(".npz"):
            za, zb = np.load(a), np.load(b)
            if sorted(za.files) != sorted(zb.files):
                problems.append(f"{f}: outputs {za.files} -> {zb.files}")
            problems += [f"{f}:{k} differs (max {np.abs(za[k] - zb[k]).max():.3g})"
                         for k in za.files if k in zb.files and not np.array_equal(za[k], zb[k])]
        elif f.endswith(".json"):
            ja, jb = (_drop(_scrub(json.loads(p.read_text())), allow) for p in (a, b))
            problems += [f"{f}{d}" for d in _json_diff(ja, jb)[:10]]
        elif a.read_text() != b.read_text():
            problems.append(f"{f}: {a.read_text().strip()} -> {b.read_text().strip()}")
    return problems


def compare(old: Path, new: Path, allow: set[str]) -> int:
    differ = 0
    for folder in sorted(p for p in old.glob("*/*") if p.is_dir()):
        rel = folder.relative_to(old)
        problems = _compare_one(folder, new / rel, allow)
        differ += bool(problems)
        print(f"{str(rel):36} {'same' if not problems else 'DIFFERS'}")
        for p in problems:
            print(f"    {p}")
    print(f"{differ} of {len(list(old.glob('*/*')))} model/target pairs differ")
    return 1 if differ else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("snapshot")
    s.add_argument("out", type=Path)
    s.add_argument("--models", default="")
    s.add_argument("--targets", default="h100,cpu")
    c = sub.add_parser("compare")
    c.add_argument("old", type=Path)
    c.add_argument("new", type=Path)
    c.add_argument("--allow", action="append", default=[])
    args = p.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    if args.cmd == "snapshot":
        snapshot(args.out, [m for m in args.models.split(",") if m],
                 args.targets.split(","))
        return 0
    return compare(args.old, args.new, set(args.allow))


if __name__ == "__main__":
    sys.exit(main())
