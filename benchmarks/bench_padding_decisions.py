"""The tensor-core padding decisions graphopt makes on the test zoo, for a before/after diff.

Padding with ``pad="auto"`` rests on the roofline's alignment penalty (issue 12, item 1:
"padding decisions are re-checked with the calibrated penalties"). This script runs the padding
pass alone (``prepare`` then ``pad_channels``, as ``tests/padding_models.run_pass`` does) on every
model of ``tests/zoo.py`` and ``tests/arch_zoo.py`` for each target and compute dtype, and prints
one line per GEMM-like node: applied or not, the padded dims, the predicted gain and the reason.
``--json PATH`` writes the same records; ``--diff OLD.json`` prints only the decisions whose
outcome (applied, padded dims) differs from an earlier run's.

It runs no GPU code: every gain is a roofline prediction on the target's datasheet profile.

Usage: python benchmarks/bench_padding_decisions.py [--targets h100,a100,v100]
       [--dtypes fp16,bf16] [--only NAME] [--json PATH] [--diff OLD.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from graphopt.backends.torch.padding import pad_channels  # noqa: E402
from graphopt.backends.torch.pipeline import prepare  # noqa: E402
from graphopt.ir.decision_details import PaddingDetail  # noqa: E402
from graphopt.ir.options import Options  # noqa: E402
from tests.arch_zoo import ARCHS, build  # noqa: E402
from tests.zoo import zoo  # noqa: E402


def _models(only: str | None) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = [(n, lambda n=n: zoo()[n]) for n in sorted(zoo())]
    out += [(a.name, lambda n=a.name: build(n)) for a in ARCHS]
    return [(n, make) for n, make in out if only is None or only in n]


def decisions(name: str, make: Any, target: str, dtype: str) -> list[dict[str, Any]]:
    """Every ``padding`` decision of one model on one target in one compute dtype."""
    model, inputs = make()
    torch.manual_seed(0)
    gm, ctx = prepare(model.eval(), inputs, target, Options(pad="auto"))
    ctx.compute_dtype = dtype
    pad_channels(gm, ctx)
    rows = []
    for node, kinds in ctx.decisions.items():
        d = kinds.get("padding")
        if d is None:
            continue
        f = d.detail
        full = isinstance(f, PaddingDetail)  # else a PaddingSkip: no sizes weighed
        rows.append({"model": name, "target": target, "dtype": dtype, "node": node,
                     "applied": d.applied, "old": dict(f.old or {}), "new": dict(f.new or {}),
                     "candidate": dict(f.candidate or {}) if full else {},
                     "gain": f.predicted_gain if full else None, "reason": d.reason})
    return rows


def _key(r: dict[str, Any]) -> tuple[str, str, str, str]:
    return r["model"], r["target"], r["dtype"], r["node"]


def _line(r: dict[str, Any]) -> str:
    gain = f"{r['gain']:.2f}x" if isinstance(r["gain"], (int, float)) else "-"
    state = "PAD " if r["applied"] else "keep"
    return (f"{r['model']:26} {r['target']:5} {r['dtype']:4} {r['node']:28} {state} "
            f"{r['old']} -> {r['candidate'] or r['new']} gain {gain}: {r['reason']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--targets", default="h100,a100,v100")
    ap.add_argument("--dtypes", default="fp16,bf16")
    ap.add_argument("--only", default=None, help="models whose name contains this")
    ap.add_argument("--json", type=Path, default=None, help="write the records here")
    ap.add_argument("--diff", type=Path, default=None, help="compare with an earlier --json")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")

    rows: list[dict[str, Any]] = []
    for name, make in _models(args.only):
        for target in args.targets.split(","):
            for dtype in args.dtypes.split(","):
                rows += decisions(name, make, target, dtype)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if args.diff is None:
        for r in rows:
            print(_line(r))
        padded = sum(r["applied"] for r in rows)
        print(f"\n{len(rows)} padding decisions, {padded} applied")
        return 0
    old = {_key(r): r for r in json.loads(args.diff.read_text())}
    changed = 0
    for r in rows:
        o = old.get(_key(r))
        if o is None or (o["applied"], o["new"]) != (r["applied"], r["new"]):
            changed += 1
            print(f"before: {_line(o) if o else '(none)'}\nafter:  {_line(r)}\n")
    print(f"{changed} of {len(rows)} padding decisions changed outcome")
    return 0


if __name__ == "__main__":
    sys.exit(main())
