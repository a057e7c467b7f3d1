"""Pick how to split a plan: ``heft``, ``pipeline``, ``tensor`` or ``auto`` (compare them all).

Why one entry point: the strategies answer in different shapes (a :class:`Partition`, a
:class:`TensorParallel`, a :class:`TwoD`); the planner, the CLI and the report need one
comparison on one clock.

1. ``heft`` / ``pipeline``: :func:`graphopt.partition.split` (unchanged).
2. ``tensor``: tensor parallelism over every given device
   (:func:`.tensor_parallel.tensor_parallel`); an error if no block splits at that degree, or
   if a device overflows its memory (which device, by how much).
   Costed plain and, when :mod:`.tp_emit` can emit it for the user's module
   (:func:`sequence_parallel_emittable`), with sequence parallelism; the faster is kept and
   the candidate's detail says which. The 2-D split costs plain tensor parallelism only.
3. ``auto``: heft, pipeline, tensor over all devices and, with several NVLink groups, the 2-D
   split (:func:`.two_d.two_d`), each on latency for one request and throughput for a stream
   of micro-batches, within every device's memory. The lowest latency wins (ties: the
   higher throughput); the losers' numbers and why any could not run are kept.

Throughput per strategy: heft runs one request at a time (1 / makespan); pipeline and 2-D
overlap micro-batches across stages (1 / slowest stage); tensor parallelism runs every
micro-batch on every device (1 / makespan; with all-reduces overlapped by a second
micro-batch, at best 1 / max(compute, collectives), shown beside it).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from graphopt.errors import GraphoptError
from graphopt.ir.plan import Plan
from graphopt.partition.assemble import human_s
from graphopt.partition.devices import DeviceSet
from graphopt.partition.result import Partition
from graphopt.partition.splitter import split
from graphopt.partition.tensor_parallel import TensorParallel, tensor_parallel
from graphopt.partition.two_d import TwoD, nvlink_groups, two_d

__all__ = ["STRATEGY_CHOICES", "Candidate", "compare", "run_strategy",
           "sequence_parallel_emittable", "torch_module"]

logger = logging.getLogger(__name__)

STRATEGY_CHOICES = ("heft", "pipeline", "tensor", "auto")
_TP_FIX = ("use --strategy heft or pipeline, or a device count that divides the heads, KV "
           "heads and intermediate size")
_MEM_FIX = ("add devices or raise their memory caps, or quantize the weights (`graphopt plan` "
            "shows the recommended format)")


@dataclass(frozen=True)
class Candidate:
    """One strategy's result on the common clock (``result`` None when it could not run)."""

    name: str
    latency_s: float | None
    throughput_per_s: float | None
    why_not: str
    result: Partition | TensorParallel | TwoD | None
    detail: str = ""

    @property
    def feasible(self) -> bool:
        return self.result is not None and not self.why_not

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": self.name, "latency_s": self.latency_s,
                "throughput_per_s": self.throughput_per_s, "feasible": self.feasible,
                "why_not": self.why_not or None, "detail": self.detail}


def tensor_checked(plan: Plan, devices: DeviceSet, source: Any = None) -> TensorParallel:
    """Case 2: tensor parallelism over all ``devices``, or the error saying what to change."""
    tp = tensor_parallel(plan, devices, source=source)
    t = len(devices.devices)
    if not tp.splits:
        why = "; ".join(tp.fallbacks[:3]) or "the plan has no attention or MLP block"
        raise GraphoptError(f"tensor parallelism over {t} devices splits no block: {why}",
                            _TP_FIX)
    if not tp.feasible:
        raise GraphoptError(f"tensor parallelism over {t} devices overflows memory: "
                            f"{tp.overflow_text()}", _MEM_FIX)
    return tp


def _partition_candidate(plan: Plan, devices: DeviceSet, name: str) -> Candidate:
    part = split(plan, devices, name)
    if name == "pipeline":
        tput = part.notes.get("throughput_per_s")
        detail = f"{len(part.stages)} stages, slowest {human_s(part.notes['bottleneck_s'])}"
    else:
        tput = 1.0 / part.makespan_s if part.makespan_s > 0 else None
        detail = f"one request at a time; {part.notes.get('chosen', 'heft')} schedule"
    return Candidate(name, part.makespan_s, tput, "", part, detail)


def torch_module(source: Any, module: Any = None) -> Any:
    """The user's ``nn.Module`` (``module``, or ``source`` when it is one), else None: the
    sequence-parallel plan names its norms and LM head, which the traced graph does not keep."""
    from torch import nn

    for m in (module, source):
        if isinstance(m, nn.Module):
            return m
    return None


def sequence_parallel_emittable(plan: Plan, degree: int, source: Any, module: Any = None
                                ) -> tuple[bool, str]:
    """Whether :mod:`.tp_emit` can emit sequence parallelism for the user's module at
    ``degree`` (every block split, the norms and LM head found), and why not: a plan costed
    with it must also run with it."""
    from graphopt.partition.tp_blocks import LM_HEAD, find_tp_blocks, splittable
    from graphopt.partition.tp_emit import sequence_parallel_support

    found, skipped = find_tp_blocks(plan, source=source)
    blocks, fallbacks = splittable([b for b in found if b.kind != LM_HEAD], degree)
    if skipped or fallbacks:  # an LM head that does not divide just stays whole
        return False, f"not every block splits {degree} ways: {(skipped + fallbacks)[0]}"
    return sequence_parallel_support(blocks, torch_module(source, module))


def _tensor_variant(plan: Plan, devices: DeviceSet, source: Any, module: Any
                    ) -> tuple[TensorParallel, str]:
    """Plain tensor parallelism, or with sequence parallelism when it emits and is faster;
    the sentence says which and why."""
    plain = tensor_checked(plan, devices, source)
    ok, why = sequence_parallel_emittable(plan, plain.degree, source, module)
    if not ok:
        return plain, f"plain (no sequence parallelism: {why})"
    seq = tensor_parallel(plan, devices, source=source, sequence_parallel=True)
    if not seq.feasible or seq.makespan_s >= plain.makespan_s:
        return plain, (f"plain: {human_s(plain.makespan_s)}, not slower than with sequence "
                       f"parallelism ({human_s(seq.makespan_s)})" if seq.feasible else
                       f"plain (with sequence parallelism memory overflows: "
                       f"{seq.overflow_text()})")
    return seq, (f"with sequence parallelism: {human_s(seq.makespan_s)} against "
                 f"{human_s(plain.makespan_s)} plain")


def _tensor_candidate(plan: Plan, devices: DeviceSet, source: Any, module: Any = None
                      ) -> Candidate:
    tp, variant = _tensor_variant(plan, devices, source, module)
    plural = "s" if len(tp.splits) != 1 else ""
    detail = (f"{len(tp.splits)} block{plural} split {tp.degree} ways, "
              f"{human_s(tp.makespan_s - tp.compute_s)} of collectives; "
              f"{tp.throughput_overlapped_per_s:,.1f}/s with collectives overlapped; {variant}")
    return Candidate("tensor", tp.makespan_s, tp.throughput_per_s, "", tp, detail)


def _two_d_candidate(plan: Plan, devices: DeviceSet, source: Any) -> Candidate:
    res = two_d(plan, devices, source=source)
    if not res.feasible:
        raise GraphoptError(f"the 2-D split overflows memory: {res.overflow_text()}", _MEM_FIX)
    detail = (f"{len(res.stages)} stages over groups "
              f"{', '.join('+'.join(s.group) for s in res.stages)}; slowest stage "
              f"{human_s(res.bottleneck_s)}")
    return Candidate("2d", res.latency_s, res.throughput_per_s, "", res, detail)


def compare(plan: Plan, devices: DeviceSet, *, source: Any = None, module: Any = None
            ) -> list[Candidate]:
    """Case 3: every strategy that applies, feasible or with why not (``module``: the user's
    ``nn.Module``, for the sequence-parallel check)."""
    runs: list[tuple[str, Any]] = [
        ("heft", lambda: _partition_candidate(plan, devices, "heft")),
        ("pipeline", lambda: _partition_candidate(plan, devices, "pipeline")),
        ("tensor", lambda: _tensor_candidate(plan, devices, source, module)),
    ]
    if len(nvlink_groups(devices)) > 1:
        runs.append(("2d", lambda: _two_d_candidate(plan, devices, source)))
    out = []
    for name, run in runs:
        try:
            out.append(run())
        except GraphoptError as e:
            out.append(Candidate(name, None, None, e.problem, None))
    return out


def _pick(cands: list[Candidate]) -> tuple[Candidate, str]:
    ok = [c for c in cands if c.feasible and c.latency_s is not None]
    if not ok:
        raise GraphoptError("no strategy fits: " + "; ".join(f"{c.name}: {c.why_not}"
                                                             for c in cands), _MEM_FIX)
    ok.sort(key=lambda c: (c.latency_s, -(c.throughput_per_s or 0.0)))
    win = ok[0]
    why = f"{win.name} has the lowest latency for one request, {human_s(win.latency_s)}"
    if len(ok) > 1:
        nxt = ok[1]
        why += (f" ({nxt.latency_s / win.latency_s:.2f}x lower than the next, {nxt.name} "
                f"{human_s(nxt.latency_s)})") if win.latency_s else ""
    best_tput = max(ok, key=lambda c: (c.throughput_per_s or 0.0, c.name == win.name))
    if best_tput is not win and best_tput.throughput_per_s:
        why += (f"; {best_tput.name} has the highest throughput for a stream of micro-batches "
                f"({best_tput.throughput_per_s:,.1f}/s against {win.throughput_per_s or 0:,.1f}/s)"
                ", but the pick is by latency")
    else:
        why += "; it also has the highest throughput"
    bad = [c for c in cands if not c.feasible]
    if bad:
        why += "; could not run: " + "; ".join(f"{c.name} ({c.why_not})" for c in bad)
    return win, why


def run_strategy(plan: Plan, devices: DeviceSet, strategy: str, *, source: Any = None,
                 module: Any = None) -> tuple[Candidate, dict[str, Any]]:
    """The chosen strategy's result and the report's ``strategy`` section (``module``: the
    user's ``nn.Module`` when ``source`` is the traced graph, so that tensor parallelism may
    use sequence parallelism)."""
    if strategy not in STRATEGY_CHOICES:
        raise GraphoptError(f"unknown split strategy {strategy!r}",
                            f"use one of: {', '.join(STRATEGY_CHOICES)}")
    if strategy == "auto":
        cands = compare(plan, devices, source=source, module=module)
        win, why = _pick(cands)
    elif strategy == "tensor":
        cands = [_tensor_candidate(plan, devices, source, module)]
        win, why = cands[0], "requested with --strategy tensor"
    else:
        cands = [_partition_candidate(plan, devices, strategy)]
        win, why = cands[0], f"requested with --strategy {strategy}"
    logger.info("strategy %s: %s", win.name, why)
    tp = win.result if isinstance(win.result, TensorParallel) else None
    section = {"requested": strategy, "winner": win.name,
               "sequence_parallel": bool(tp and tp.notes["sequence_parallel"]["enabled"]),
               "picked_by": "latency for one request" if strategy == "auto" else "request",
               "why": why, "groups": [list(g) for g in nvlink_groups(devices)],
               "candidates": [c.to_dict() for c in cands]}
    return win, section
