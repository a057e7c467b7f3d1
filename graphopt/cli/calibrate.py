"""``graphopt calibrate [-o FILE.json]``: the CLI face of :func:`graphopt.calibrate`."""

from __future__ import annotations

import argparse
import json
import statistics

from graphopt.cost.calibrated import runtime_tables
from graphopt.files.outputs import OutputSet
from graphopt.hardware.detect import host_cpu_profile
from graphopt.measure.calibrate import calibrate_host
from graphopt.report.format import fmt_seconds

__all__ = ["add_parser"]


def _cmd_calibrate(args: argparse.Namespace) -> int:
    OutputSet(()).claim(args.output, "hardware profile")  # a bad path fails before measuring
    guessed = host_cpu_profile()
    profile = calibrate_host(args.output, quick=args.quick, threads=args.threads)
    if args.json:
        print(json.dumps(profile.to_dict(), indent=1))
        return 0
    rates = profile.measured_rates
    print(f"{profile.display_name}: {profile.source}")
    print(f"  memory bandwidth  {rates['memory'] / 1e9:8.1f} GB/s  (the uncalibrated "
          f"estimate: {guessed.bandwidth_bytes_per_s / 1e9:.1f} GB/s)")
    for key in sorted(k for k in rates if k != "memory"):
        unit, _, dtype = key.partition(":")
        ops = "GOP/s" if dtype.startswith("int") else "GFLOP/s"
        peak = profile.peak_flops.get(dtype)
        share = f" ({rates[key] / peak:.0%} of the {peak / 1e9:.0f} {ops} table peak)" \
            if peak else ""
        print(f"  {unit:6} {dtype:10} {rates[key] / 1e9:8.1f} {ops}{share}")
    tables = runtime_tables(profile.op_overhead_s)
    for runtime, costs in (("eager torch", tables["torch"]),
                           ("ONNX Runtime", tables["onnxruntime"]),
                           ("OpenVINO", tables["openvino"])):
        if not costs:
            continue
        slowest = sorted(costs, key=costs.__getitem__, reverse=True)[:4]
        print(f"  fixed cost per node, {runtime}: median "
              f"{fmt_seconds(statistics.median(costs.values()))} over {len(costs)} op types; "
              "highest " + ", ".join(f"{op} {fmt_seconds(costs[op])}" for op in slowest))
    print(f"wrote {args.output}: use it as --target {args.output}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``calibrate`` on the CLI's subparsers."""
    p = sub.add_parser("calibrate", help="measure this machine's CPU (per-op cost, GEMM "
                                         "FLOP/s, bandwidth) and write a profile for --target")
    p.add_argument("-o", "--output", default="cpu-calibrated.json",
                   help="profile file to write (default: cpu-calibrated.json)")
    p.add_argument("--quick", action="store_true", help="about half the time, noisier")
    p.add_argument("--threads", type=int, help="intra-op threads to measure with (default: "
                                               "torch's); use the count the model runs with")
    p.add_argument("--json", action="store_true", help="print the profile as JSON")
    p.set_defaults(func=_cmd_calibrate)
