"""``graphopt lint``: tensor-core compliance issues and their fixes, per target."""

from __future__ import annotations

import argparse
import json

from graphopt.api.planning import plan
from graphopt.cli.args import add_no_calibrate, cli_target
from graphopt.decisions.lint import lint
from graphopt.hardware.registry import DEFAULT_TARGET
from graphopt.ir.plan import PlanSet

__all__ = ["add_parser"]


def _cmd_lint(args: argparse.Namespace) -> int:
    targets = cli_target(args)
    result = plan(args.model, target=targets)
    plans = result.plans if isinstance(result, PlanSet) else (result,)
    found = [(p, lint(p)) for p in plans]
    if args.json:
        rows = [{"target": p.target.name, **i.to_dict()} for p, issues in found for i in issues]
        print(json.dumps(rows, indent=1))
    else:
        for p, issues in found:
            for i in issues:
                print(f"{i.rule} {i.node}: {i.message}\n      fix: {i.fix}")
            print(f"{len(issues)} tensor-core issue(s) for {p.target.display_name}")
    return 1 if any(issues for _, issues in found) else 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the subcommand on the CLI's subparsers."""
    pl = sub.add_parser("lint", help="list tensor-core compliance issues and their fixes")
    pl.add_argument("model", help="an .onnx file, or file.py:function")
    pl.add_argument("--target", default=DEFAULT_TARGET, help="target name (see `graphopt targets`)")
    add_no_calibrate(pl)
    pl.add_argument("--json", action="store_true", help="print JSON")
    pl.set_defaults(func=_cmd_lint)
