"""Whether ``torch.compile`` of the optimized module could win the deploy choice, before
compiling it (it compiles for seconds to minutes: 9-40 s cold on the 2-vCPU hosts here).

Its best case is bounded from two measurements and one estimate:

1. The torch module's time, and the time in it of ops Inductor has no lowering for (the
   ``quantized::`` and ``graphopt::`` ops, graphopt's INT8/FP8/INT4 Linears): Inductor calls
   them as fallback kernels, as eager does, so compiling cannot make them faster. On torch
   2.13, Dynamo also breaks the graph at every ``quantized::linear_dynamic`` (its packed weight
   is a TorchScript object it cannot trace). Measured by one profiled call
   (:func:`opaque_op_seconds`). On the AVX2 EPYC they were 55-77% of BERT's,
   ViT's and ConvNeXt-T's INT8 modules, whose compiles measured 1.00-1.27x the module's time.
2. The rest at the plan's fused/unfused estimate (``cost/fusion.py``), up to
   :data:`COMPILE_REACH` better than that.

torch.compile is built only where that best case beats the fastest other candidate.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from graphopt.backends.timing import best_time
from graphopt.errors import first_line
from graphopt.files.quiet import library_quiet
from graphopt.measure.deploy_runs import ORIGINAL

__all__ = ["COMPILE_REACH", "OPAQUE_NAMESPACES", "compile_out_of_reach", "opaque_op_seconds"]

logger = logging.getLogger(__name__)

#: how much better than the plan's fusion estimate torch.compile may do on the ops it compiles.
#: The fusion model predicts 0.94-0.98 of eager on the zoo. torch.compile measured 0.78-0.95 of
#: the torch module on an AMX Xeon (RESULTS.md, issue 24) and 0.92-1.15 on the AVX2 EPYC
#: (issue 34, bench_optimize_time.py): at most 1.22x better than predicted, model by model.
#: 1.25 covers that. (It was 1.5: ConvNeXt-T's 44 s compile was built here and lost to ORT
#: by 1.28x.)
COMPILE_REACH = 1.25
#: op namespaces Inductor has no lowering for: compiled, they run as the same kernels
OPAQUE_NAMESPACES = ("quantized::", "graphopt::")


def compile_out_of_reach(opt: Any, calls: dict[str, Callable[[], Any]],
                         args: tuple[Any, ...]) -> str | None:
    """Why torch.compile is not built (None: it could win): a probe of the torch module
    (best of two calls after a warm-up, ``args`` its inputs) and of each other candidate, the
    module's opaque ops, and the plan's fusion estimate (module doc)."""
    fusion = opt.plan.fusion
    others = {n: c for n, c in calls.items() if n not in (ORIGINAL, "torch")}
    if not others or fusion is None or not fusion.est_latency_unfused_s:
        return None
    ratio = float(fusion.est_latency_fused_s) / float(fusion.est_latency_unfused_s)
    torch_s = best_time(calls["torch"], budget_s=0.0, min_runs=2, max_runs=2)
    best, best_s = min(((n, best_time(c, budget_s=0.0, min_runs=2, max_runs=2))
                        for n, c in others.items()), key=lambda x: x[1])
    opaque_s = 0.0  # profiled only where the whole module at the estimate could win
    reach = torch_s * ratio / COMPILE_REACH
    if reach <= best_s:
        opaque_s = min(opaque_op_seconds(opt.module, args), torch_s)
        reach = opaque_s + (torch_s - opaque_s) * ratio / COMPILE_REACH
        if reach <= best_s:
            return None
    fallback = (f" ({opaque_s * 1e3:.3g} ms of it in ops Inductor leaves as they are: "
                "quantized or graphopt Linears)" if opaque_s > 0 else "")
    return (f"not built: the torch module takes {torch_s * 1e3:.3g} ms{fallback}; with the "
            f"rest at the plan's fusion estimate ({ratio:.2f}) and {COMPILE_REACH:g}x better "
            f"than that, torch.compile would take {reach * 1e3:.3g} ms at best, slower than "
            f"{best}'s {best_s * 1e3:.3g} ms (best of two calls each, after a warm-up)")


def opaque_op_seconds(module: Any, args: tuple[Any, ...]) -> float:
    """Seconds one call of ``module`` spends in ops of :data:`OPAQUE_NAMESPACES` (one call
    under torch.profiler, after the caller's warm-up; 0.0 where the profiler fails)."""
    import torch  # here: the ONNX paths import this module and never torch

    try:
        with library_quiet(), torch.inference_mode(), \
                torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            module(*args)
        events = prof.key_averages()
    except Exception as e:  # noqa: BLE001 - a profiler that cannot run: no bound from it
        logger.debug("no opaque op times: %s", first_line(e))
        return 0.0
    return sum(e.cpu_time_total for e in events if e.key.startswith(OPAQUE_NAMESPACES)) / 1e6
