"""Batch advice: the batch where the plan's estimated throughput stops improving, capped by memory.

The memory maximum (``memory``, case 6) says how many samples *fit*; it says nothing about how
many are *worth* running together. Past the knee of the throughput curve a bigger batch buys
almost no samples/s, and every request waits for the whole batch.

Rule (the knee): samples/s(B) = B / T(B), T(B) the plan's estimated step time at batch B.
Recommend the smallest batch whose samples/s reaches ``KNEE_FRACTION`` (90 %) of the best
samples/s over the batches that fit. Why 90 %: beyond it, doubling the batch doubles the
latency of every request and the activation memory for at most ~10 % more samples/s; serving
stacks size batches to a latency budget, not to memory.

How T(B) is estimated, cheaply (no re-trace, no re-annotation), from the traced batch b0 and
k = B / b0:

1. A node fed (through any path) by a graph input carries the batch: its FLOPs, the bytes it
   reads from batch-carrying tensors and the bytes it writes scale by k. Weight and constant
   bytes do not: weights are read once per step, whatever the batch.
2. Its batch-carrying dims scale too, so the roofline's tile utilization (``cost.roofline``,
   case 4) sees the real M: GEMM/GEMV and conv ``M``, attention's ``batch``, and the
   ``batch`` of a matmul of two activations (attention scores).
3. A node fed only by weights and constants keeps its cost.
4. Each kernel's launch overhead stays: it is what makes small batches slow.

Candidates: 1, 2, 4, then powers of two (multiples of 8, for tensor-core M) up to the memory
maximum, and the maximum itself; the knee is then refined by bisection over multiples of 8
between the candidate below it and it (samples/s grows with the batch on a roofline, up to
wave quantization).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from graphopt.analysis.kernel_class import KernelClass
from graphopt.analysis.record import NodeAnalysis
from graphopt.cost.roofline import estimate
from graphopt.ir.plan import NodePlan, Plan

__all__ = ["KNEE_FRACTION", "SEARCH_LIMIT", "BatchAdvice", "advise_batch", "step_time_at"]

#: the share of the best samples/s the recommended batch must reach (module docstring)
KNEE_FRACTION = 0.9
#: the largest batch searched when memory sets no limit
SEARCH_LIMIT = 1 << 16
_MULTIPLE = 8  # tensor-core M alignment, as memory case 6 [DLPERF]
_GEMMS = frozenset({KernelClass.GEMM, KernelClass.GEMV, KernelClass.QUANT_GEMM,
                    KernelClass.QUANT_DOT})


@dataclass(frozen=True, slots=True)
class BatchAdvice:
    """The recommended batch, what decided it, and the samples/s it was read from."""

    recommended: int
    #: "throughput" (the knee), "memory" (the maximum that fits) or a caller's ``limit_by``
    decided_by: str
    reason: str
    samples_per_s: Mapping[int, float]

    def to_dict(self) -> dict[str, Any]:
        return {"recommended_batch_size": self.recommended, "batch_decided_by": self.decided_by,
                "batch_advice": self.reason, "knee_fraction": KNEE_FRACTION,
                "samples_per_s_at": {str(b): round(s, 3)
                                     for b, s in sorted(self.samples_per_s.items())}}


@dataclass(frozen=True, slots=True)
class _Work:
    """One distinct node (repeated blocks share one) and how its work scales."""

    analysis: NodeAnalysis
    act_read: int  # bytes read from batch-carrying tensors
    scaled_dims: tuple[str, ...]
    dtype: str | None


def _works(plan: Plan, dtypes: Mapping[str, str] | None) -> tuple[list[tuple[_Work, int]], float]:
    """(distinct batch-carrying nodes with their counts, time of the rest) -- cases 1-3."""
    carried = {t.name for t in plan.model.inputs}
    works: Counter[tuple] = Counter()
    first: dict[tuple, _Work] = {}
    fixed = 0.0
    for n in plan.nodes:
        ins = [t for t in n.inputs if t is not None]
        on = {t.name: t for t in ins if t.name in carried or t.kind == "input"}
        if not on:  # case 3
            fixed += _cost(n.analysis, plan, (dtypes or {}).get(n.name))
            continue
        carried.update(t.name for t in n.outputs if t is not None)
        a = n.analysis
        w = _Work(a, sum(t.nbytes for t in on.values()), _batch_dims(n, on),
                  (dtypes or {}).get(n.name))
        key = (a.kernel_class, tuple(a.dims.items()), a.flops, a.bytes_read, a.bytes_written,
               a.dtype, a.flags, w.act_read, w.scaled_dims, w.dtype)
        first.setdefault(key, w)
        works[key] += 1
    return [(first[k], c) for k, c in works.items()], fixed


def _batch_dims(n: NodePlan, on: Mapping[str, Any]) -> tuple[str, ...]:
    """Case 2: the dims of ``n`` that grow with the batch."""
    kc, d = n.analysis.kernel_class, n.analysis.dims
    if kc is KernelClass.ATTENTION:
        return ("batch",)
    if kc is KernelClass.CONV:
        return ("M", "batch")
    if kc in _GEMMS:
        operands = [t for t in n.inputs[:2] if t is not None]
        both = len(operands) == 2 and all(t.name in on for t in operands)
        return ("batch",) if both and d.get("batch", 1) > 1 else ("M",)
    return ()


def _cost(a: NodeAnalysis, plan: Plan, dtype: str | None) -> float:
    return estimate(a, plan.target, dtype if dtype and dtype != a.dtype else None).est_time_s


def _scaled(w: _Work, k: float) -> NodeAnalysis:
    a = w.analysis
    dims = {name: max(1, round(v * k)) if name in w.scaled_dims else v
            for name, v in a.dims.items()}
    fixed = max(0, a.bytes_read - w.act_read)
    return replace(a, dims=dims, flops=round(a.flops * k),
                   bytes_read=fixed + round(w.act_read * k),
                   bytes_written=round(a.bytes_written * k))


def step_time_at(plan: Plan, batch: int, traced_batch: int,
                 dtypes: Mapping[str, str] | None = None) -> float:
    """The plan's estimated time for one step at ``batch`` (cases 1-4)."""
    return _Curve(plan, traced_batch, dtypes).time(batch)


class _Curve:
    """Step time over the batch, memoized: each batch costs one pass over the distinct nodes."""

    def __init__(self, plan: Plan, traced_batch: int, dtypes: Mapping[str, str] | None) -> None:
        self.plan, self.b0 = plan, max(1, traced_batch)
        self.works, self.fixed = _works(plan, dtypes)
        self.times: dict[int, float] = {}

    def time(self, batch: int) -> float:
        if batch not in self.times:
            k = batch / self.b0
            self.times[batch] = self.fixed + sum(
                c * _cost(_scaled(w, k), self.plan, w.dtype) for w, c in self.works)
        return self.times[batch]

    def rate(self, batch: int) -> float:
        t = self.time(batch)
        return batch / t if t > 0 else 0.0


def _candidates(limit: int) -> list[int]:
    out, b = [], 1
    while b < limit:
        out.append(b)
        b *= 2
    return [*out, limit]


def advise_batch(plan: Plan, max_batch: int, traced_batch: int, *,
                 memory_limited: bool = True, limit_by: str = "memory",
                 dtypes: Mapping[str, str] | None = None) -> BatchAdvice:
    """The knee of samples/s over batches up to ``max_batch`` (module docstring).

    Args:
        max_batch: the memory maximum (``memory`` case 6); 0 with ``memory_limited`` means not
            even one sample fits.
        memory_limited: False when memory sets no limit: batches up to ``SEARCH_LIMIT`` are
            searched.
        limit_by: what ``max_batch`` is, as ``decided_by`` names it ("memory"; "range" for a
            caller capping at its batch range).
        dtypes: node name -> the dtype it is costed at (the decided precision).
    """
    if memory_limited and max_batch <= 0:
        return BatchAdvice(0, "memory", "not even one sample fits in memory", {})
    limit = max_batch if memory_limited else SEARCH_LIMIT
    curve = _Curve(plan, traced_batch, dtypes)
    batches = _candidates(limit)
    rates = {b: curve.rate(b) for b in batches}
    best = max(rates.values())
    if best <= 0:
        return BatchAdvice(limit, "memory" if memory_limited else "throughput",
                           "the plan estimates no time at any batch: nothing to trade", rates)
    goal = KNEE_FRACTION * best
    knee = next(b for b in batches if rates[b] >= goal)
    i = batches.index(knee)
    lo = batches[i - 1] if i else 0
    while knee - lo > _MULTIPLE and knee > _MULTIPLE:  # refine: multiples of 8 in (lo, knee)
        mid = (lo + knee) // 2 // _MULTIPLE * _MULTIPLE
        if mid <= lo or mid >= knee:
            break
        rates[mid] = curve.rate(mid)
        lo, knee = (lo, mid) if rates[mid] >= goal else (mid, knee)
    share = f"{rates[knee] / best:.0%} of the best {best:,.0f} samples/s"
    if knee < limit:
        reason = (f"throughput knee: batch {knee} reaches {share} (rule: the smallest batch "
                  f"within {KNEE_FRACTION:.0%} of the best); a bigger batch adds latency and "
                  f"memory for little more throughput")
        if memory_limited:
            reason += f"; {limit_by} allows up to {max_batch}"
        return BatchAdvice(knee, "throughput", reason, rates)
    if not memory_limited:
        return BatchAdvice(limit, "throughput", f"memory sets no limit and samples/s still "
                           f"rises at {limit}, the largest batch searched ({share})", rates)
    what = "that fits" if limit_by == "memory" else f"the {limit_by} allows"
    reason = (f"{limit_by}: the largest batch {what} ({max_batch}) is still on the rising part "
              f"of the samples/s curve ({share})")
    return BatchAdvice(max_batch, limit_by, reason, rates)
