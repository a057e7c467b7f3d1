"""Options several subcommands share: the reports, shape ranges, devices and the host's
calibration."""

from __future__ import annotations

import argparse
from typing import Any

from graphopt.hardware.registry import resolve_targets
from graphopt.measure.host_cache import host_target

__all__ = ["add_devices", "add_dynamic", "add_no_calibrate", "add_reports", "cli_target",
           "fmt_time"]


def add_no_calibrate(p: argparse.ArgumentParser) -> None:
    """``--no-calibrate``, beside every ``--target``: plan ``cpu`` uncalibrated."""
    p.add_argument("--no-calibrate", action="store_true",
                   help="with --target cpu, use the uncalibrated host profile instead of "
                        "this CPU's cached calibration (made on first use, about 10 s; "
                        "GRAPHOPT_NO_CALIBRATE=1 does the same)")


def cli_target(args: argparse.Namespace, threads: int | None = None) -> list[Any]:
    """``--target`` as profiles, ``cpu``/``host`` as this CPU's cached calibration
    (``measure.host_cache.host_target``) unless ``--no-calibrate``: resolved here, once, so
    the API the command calls takes them as given."""
    return resolve_targets(host_target(args.target, threads=threads,
                                       calibrate=False if args.no_calibrate else None))


def add_reports(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", metavar="F", help="write the JSON plan report to F")
    p.add_argument("--md", metavar="F", help="write the Markdown summary to F")
    p.add_argument("--html", metavar="F", help="write the HTML report to F")


def add_dynamic(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dynamic", action="append", metavar="RANGE",
                   help="a shape range: NAME=OPT or NAME=MIN:OPT:MAX for an ONNX model's "
                        "symbolic dim; INPUT.AXIS=NAME:MIN:MAX for a file.py:function model "
                        "(e.g. x.0=batch:1:64; the example is the opt point); repeat or "
                        "separate with commas")


def add_devices(p: argparse.ArgumentParser) -> None:
    p.add_argument("--devices", metavar="SPEC",
                   help="split across devices, e.g. cuda:0=h100,cuda:1=a100:40GB,cpu:8GB "
                        "(NAME[=TARGET][:MEMORY CAP][@HOST], net=400Gb/s between hosts); "
                        "the report says where each op runs")
    p.add_argument("--strategy", default="heft", choices=("heft", "pipeline", "tensor", "auto"),
                   help="heft: list scheduling over the DAG; pipeline: contiguous stages; "
                        "tensor: tensor parallelism over every device; auto: compare them "
                        "(and tensor parallel per NVLink group with pipeline stages across "
                        "groups), pick by latency")


def fmt_time(s: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s * 1e9:.3g} ns"
