"""``graphopt targets`` (the hardware database) and ``graphopt detect`` (this machine)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from graphopt.hardware import list_targets
from graphopt.hardware.detect import detect_report
from graphopt.hardware.registry import aliases_of

__all__ = ["add_parser", "detect_lines"]


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
    report = detect_report()
    if args.json:
        print(json.dumps(report, indent=1, sort_keys=True))
        return 0
    for line in detect_lines(report):
        print(line)
    return 0


def _gb(nbytes: float | None) -> str:
    return "?" if not nbytes else f"{nbytes / 2**30:.0f} GiB"


def detect_lines(report: dict[str, Any]) -> list[str]:
    """``graphopt detect`` for a person: the CPU, its ISA and the target it plans as, each GPU
    and the profile it maps to (``--json`` prints the full report)."""
    cpu, host = report["cpu"], report["host_profile"]
    caches = ", ".join(f"{k} {v // 1024} KiB" for k, v in sorted(cpu.get("caches", {}).items()))
    peak = max(host["peak_flops"].values(), default=0)
    out = [f"CPU      {cpu['model']} ({cpu['vendor']}, {cpu['arch']}): "
           f"{cpu['physical_cores']} cores / {cpu['logical_cores']} threads, "
           f"{cpu['clock_hz'] / 1e9:.2f} GHz ({cpu['clock_source']}), "
           f"{_gb(cpu['ram_bytes'])} RAM",
           f"ISA      {' '.join(cpu['isa']) or 'none detected'}",
           f"caches   {caches or 'unknown'}",
           f"target   cpu = {host['display_name']} ({host['generation']}): "
           f"{peak / 1e9:.0f} GFLOP/s peak, {host['bandwidth_bytes_per_s'] / 1e9:.0f} GB/s"]
    if not report["gpus"]:
        out.append("GPUs     none usable (no CUDA device, or torch without CUDA)")
    for g in report["gpus"]:
        maps = (f"target {g['profile']}" + (" (estimated: not in the table)"
                                            if g.get("estimated") else "")
                if g.get("profile") else f"no profile: {g.get('error', '?')}")
        out.append(f"GPU {g['index']:<4} {g['name']}: cc {g['compute_capability']}, "
                   f"{g['sm_count']} SMs, {_gb(g['memory_bytes'])}; {maps}")
    return out


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``targets`` and ``detect`` on the CLI's subparsers."""
    pt = sub.add_parser("targets", help="list the hardware targets")
    pt.add_argument("--json", action="store_true", help="print JSON")
    pt.set_defaults(func=_cmd_targets)
    pd = sub.add_parser("detect", help="describe this machine's CPU and GPUs")
    pd.add_argument("--json", action="store_true", help="print the full report as JSON")
    pd.set_defaults(func=_cmd_detect)
