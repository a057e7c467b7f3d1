"""The ``graphopt`` command line: plan, lint, optimize, targets, detect.

Errors a user can fix print as one message with the fix and exit with status 2; no tracebacks.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any

from graphopt.errors import GraphoptError, UserCodeExit
from graphopt.files.inputs import input_files
from graphopt.files.outputs import OutputSet
from graphopt.hardware.registry import DEFAULT_TARGET
from graphopt.ir.options import CHOICES, Options

__all__ = ["main"]


# C0 controls but tab and newline, DEL, and C1 controls: a node or file name holding ESC [...
# would otherwise move the cursor, recolour or retitle the user's terminal when printed
_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))
            if c not in (0x09, 0x0A)}


def terminal_safe(text: str) -> str:
    """``text`` with its control characters written as ``\\xNN`` escapes."""
    return text.translate(_CONTROL)


class _SafeStream:
    """A text stream that escapes control characters in everything written to it: names come
    from models and files, which a hostile one fills with terminal escape sequences."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return self._stream.write(terminal_safe(text))

    def __getattr__(self, name: str) -> Any:  # flush, fileno, isatty, encoding...
        return getattr(self._stream, name)


class _SafeFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return terminal_safe(super().format(record))


def _fmt_time(s: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s * 1e9:.3g} ns"


def _cmd_plan(args: argparse.Namespace) -> int:
    from graphopt.api.planning import plan
    from graphopt.cli.dynamic_spec import parse_dynamic
    from graphopt.frontends.python_spec import is_python_spec
    from graphopt.ir.plan import PlanSet

    outputs = OutputSet(input_files(args.model))
    outputs.claim_each((args.json, args.md, args.html), "report")  # before the work
    dynamic = parse_dynamic(args.dynamic, is_python_spec(args.model))
    result = plan(args.model, target=args.target, devices=args.devices, strategy=args.strategy,
                  dynamic_shapes=dynamic)
    result.stage_reports(outputs, json=args.json, md=args.md, html=args.html)
    written = outputs.commit()
    plans = result.plans if isinstance(result, PlanSet) else (result,)
    for p in plans:
        s = p.summary
        fused = s.get("est_latency_fused_s")
        print(f"{p.model['name']} ({p.model['source']}, {s['node_count']} nodes) on "
              f"{p.target.display_name}: estimated {_fmt_time(s['est_latency_s'])}"
              + (f" unfused, {_fmt_time(fused)} fused" if fused is not None else ""))
        rng = p.extra.get("shape_range")
        if rng:
            est = rng["est_latency_s"]
            at = ", ".join(f"{d['name']} {d['min']}/{d['opt']}/{d['max'] or 'inf'}"
                           for d in rng["dims"])
            print(f"  shape range ({at}): min {_fmt_time(est['min'])}, opt "
                  f"{_fmt_time(est['opt'])}, max {_fmt_time(est['max'])}")
        mix = ", ".join(f"{k} {v}" for k, v in s["bottleneck_mix"].items())
        print(f"  bottlenecks (kernels): {mix}")
        for n in s["costliest_nodes"][:5]:
            print(f"  {n['share']:6.1%}  {_fmt_time(n['est_time_s']):>10}  "
                  f"{n['kernel_class']:<13} {n['name']}")
    for w in plans[0].warnings:
        print(f"  warning: {w}")
    for path in written:
        print(f"wrote {path}")
    return 0


def _cmd_lint(args: argparse.Namespace) -> int:
    from graphopt.api.planning import plan
    from graphopt.decisions.lint import lint
    from graphopt.hardware.registry import resolve_targets
    from graphopt.ir.plan import PlanSet

    targets = resolve_targets(args.target)
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


def _cmd_optimize(args: argparse.Namespace) -> int:
    from graphopt.api.planning import with_partition
    from graphopt.backends.onnx.guard import snr_text
    from graphopt.backends.onnx.pipeline import optimize_onnx
    from graphopt.backends.onnx.save import claim_onnx, stage_onnx
    from graphopt.cli.dynamic_spec import parse_dynamic
    from graphopt.frontends.python_spec import is_python_spec, load_python_spec
    from graphopt.hardware.registry import resolve_targets

    targets = resolve_targets(args.target)
    if len(targets) > 1:
        raise GraphoptError("optimize writes one model for one target",
                            "give one --target (run optimize once per target)")
    options = Options(precision=args.precision, pad=args.pad, layout=args.layout,
                          quantize=args.quantize, tolerance=args.tolerance, measure=args.measure)
    outputs = OutputSet(input_files(args.model, args.calibration))
    if str(args.output).endswith(".pt2"):  # the torch-optimized module, graphopt.load reads it
        return _optimize_pt2(args, targets[0], options, outputs)
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
    proto, plan, info = optimize_onnx(model, targets[0], options, args.calibration,
                                      samples=samples, dynamic_shapes=dynamic)
    plan = with_partition(plan, args.devices, args.strategy)
    stage_onnx(outputs, proto, args.output, info["session"])
    plan.stage_reports(outputs, json=args.json, md=args.md, html=args.html)
    written = outputs.commit()
    for warning in info.get("warnings", ()):
        print(terminal_safe(f"graphopt: warning: {warning}"), file=sys.stderr)
    applied = ", ".join(info["passes_applied"]) or "none"
    print(f"{plan.model['name']} on {plan.target.display_name}: passes applied: {applied}")
    print(f"  precision: {info['precision_choice']['reason']}")
    for r in info["passes_reverted"]:
        print(f"  reverted {r['pass']}: {r['reason']}")
    for g in info["guard"]:
        if g["rounds"]:
            print(f"  guard {g['pass']}: {g['reason']} ({g['rounds']} round(s))")
        for f in g["fallbacks"]:
            print(f"    kept {f['node']} in higher precision: {f['reason'][:160]}")
    tol = info["tolerance"]
    print(f"  numerics vs the original in ONNX Runtime on {info['samples']} batch(es) "
          f"(tolerance {tol['rel_to_scale']:g} of scale, cosine >= {tol['min_cosine']}):")
    for n in info["numerics"]:
        print(f"    {n['output']}: max abs {n['max_abs']:.3g}, max rel {n['max_rel']:.3g}, "
              f"cosine {n['cosine']:.6f}, {snr_text(n['snr_db'])}, "
              f"{'within' if n['within'] else 'OUT OF'} tolerance")
    layout = info["session"]["reasons"].get("layout")
    if layout:
        print(f"  layout: {layout}")
    for path_written in written:
        print(f"wrote {path_written}")
    return 0 if all(n["within"] for n in info["numerics"]) else 1


def _torch_range(module: Any, inputs: Any, dynamic: Any) -> Any:
    """The shape range torch.export finds for ``dynamic`` (None without one)."""
    if not dynamic:
        return None
    from graphopt.frontends.torch_frontend import trace_torch

    return trace_torch(module, inputs, dynamic_shapes=dynamic).shape_range


def _optimize_pt2(args: argparse.Namespace, target: Any, options: Options,
                  outputs: OutputSet) -> int:
    """``-o OUT.pt2``: run the torch pipeline on a ``file.py:function`` model and save it."""
    from graphopt.api.optimized import optimize
    from graphopt.api.planning import with_partition
    from graphopt.backends.torch.saved import stage
    from graphopt.frontends.python_spec import is_python_spec, load_python_spec

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
    opt = optimize(module, inputs, target, precision=options.precision, pad=options.pad,
                   layout=options.layout, quantize=options.quantize, measure=options.measure,
                   tolerance=options.tolerance, dynamic_shapes=dynamic)
    stage(opt, outputs, args.output)
    plan = with_partition(opt.plan, args.devices, args.strategy)
    plan.stage_reports(outputs, json=args.json, md=args.md, html=args.html)
    written = outputs.commit()
    info = opt.info
    print(f"{plan.model['name']} on {plan.target.display_name}: passes applied: "
          f"{', '.join(info['passes_applied']) or 'none'}")
    for r in info["passes_reverted"]:
        print(f"  reverted {r['pass']}: {r['reason']}")
    if opt.shape_range:
        print(f"  shape range: {opt.shape_range.describe()}")
    for n in info["numerics"]:
        print(f"  output {n['output']}: max abs {n['max_abs']:.3g}, max rel {n['max_rel']:.3g}, "
              f"cosine {n['cosine']:.6f}, {'within' if n['within'] else 'OUT OF'} tolerance")
    for path_written in written:
        print(f"wrote {path_written}")
    return 0 if all(n["within"] for n in info["numerics"]) else 1


def _cmd_targets(args: argparse.Namespace) -> int:
    from graphopt.hardware import list_targets

    targets = list_targets()
    if args.json:
        fields = ("name", "compute_capability", "generation", "sm_count", "memory_bytes",
                  "bandwidth_bytes_per_s", "peak_flops")
        rows: list[dict[str, Any]] = []
        for t in targets:
            d = t.to_dict()
            rows.append({k: d[k] for k in fields} | {k: v for k, v in d.items()
                                                     if k not in fields})
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'name':<14} {'generation':<16} {'cc':<5} {'SMs/cores':>9} {'memory':>9} "
          f"{'bandwidth':>11} {'bf16/fp16 peak':>15}")
    for t in targets:
        cc = "" if t.compute_capability is None else "{}.{}".format(*t.compute_capability)
        units = t.sm_count or t.cores or 0
        peak = t.peak_flops.get("bf16") or t.peak_flops.get("fp16") or t.peak_flops.get("fp32", 0)
        print(f"{t.name:<14} {t.generation:<16} {cc:<5} {units:>9} "
              f"{t.memory_bytes / 2**30:>6.0f} GiB {t.bandwidth_bytes_per_s / 1e9:>7.0f} GB/s "
              f"{peak / 1e12:>10.1f} TFLOP/s")
    return 0


def _cmd_detect(args: argparse.Namespace) -> int:
    from graphopt.hardware.detect import detect_report

    print(json.dumps(detect_report(), indent=1, sort_keys=True))
    return 0


def _add_reports(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", metavar="F", help="write the JSON plan report to F")
    p.add_argument("--md", metavar="F", help="write the Markdown summary to F")
    p.add_argument("--html", metavar="F", help="write the HTML report to F")


def _add_dynamic(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dynamic", action="append", metavar="RANGE",
                   help="a shape range: NAME=OPT or NAME=MIN:OPT:MAX for an ONNX model's "
                        "symbolic dim; INPUT.AXIS=NAME:MIN:MAX for a file.py:function model "
                        "(e.g. x.0=batch:1:64; the example is the opt point); repeat or "
                        "separate with commas")


def _add_devices(p: argparse.ArgumentParser) -> None:
    p.add_argument("--devices", metavar="SPEC",
                   help="split across devices, e.g. cuda:0=h100,cuda:1=a100:40GB,cpu:8GB "
                        "(NAME[=TARGET][:MEMORY CAP][@HOST], net=400Gb/s between hosts); "
                        "the report says where each op runs")
    p.add_argument("--strategy", default="heft", choices=("heft", "pipeline", "tensor", "auto"),
                   help="heft: list scheduling over the DAG; pipeline: contiguous stages; "
                        "tensor: tensor parallelism over every device; auto: compare them "
                        "(and tensor parallel per NVLink group with pipeline stages across "
                        "groups), pick by latency")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="graphopt", description="Plan and optimize ML models.")
    p.add_argument("-v", "--verbose", action="store_true", help="log what each pass does")
    sub = p.add_subparsers(dest="command", required=True)
    pp = sub.add_parser("plan", help="analyze and cost a model on a target")
    pp.add_argument("model", help="an .onnx file, or file.py:function returning "
                                  "(module, example_inputs)")
    pp.add_argument("--target", default=DEFAULT_TARGET,
                    help="target name, or several separated by commas (see `graphopt targets`)")
    _add_dynamic(pp)
    _add_devices(pp)
    _add_reports(pp)
    pp.set_defaults(func=_cmd_plan)
    pl = sub.add_parser("lint", help="list tensor-core compliance issues and their fixes")
    pl.add_argument("model", help="an .onnx file, or file.py:function")
    pl.add_argument("--target", default=DEFAULT_TARGET, help="target name (see `graphopt targets`)")
    pl.add_argument("--json", action="store_true", help="print JSON")
    pl.set_defaults(func=_cmd_lint)
    po = sub.add_parser("optimize", help="optimize a model for a target and write it as ONNX "
                                            "(or, with -o OUT.pt2, a saved torch module)")
    po.add_argument("model", help="an .onnx file, or file.py:function returning "
                                  "(module, example_inputs) (exported to ONNX first)")
    po.add_argument("-o", "--output", required=True, metavar="OUT.onnx",
                    help="the optimized model; its session config goes beside it as "
                         "OUT.graphopt.json (graphopt.ort_session loads both); OUT.pt2 "
                         "instead saves the torch-optimized module of a file.py:function "
                         "model (graphopt.load reads it)")
    po.add_argument("--target", default=DEFAULT_TARGET, help="target name (see `graphopt targets`)")
    for option, choices in CHOICES.items():  # graphopt.ir.options: one table for every backend
        po.add_argument(f"--{option}", default="auto", choices=choices)
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
    _add_dynamic(po)
    _add_devices(po)
    _add_reports(po)
    po.set_defaults(func=_cmd_optimize)
    from graphopt.cli.cost import add_parser as add_cost
    from graphopt.cli.llm import add_parser as add_llm

    add_llm(sub, _add_reports)
    add_cost(sub)
    from graphopt.cli.profile import add_parser as add_profile

    add_profile(sub, _add_reports)
    from graphopt.cli.calibrate import add_parser as add_calibrate

    add_calibrate(sub)
    pt = sub.add_parser("targets", help="list the hardware targets")
    pt.add_argument("--json", action="store_true", help="print JSON")
    pt.set_defaults(func=_cmd_targets)
    pd = sub.add_parser("detect", help="describe this machine's CPU and GPUs")
    pd.set_defaults(func=_cmd_detect)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler = logging.StreamHandler()
    handler.setFormatter(_SafeFormatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        handlers=[handler])
    stdout = sys.stdout
    sys.stdout = _SafeStream(stdout)  # every report line names nodes and files
    try:
        return _run(args)
    finally:
        sys.stdout = stdout


def _run(args: argparse.Namespace) -> int:
    """The command, with every way it can end turned into an exit status and a message."""
    try:
        code = args.func(args)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # the reader (``| head``) has gone: exit quietly, as cat or grep do; point stdout at
        # devnull so the interpreter's final flush does not raise again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, the shell's status for a process ended by a closed pipe
    except GraphoptError as e:
        return _run_error(e)
    except SystemExit as e:  # user code graphopt ran outside a user_code() guard
        return _run_error(UserCodeExit(f"the model's code called sys.exit({e.code!r}); "
                                       "graphopt stopped without writing anything",
                                       "remove the sys.exit call (return instead)"))
    except KeyboardInterrupt:
        print("graphopt: interrupted; nothing was written", file=sys.stderr)
        return 130


def _run_error(e: GraphoptError) -> int:
    print(terminal_safe(f"graphopt: error: {e.problem}"), file=sys.stderr)
    if e.fix:
        print(terminal_safe(f"  fix: {e.fix}"), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
