"""``graphopt optimize``: write the optimized ONNX model with its session config, or with
``-o OUT.pt2`` the torch-optimized module of a ``file.py:function`` model."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, cast

from graphopt.api.deploy_folder import (
    ARTIFACT_SUFFIXES,
    claim_deploy,
    is_deploy_folder,
    stage_deploy,
)
from graphopt.api.optimized import optimize
from graphopt.api.planning import with_partition
from graphopt.backends.onnx.guard import snr_text
from graphopt.backends.onnx.pipeline import optimize_onnx
from graphopt.backends.onnx.result import OnnxResult
from graphopt.backends.onnx.save import claim_onnx, stage_onnx
from graphopt.cli.args import add_devices, add_dynamic, add_no_calibrate, add_reports, cli_target
from graphopt.cli.dynamic_spec import parse_dynamic
from graphopt.cli.terminal import terminal_safe
from graphopt.errors import GraphoptError
from graphopt.files.inputs import input_files
from graphopt.files.outputs import OutputSet
from graphopt.frontends.python_spec import is_python_spec, load_python_spec
from graphopt.hardware.registry import DEFAULT_TARGET
from graphopt.ir.options import CHOICES, Options
from graphopt.ir.plan_run import OnnxOptimization
from graphopt.report.deploy import deploy_summary

__all__ = ["add_parser"]


def _cmd_optimize(args: argparse.Namespace) -> int:
    targets = cli_target(args)
    if len(targets) > 1:
        raise GraphoptError("optimize writes one model for one target",
                            "give one --target (run optimize once per target)")
    options = Options(precision=args.precision, pad=args.pad, layout=args.layout,
                          quantize=args.quantize, tolerance=args.tolerance, measure=args.measure)
    _check_output(args.output)
    with OutputSet(input_files(args.model, args.calibration)) as outputs:  # temp files go on
        if is_deploy_folder(args.output):  # the artifact to deploy, measured, with deploy.json
            return _optimize_folder(args, targets[0], options, outputs)
        if str(args.output).endswith(".pt2"):  # the torch-optimized module (graphopt.load)
            return _optimize_pt2(args, targets[0], options, outputs)
        return _optimize_onnx(args, targets[0], options, outputs)


def _check_output(output: str) -> None:
    """``-o``: never empty (the current folder), never an existing folder named like a file."""
    if not output:
        raise GraphoptError("-o is empty: graphopt never writes into the current folder "
                            "unasked", "give -o OUT.onnx, -o OUT.pt2 or -o DIR/ (a folder)")
    suffix = Path(output).suffix
    if suffix in ARTIFACT_SUFFIXES and Path(output).is_dir() and \
            not output.endswith(("/", os.sep)):
        raise GraphoptError(f"-o {output} is an existing folder, and its {suffix} suffix asks "
                            f"for a model file", f"write -o {output}/ (a trailing slash) for a "
                            "deploy folder in it, or give another file path")


def _optimize_onnx(args: argparse.Namespace, target: Any, options: Options,
                   outputs: OutputSet) -> int:
    """``-o OUT.onnx``: the optimized ONNX model with its session config."""
    claim_onnx(outputs, args.output)  # refuse a bad path before the work, not after
    outputs.claim_each((args.json, args.md, args.html), "report")
    model: Any = args.model
    samples = None
    dynamic = parse_dynamic(args.dynamic, is_python_spec(args.model))
    if is_python_spec(args.model):
        from graphopt.frontends.onnx_export import export_torch

        module, inputs, built = load_python_spec(args.model)
        dynamic = dynamic or built
        exported = export_torch(module, inputs, shape_range=_torch_range(module, inputs, dynamic))
        how = ("the TorchScript exporter" if exported.exporter == "legacy" else
               f"torch.onnx.export(dynamo=True) ({exported.fallback_reason})")
        print(f"exported {type(module).__name__} with {how} in {exported.seconds:.1f} s "
              f"({len(exported.model.graph.node)} nodes)")
        model, samples, dynamic = exported.model, [exported.feeds], exported.dim_sizes
        done = optimize_onnx(model, target, options, args.calibration, samples=samples,
                             dynamic_shapes=dynamic)
    else:  # the API's own call, so the report is graphopt.optimize's (its deploy choice too)
        opt = optimize(model, None, target, calibration=args.calibration,
                       dynamic_shapes=dynamic, **_optimize_kwargs(options))
        run = cast(OnnxOptimization, opt.info)  # an ONNX input: the ONNX backend's run
        done = OnnxResult(opt.onnx_model, opt.plan, run, opt.onnx_session, run.warnings)
    info = done.report
    plan = with_partition(done.plan, args.devices, args.strategy)
    stage_onnx(outputs, done.model, args.output, done.session)
    plan.stage_reports(outputs, json=args.json, md=args.md, html=args.html)
    written = outputs.commit()
    for warning in done.warnings:
        print(terminal_safe(f"graphopt: warning: {warning}"), file=sys.stderr)
    applied = ", ".join(info.passes_applied) or "none"
    print(f"{plan.model.name} on {plan.target.display_name}: passes applied: {applied}")
    print(f"  precision: {info.precision_choice.reason}")
    for r in info.passes_reverted:
        print(f"  reverted {r.name}: {r.reason}")
    for g in info.guard:
        if g.rounds:
            print(f"  guard {g.name}: {g.reason} ({g.rounds} round(s))")
        for f in g.fallbacks:
            print(f"    kept {f.node} in higher precision: {f.reason[:160]}")
    tol = info.tolerance
    print(f"  numerics vs the original in ONNX Runtime on {info.samples} batch(es) "
          f"(tolerance {tol.rel_to_scale:g} of scale, cosine >= {tol.min_cosine}):")
    for n in info.numerics:  # the report writes a non-finite number as "inf"
        print(f"    {n.output}: max abs {float(n.max_abs):.3g}, max rel {float(n.max_rel):.3g}, "
              f"cosine {float(n.cosine):.6f}, {snr_text(float(n.snr_db or 0))}, "
              f"{'within' if n.within else 'OUT OF'} tolerance")
    layout = done.session.reasons.get("layout")
    if layout:
        print(f"  layout: {layout}")
    for path_written in written:
        print(f"wrote {path_written}")
    return 0 if done.within_tolerance else 1


def _torch_range(module: Any, inputs: Any, dynamic: Any) -> Any:
    """The shape range torch.export finds for ``dynamic`` (None without one)."""
    if not dynamic:
        return None
    from graphopt.frontends.torch_frontend import trace_torch

    return trace_torch(module, inputs, dynamic_shapes=dynamic).shape_range


def _optimize_pt2(args: argparse.Namespace, target: Any, options: Options,
                  outputs: OutputSet) -> int:
    """``-o OUT.pt2``: run the torch pipeline on a ``file.py:function`` model and save it."""
    from graphopt.backends.torch.saved import stage

    if not is_python_spec(args.model):
        raise GraphoptError(f"-o {args.output} saves a torch module, but {args.model} is not a "
                            "file.py:function torch model",
                            "give file.py:function, or write an ONNX model with -o OUT.onnx")
    if args.calibration:
        raise GraphoptError("--calibration feeds ONNX Runtime's quantizers",
                            "leave it out for -o OUT.pt2, or write -o OUT.onnx")
    outputs.claim(args.output, "saved model")  # refuse a bad path before the work
    outputs.claim_each((args.json, args.md, args.html), "report")
    module, inputs, dynamic = load_python_spec(args.model)
    opt = optimize(module, inputs, target, dynamic_shapes=dynamic, **_optimize_kwargs(options))
    stage(opt, outputs, args.output)
    plan = with_partition(opt.plan, args.devices, args.strategy)
    plan.stage_reports(outputs, json=args.json, md=args.md, html=args.html)
    written = outputs.commit()
    info = opt.info
    print(f"{plan.model.name} on {plan.target.display_name}: passes applied: "
          f"{', '.join(info.passes_applied) or 'none'}")
    for r in info.passes_reverted:
        print(f"  reverted {r.name}: {r.reason}")
    if opt.shape_range:
        print(f"  shape range: {opt.shape_range.describe()}")
    for n in info.numerics:
        print(f"  output {n.output}: max abs {float(n.max_abs):.3g}, "
              f"max rel {float(n.max_rel):.3g}, cosine {float(n.cosine):.6f}, "
              f"{'within' if n.within else 'OUT OF'} tolerance")
    _print_deploy(opt.deploy)
    for path_written in written:
        print(f"wrote {path_written}")
    return 0 if all(n.within for n in info.numerics) else 1


def _optimize_kwargs(options: Options) -> dict[str, Any]:
    """``graphopt.optimize``'s keyword options from the CLI's ``Options``."""
    return {"precision": options.precision, "pad": options.pad, "layout": options.layout,
            "quantize": options.quantize, "measure": options.measure,
            "tolerance": options.tolerance}


def _print_deploy(choice: Any, folder: bool = False) -> None:
    """The deploy line (``report/deploy.deploy_summary``) and each candidate's time."""
    print(terminal_safe(f"  {deploy_summary(choice)}"))
    d = choice.to_json()
    for c in d["candidates"]:
        said = (f"{c['seconds'] * 1e3:.3g} ms" if c["seconds"] else "no time") + \
            ("" if c["within"] is not False else ", OUT of tolerance")
        print(terminal_safe(f"    {c['artifact']}: {said}; {c['error'] or c['note']}"[:240]))
    if not folder and choice.artifact != "torch":
        print("  write the recommended artifact with -o DIR/ (a folder)")


def _optimize_folder(args: argparse.Namespace, target: Any, options: Options,
                     outputs: OutputSet) -> int:
    """``-o DIR/``: optimize (a torch model: measuring its artifacts on this CPU), then write
    the recommended artifact with ``deploy.json`` (``api/deploy_folder.py``)."""
    claim_deploy(outputs, args.output)  # a bad folder, a report on the artifact: before work
    outputs.claim_each((args.json, args.md, args.html), "report")
    kwargs = _optimize_kwargs(options)
    if is_python_spec(args.model):
        if args.calibration:
            raise GraphoptError("--calibration feeds ONNX Runtime's quantizers for an .onnx "
                                "input", "leave it out for a file.py:function model")
        module, inputs, built = load_python_spec(args.model)
        opt = optimize(module, inputs, target, dynamic_shapes=parse_dynamic(args.dynamic, True)
                       or built, **kwargs)
    else:
        dynamic = parse_dynamic(args.dynamic, False)
        opt = optimize(args.model, None, target, calibration=args.calibration,
                       dynamic_shapes=dynamic, **kwargs)
    stage_deploy(opt, outputs, args.output)
    plan = with_partition(opt.plan, args.devices, args.strategy)
    plan.stage_reports(outputs, json=args.json, md=args.md, html=args.html)
    written = outputs.commit()
    print(f"{plan.model.name} on {plan.target.display_name}: passes applied: "
          f"{', '.join(opt.info.passes_applied) or 'none'}")
    _print_deploy(opt.deploy, folder=True)
    for path_written in written:
        print(f"wrote {path_written}")
    row = opt.deploy.row(opt.deploy.artifact)
    return 0 if row is None or row.within is not False else 1


#: what each pass option decides (auto: graphopt decides per node, by cost, within the budget)
_HELP = {"precision": "compute format (auto: by cost per node, fp32 islands kept)",
         "pad": "pad GEMM and conv channels to tensor-core multiples (auto: where it pays)",
         "layout": "channels_last for convs (auto: by region, where the gain beats the "
                   "conversions)",
         "quantize": "weight/activation quantization (auto: per node where it pays and stays "
                     "in budget; int8 = int8_dynamic)"}


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the subcommand on the CLI's subparsers."""
    po = sub.add_parser("optimize", help="optimize a model for a target and write it as ONNX "
                                            "(or, with -o OUT.pt2, a saved torch module)")
    po.add_argument("model", help="an .onnx file, or file.py:function returning "
                                  "(module, example_inputs) (exported to ONNX first)")
    po.add_argument("-o", "--output", required=True, metavar="OUT.onnx",
                    help="the optimized model; its session config goes beside it as "
                         "OUT.graphopt.json (graphopt.ort_session loads both); OUT.pt2 "
                         "instead saves the torch-optimized module of a file.py:function "
                         "model (graphopt.load reads it); DIR/ (a folder; an existing folder "
                         "not named *.onnx or *.pt2 counts as one) writes the artifact "
                         "to deploy (measured on this CPU for --target cpu: the torch module, "
                         "torch.compile of it or ONNX Runtime) with deploy.json "
                         "(graphopt.load(DIR) loads it ready to run)")
    po.add_argument("--target", default=DEFAULT_TARGET, help="target name (see `graphopt targets`)")
    add_no_calibrate(po)
    for option, choices in CHOICES.items():  # graphopt.ir.options: one table for every backend
        po.add_argument(f"--{option}", default="auto", choices=choices, help=_HELP[option])
    po.add_argument("--measure", action=argparse.BooleanOptionalAction, default=None,
                    help="time each auto-decided pass here and revert it if slower (default: "
                         "only when --target is this machine's CPU)")
    po.add_argument("--calibration", metavar="F",
                    help="calibration batches: an .npz with one array per model input (named "
                         "like it, batches along axis 0) or a folder of .npz files, one batch "
                         "each; needed by --quantize int8_static, used by the accuracy guard")
    po.add_argument("--tolerance", type=float, metavar="X",
                    help="accuracy budget: max |ref - out| <= X * max |ref| per output "
                         "(default: the precision's, e.g. 0.01 for fp16)")
    add_dynamic(po)
    add_devices(po)
    add_reports(po)
    po.set_defaults(func=_cmd_optimize)
