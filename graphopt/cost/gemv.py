"""Memory-bound GEMVs that cannot occupy every SM: few outputs, a huge K, no split-K.

A GEMV streams its weight once, so its time is bytes / bandwidth, but only if enough SMs stream
at once: an SM draws about its own share of DRAM bandwidth (the requests it can keep in flight),
so a kernel that occupies ``s`` of ``S`` SMs streams at ``s / S`` of the bandwidth. The CTAs of
a GEMV are blocks of output rows (``_ROWS_PER_CTA``, the smallest CTA tile edge of
``roofline._TILES``), times the slices of K it is split into.

Integer (int8 -> int32) GEMVs are not split along K: DeepBench's T4 int8 GEMVs (cuBLAS, CUDA
10.1, baidu-research/DeepBench ``results/inference/DeepBench_NV_T4.xlsx``) with 512 and 1024
outputs and K = 500,000 stream at 68 and 118 GB/s (21% and 37% of 320 GB/s), in proportion to
their 8 and 16 row blocks on 40 SMs, while those with 3072-8448 outputs (>= 48 blocks) reach
the full rate. Floating-point GEMVs keep the split-K of ``roofline._utilization`` (cuBLAS's
gemv and split-K GEMM kernels), which fills the SMs whenever K is deep, so they are not limited
here. Inferred from those measurements, not from a kernel listing: a fitted structural rule,
not a per-point factor.
"""

from __future__ import annotations

import math

from graphopt.analysis.kernel_class import KernelClass
from graphopt.analysis.record import NodeAnalysis
from graphopt.hardware.profile import HardwareProfile

__all__ = ["memory_parallelism"]

_ROWS_PER_CTA = 64
_UNSPLIT = frozenset({"int8", "int4"})  # peak keys whose GEMVs are not split along K


def memory_parallelism(a: NodeAnalysis, profile: HardwareProfile, key: str
                       ) -> tuple[float, str]:
    """(fraction of the bandwidth GEMV ``a`` can draw, why); 1.0 when it fills the SMs."""
    if a.kernel_class is not KernelClass.GEMV or not profile.is_gpu or not profile.sm_count \
            or key not in _UNSPLIT:
        return 1.0, ""
    d = a.dims
    rows = max(d.get("N", 1), d.get("M", 1))  # the long side of a vector product: its outputs
    ctas = math.ceil(rows / _ROWS_PER_CTA) * max(1, d.get("batch", 1))
    if ctas >= profile.sm_count:
        return 1.0, ""
    frac = ctas / profile.sm_count
    return frac, (f"{key} GEMV without split-K: {ctas} blocks of {_ROWS_PER_CTA} outputs stream "
                  f"on {ctas} of {profile.sm_count} SMs ({frac:.0%} of the bandwidth)")
