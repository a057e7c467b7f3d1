"""The hardware database: datasheet profiles of GPUs and CPUs, the host, and name lookup.

``profile`` defines the record, ``generations`` what a CUDA compute capability can do,
``gpus``/``cpus`` the tables, ``detect`` this machine, ``registry`` the names.
"""

from __future__ import annotations

from graphopt.hardware.detect import detect_report, host_cpu_profile
from graphopt.hardware.generations import (
    capabilities_for,
    family_for,
    generation_for,
    smem_per_sm_bytes,
)
from graphopt.hardware.profile import HardwareProfile, Link
from graphopt.hardware.registry import get_target, is_this_machine, list_targets, target_names

__all__ = [
    "HardwareProfile",
    "Link",
    "capabilities_for",
    "detect_report",
    "family_for",
    "generation_for",
    "get_target",
    "host_cpu_profile",
    "is_this_machine",
    "list_targets",
    "smem_per_sm_bytes",
    "target_names",
]
