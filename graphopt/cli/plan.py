"""``graphopt plan``: trace or load a model, plan it for one or more targets, print the
costliest nodes and write the reports."""

from __future__ import annotations

import argparse

from graphopt.api.planning import plan
from graphopt.cli.args import (
    add_devices,
    add_dynamic,
    add_no_calibrate,
    add_reports,
    cli_target,
    fmt_time,
)
from graphopt.cli.dynamic_spec import parse_dynamic
from graphopt.cli.split_summary import split_lines
from graphopt.files.inputs import input_files
from graphopt.files.outputs import OutputSet
from graphopt.frontends.python_spec import is_python_spec
from graphopt.hardware.registry import DEFAULT_TARGET
from graphopt.ir.plan import PlanSet

__all__ = ["add_parser"]


def _cmd_plan(args: argparse.Namespace) -> int:
    outputs = OutputSet(input_files(args.model))
    outputs.claim_each((args.json, args.md, args.html), "report")  # before the work
    dynamic = parse_dynamic(args.dynamic, is_python_spec(args.model))
    result = plan(args.model, target=cli_target(args), devices=args.devices, strategy=args.strategy,
                  dynamic_shapes=dynamic)
    result.stage_reports(outputs, json=args.json, md=args.md, html=args.html)
    written = outputs.commit()
    plans = result.plans if isinstance(result, PlanSet) else (result,)
    for w in plans[0].warnings:  # first: a fallback's cause qualifies every number below
        print(f"warning: {w}")
    for p in plans:
        s = p.summary
        fused = s.est_latency_fused_s
        print(f"{p.model.name} ({p.model.source}, {s.node_count} nodes) on "
              f"{p.target.display_name}: estimated {fmt_time(s.est_latency_s)}"
              + (f" unfused, {fmt_time(fused)} fused" if fused is not None else ""))
        rng = p.shape_range
        if rng:
            est = rng.est_latency_s
            at = ", ".join(f"{d.name} {d.min}/{d.opt}/{d.max or 'inf'}" for d in rng.dims)
            print(f"  shape range ({at}): min {fmt_time(est.min)}, opt "
                  f"{fmt_time(est.opt)}, max {fmt_time(est.max)}")
        mix = ", ".join(f"{k} {v}" for k, v in s.bottleneck_mix.items())
        print(f"  bottlenecks (kernels): {mix}")
        for n in s.costliest_nodes[:5]:
            print(f"  {n.share:6.1%}  {fmt_time(n.est_time_s):>10}  "
                  f"{n.kernel_class:<13} {n.name}")
        for line in split_lines(p):
            print(line)
    for path in written:
        print(f"wrote {path}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the subcommand on the CLI's subparsers."""
    pp = sub.add_parser("plan", help="analyze and cost a model on a target")
    pp.add_argument("model", help="an .onnx file, or file.py:function returning "
                                  "(module, example_inputs)")
    pp.add_argument("--target", default=DEFAULT_TARGET,
                    help="target name, or several separated by commas (see `graphopt targets`)")
    add_no_calibrate(pp)
    add_dynamic(pp)
    add_devices(pp)
    add_reports(pp)
    pp.set_defaults(func=_cmd_plan)
