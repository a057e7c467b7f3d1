"""``graphopt cost KIND DIMS...``: the CLI face of :func:`graphopt.cost.estimate_op`."""

from __future__ import annotations

import argparse
import json

from graphopt.cli.args import add_no_calibrate, cli_target
from graphopt.cost.whatif import KINDS, estimate_op
from graphopt.errors import GraphoptError
from graphopt.hardware.registry import DEFAULT_TARGET
from graphopt.report.format import fmt_seconds

__all__ = ["add_parser"]


def _cmd_cost(args: argparse.Namespace) -> int:
    _, required, optional = KINDS[args.kind]
    order, dims = list(required + optional), {}
    for i, item in enumerate(args.dims):
        key, eq, value = item.rpartition("=")
        key = key if eq else (order[i] if i < len(order) else f"#{i + 1}")
        if key in dims:  # gemm 64 M=128 ...: which M was meant?
            raise GraphoptError(f"{args.kind} dim {key} is given twice ({dims[key]} and "
                                f"{value})", f"give each of {' '.join(order)} once")
        try:
            dims[key] = int(value)
        except ValueError:
            raise GraphoptError(f"{args.kind} dim {item!r} is not an integer",
                                f"give sizes in order ({' '.join(order)}) or as name=value"
                                ) from None
    e = estimate_op(args.kind, dtype=args.dtype, target=cli_target(args), **dims)
    if args.json:
        print(json.dumps(e.to_dict(), indent=1))
        return 0
    shown = ", ".join(f"{k}={v}" for k, v in e.dims.items())
    print(f"{args.kind} ({shown}) in {e.dtype} on {e.target}: {fmt_seconds(e.time_s)}, "
          f"{e.bound}-bound, on {e.kernel}")
    print(f"  {e.flops / 1e9:.4g} GFLOP, {e.bytes / 1e6:.4g} MB ({e.kernel_class})")
    print(f"  {e.reason}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    pc = sub.add_parser("cost", help="what one op costs on a target (the planner's own model)",
                        epilog="dims in order: " + "; ".join(
                            f"{k}: {' '.join(r)} [{' '.join(o)}]" for k, (_, r, o) in
                            KINDS.items()) + ". Or name=value, e.g. causal=1.")
    pc.add_argument("kind", choices=list(KINDS))
    pc.add_argument("dims", nargs="+", help="sizes in order, or name=value")
    pc.add_argument("--dtype", default="bf16",
                    help="fp32 | tf32 | bf16 | fp16 | fp8 | int8 (default bf16)")
    pc.add_argument("--target", default=DEFAULT_TARGET, help="target name (see `graphopt targets`)")
    add_no_calibrate(pc)
    pc.add_argument("--json", action="store_true", help="print JSON")
    pc.set_defaults(func=_cmd_cost)
