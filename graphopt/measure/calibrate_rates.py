"""The rates a calibrated CPU profile measures: what GEMM and conv nodes reach and what an
elementwise kernel moves (``calibrate`` items 2 and 4).

Each rate is the best of several timed loops: a rate is what the machine can reach, and a
neighbour's work only ever slows a loop down.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

from graphopt.hardware.profile import HardwareProfile

__all__ = ["achievable_rates", "time_call"]

#: seconds per timed loop of a rate: a rate is the best of 5 loops, and loops of 30 ms give
#: the 100 ms loops' numbers within 5% here (fp32 GEMM, conv, bandwidth) in 40% of the time
_RATE_BUDGET_S = 0.03


def time_call(fn: Callable[[], Any], *, budget_s: float = 0.02, repeats: int = 5,
              best: bool = False) -> float:
    """Seconds per call of ``fn``: the median (``best``: the fastest) of ``repeats`` loops,
    each sized to about ``budget_s``, after one warm-up loop (allocator caches, lazy kernel
    set-up). A rate is what the machine can reach: its best loop, since a neighbour's work
    only ever slows one down."""
    fn()
    t0 = time.perf_counter()
    fn()
    once = max(time.perf_counter() - t0, 1e-7)
    loops = max(1, min(100_000, int(budget_s / once)))
    samples = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        for _ in range(loops):
            fn()
        samples.append((time.perf_counter() - t0) / loops)
    return min(samples[1:]) if best else statistics.median(samples[1:])


def achievable_rates(profile: HardwareProfile, quick: bool) -> dict[str, float]:
    """Achievable FLOP/s for GEMM and conv per dtype the CPU runs natively (INT8: the dynamic
    quantized linear graphopt's INT8 pass emits), and the DRAM bytes/s of an elementwise add
    on arrays 8x the last-level cache (at least 64 MiB)."""
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(1)
    out: dict[str, float] = {}
    n = 512 if quick else 1024
    dtypes = {"fp32": torch.float32}
    if "bf16" in profile.peak_flops:  # native bf16 (AMX, AVX512_BF16): oneDNN runs it
        dtypes["bf16"] = torch.bfloat16
    for key, dt in dtypes.items():
        m1 = torch.randn(n, n, generator=g).to(dt)
        m2 = torch.randn(n, n, generator=g).to(dt)
        out[f"matrix:{key}"] = 2 * n**3 / time_call(functools.partial(torch.mm, m1, m2),
                                                     budget_s=_RATE_BUDGET_S, repeats=5, best=True)
    if hasattr(torch.ops.quantized, "linear_dynamic"):  # the kernel graphopt's INT8 pass uses
        from graphopt.backends.torch.quantize import pack_int8_weight

        x = torch.randn(n, n, generator=g)
        packed = pack_int8_weight(torch.randn(n, n, generator=g), None)
        out["matrix:int8"] = 2 * n**3 / time_call(
            functools.partial(torch.ops.quantized.linear_dynamic, x, packed),
            budget_s=_RATE_BUDGET_S, repeats=5, best=True)
    img = torch.randn(1, 64, 56, 56, generator=g)
    kernel = torch.randn(64, 64, 3, 3, generator=g)
    conv_flops = 2 * 64 * 56 * 56 * 64 * 9
    out["conv:fp32"] = conv_flops / time_call(lambda: F.conv2d(img, kernel, padding=1),
                                              budget_s=_RATE_BUDGET_S, repeats=5, best=True)
    elems = max(64 * 2**20, 8 * (profile.l2_bytes or 0)) // 4  # fp32 elements
    if quick:
        elems //= 2
    a, b = torch.ones(elems), torch.ones(elems)
    dst = torch.empty(elems)
    out["memory"] = 3 * 4 * elems / time_call(lambda: torch.add(a, b, out=dst),
                                              budget_s=_RATE_BUDGET_S, repeats=5, best=True)
    return out
