"""``graphopt profile MODEL --target cpu``: the CLI face of :func:`graphopt.profile`."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from graphopt.cli.args import add_no_calibrate, cli_target
from graphopt.files.inputs import input_files
from graphopt.files.outputs import OutputSet
from graphopt.measure import profile
from graphopt.report.format import fmt_seconds
from graphopt.report.prediction import worst_nodes

__all__ = ["add_parser"]


def _cmd_profile(args: argparse.Namespace) -> int:
    outputs = OutputSet(input_files(args.model))
    outputs.claim_each((args.json, args.md, args.html), "report")  # before the work
    plan = profile(args.model, target=cli_target(args, args.threads), runs=args.runs,
                   warmup=args.warmup, threads=args.threads)
    plan.stage_reports(outputs, json=args.json, md=args.md, html=args.html)
    written = outputs.commit()
    pred = plan.summary.prediction

    def num(key: str, fmt: str) -> str:
        v = getattr(pred, key)
        return "n/a" if v is None or not math.isfinite(v) else format(v, fmt)

    print(f"{plan.model.name} on {plan.target.display_name}: predicted "
          f"{fmt_seconds(plan.summary.est_latency_s)}, measured "
          f"{fmt_seconds(pred.measured_model_s)} (best of {pred.runs} runs)")
    print(f"  per node ({pred.nodes_measured} measured): Spearman {num('spearman', '.3f')}, "
          f"median predicted/measured {num('median_ratio', '.3g')}x; whole model "
          f"{num('model_ratio', '.3g')}x")
    if pred.measured_module_s is not None:
        print(f"  your module as called: {fmt_seconds(pred.measured_module_s)}, predicted/"
              f"measured {num('module_ratio', '.3g')}x (the rest is Python around the graph)")
    if not plan.target.calibrated:
        print("  uncalibrated host numbers (--no-calibrate, GRAPHOPT_NO_CALIBRATE=1 or "
              "GRAPHOPT_HOST_ISA): --target cpu otherwise uses this CPU's cached calibration")
    for n, p, m in worst_nodes(plan, 5):
        print(f"  {p / m:8.3g}x  {fmt_seconds(p):>10} predicted {fmt_seconds(m):>10} measured  "
              f"{n.analysis.kernel_class.value:<13} {n.name}")
    for w in plan.warnings:
        print(f"  warning: {w}")
    for path in written:
        print(f"wrote {path}")
    return 0


def add_parser(sub: argparse._SubParsersAction,
               add_reports: Callable[[argparse.ArgumentParser], None]) -> None:
    """Register ``profile`` on the CLI's subparsers (``add_reports`` adds --json/--md/--html)."""
    p = sub.add_parser("profile", help="run a model on this machine's CPU and compare each "
                                       "node's measured time with its prediction")
    p.add_argument("model", help="an .onnx file, or file.py:function returning "
                                 "(module, example_inputs)")
    p.add_argument("--target", default="cpu", help="cpu: this machine's CPU (FILE.json: as "
                                                   "measured by graphopt calibrate); on a CUDA "
                                                   "machine gpu (a file.py:function model "
                                                   "built on the GPU)")
    add_no_calibrate(p)
    p.add_argument("--runs", type=int, default=10, help="profiled runs (median per node)")
    p.add_argument("--warmup", type=int, default=3, help="unprofiled runs first")
    p.add_argument("--threads", type=int, help="intra-op threads while measuring (default: the "
                                               "runtime's; 1 on a host busy with other jobs)")
    add_reports(p)
    p.set_defaults(func=_cmd_profile)
