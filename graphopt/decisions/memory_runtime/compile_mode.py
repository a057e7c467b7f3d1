"""Which ``torch.compile`` mode the plan favours, from where its estimated time goes.

``torch.compile(module, mode=...)`` [PT-COMPILE]:

1. CPU target: ``"default"``. ``"reduce-overhead"`` is CUDA graphs, which CPUs do not have, and
   ``"max-autotune"`` on CPU mostly tunes GEMM templates the oneDNN kernels already cover.
2. GPU target, launch-bound kernels (bottleneck ``latency`` in the plan's
   ``time_by_bottleneck_s``) more than half of the estimate: ``"reduce-overhead"``. CUDA graphs
   replay every kernel launch of a step as one, which removes the ~5 us per launch that
   dominates such a step. With a shape range one graph is recorded per distinct shape
   (the reason says so); static shapes replay one.
3. GPU target, compute-bound kernels (GEMMs, convs) more than half: ``"max-autotune"``. Inductor
   then times Triton/CUTLASS GEMM tile choices per shape, which pays where tensor-core time is
   the step; it compiles for minutes longer, once.
4. Otherwise (memory-bound or mixed): ``"default"``, fusion without the longer compile.

Sources:
  [PT-COMPILE] PyTorch docs, ``torch.compile`` ("mode": "reduce-overhead ... uses CUDA graphs",
               "max-autotune ... leverages Triton or template based matrix multiplications").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from graphopt.decisions.memory_runtime.runtime import Setting
from graphopt.hardware.profile import HardwareProfile

__all__ = ["DOMINANT_SHARE", "compile_mode"]

#: a bottleneck "dominates" the estimate above this share of its time (our choice: a majority)
DOMINANT_SHARE = 0.5


def compile_mode(target: HardwareProfile, time_by_bottleneck_s: Mapping[str, Any] | None,
                 *, dynamic: bool = False) -> Setting:
    """The ``torch.compile`` mode for a plan on ``target`` and why (rules 1-4 above)."""
    if not target.is_gpu:
        return Setting("default", "rule 1: CPU target: no CUDA graphs (reduce-overhead is "
                       "CUDA-only), default fusion")
    times = {k: float(v or 0.0) for k, v in (time_by_bottleneck_s or {}).items()}
    total = sum(times.values())
    if total <= 0:
        return Setting("default", "rule 4: the plan has no time estimate to choose from")
    share = {k: v / total for k, v in times.items()}
    latency, compute = share.get("latency", 0.0), share.get("compute", 0.0)
    if latency > DOMINANT_SHARE:
        per_shape = (" one CUDA graph is recorded per distinct shape of the range (pass "
                     "dynamic=False to torch.compile for few shapes)." if dynamic else "")
        return Setting("reduce-overhead", f"rule 2: launch-bound kernels are {latency:.0%} of "
                       "the estimate; CUDA graphs replay the step's launches as one." + per_shape)
    if compute > DOMINANT_SHARE:
        return Setting("max-autotune", f"rule 3: compute-bound kernels are {compute:.0%} of the "
                       "estimate; autotuned GEMM/conv tiles pay (longer compile, once)")
    return Setting("default", f"rule 4: no bottleneck dominates (latency {latency:.0%}, "
                   f"compute {compute:.0%}, memory {share.get('memory', 0.0):.0%})")
