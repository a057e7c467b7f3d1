"""Run a test as if this machine had another CPU's ISA, so a host-dependent test checks both
outcomes on every machine (``graphopt.hardware.detect.HOST_ISA_ENV``). Only graphopt's view of
the host changes: kernels still run on the real CPU, so numeric bounds must follow the real one.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from graphopt.hardware.detect import HOST_ISA_ENV, detect_cpu, host_cpu_profile
from graphopt.hardware.profile import HardwareProfile
from graphopt.hardware.registry import get_target


def real_host_flags() -> frozenset[str]:
    """The ISA flags of the CPU the test runs on, whatever stand-in is set."""
    return detect_cpu().flags


@contextlib.contextmanager
def host_isa(name: str) -> Iterator[HardwareProfile]:
    """The ``cpu`` target with the ISA of table CPU ``name`` inside the block."""
    old = os.environ.get(HOST_ISA_ENV)
    os.environ[HOST_ISA_ENV] = name
    host_cpu_profile.cache_clear()
    try:
        yield get_target("cpu")
    finally:
        if old is None:
            del os.environ[HOST_ISA_ENV]
        else:
            os.environ[HOST_ISA_ENV] = old
        host_cpu_profile.cache_clear()
