"""``graphopt targets`` (the hardware database) and ``graphopt detect`` (this machine)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from graphopt.hardware import list_targets
from graphopt.hardware.detect import detect_report
from graphopt.hardware.registry import aliases_of

__all__ = ["add_parser"]


def _cmd_targets(args: argparse.Namespace) -> int:
    targets = list_targets()
    if args.json:
        fields = ("name", "compute_capability", "generation", "sm_count", "memory_bytes",
                  "bandwidth_bytes_per_s", "peak_flops")
        rows: list[dict[str, Any]] = []
        for t in targets:
            d = t.to_dict()
            rows.append({k: d[k] for k in fields} | {"aliases": aliases_of(t.name)}
                        | {k: v for k, v in d.items() if k not in fields})
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'name':<14} {'generation':<16} {'cc':<5} {'SMs/cores':>9} {'memory':>9} "
          f"{'bandwidth':>11} {'bf16/fp16 peak':>15}  also accepted as")
    for t in targets:
        cc = "" if t.compute_capability is None else "{}.{}".format(*t.compute_capability)
        units = t.sm_count or t.cores or 0
        peak = t.peak_flops.get("bf16") or t.peak_flops.get("fp16") or t.peak_flops.get("fp32", 0)
        print(f"{t.name:<14} {t.generation:<16} {cc:<5} {units:>9} "
              f"{t.memory_bytes / 2**30:>6.0f} GiB {t.bandwidth_bytes_per_s / 1e9:>7.0f} GB/s "
              f"{peak / 1e12:>10.1f} TFLOP/s  {', '.join(aliases_of(t.name))}".rstrip())
    return 0


def _cmd_detect(args: argparse.Namespace) -> int:
    print(json.dumps(detect_report(), indent=1, sort_keys=True))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``targets`` and ``detect`` on the CLI's subparsers."""
    pt = sub.add_parser("targets", help="list the hardware targets")
    pt.add_argument("--json", action="store_true", help="print JSON")
    pt.set_defaults(func=_cmd_targets)
    pd = sub.add_parser("detect", help="describe this machine's CPU and GPUs")
    pd.set_defaults(func=_cmd_detect)
