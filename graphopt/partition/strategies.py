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
   the candidate's detail says which.
3. ``auto``: heft, pipeline, tensor over all devices and, with several NVLink groups, the 2-D
   split (:func:`.two_d.two_d`), each on latency for one request and throughput for a stream
   of micro-batches, within every device's memory. The lowest latency among the plans
   graphopt can emit for the given module wins (ties: the higher throughput); the losers'
   numbers, why any could not run and why any costed plan cannot be emitted are kept.
4. **Emittable** (legality, apart from the cost): heft and pipeline are emitted from the traced
   graph (:mod:`.emit`, :mod:`.pipeline_stages`). Tensor parallelism is emittable when
   :mod:`.tp_emit` can split every block the cost model split (module paths, ``nn.Linear``,
   no block note). The 2-D split is emittable for a Llama-layout decoder given as an
   ``nn.Module`` (:func:`.two_d_emit.on_module_boundaries`, which moves its cuts onto module
   boundaries and re-costs them); it is costed plain and, when :mod:`.tp_emit` can emit it, with
   sequence parallelism inside the stages, and the faster is kept. A plan that cannot be
   emitted is shown with the reason and never picked.

Throughput per strategy: heft runs one request at a time (1 / makespan); pipeline and 2-D
overlap micro-batches across stages (1 / slowest stage); tensor parallelism runs every
micro-batch on every device (1 / makespan; with all-reduces overlapped by a second
micro-batch, at best 1 / max(compute, collectives), shown beside it).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any

from graphopt.errors import GraphoptError
from graphopt.ir.plan import Plan
from graphopt.ir.plan_partition import Strategy, StrategyCandidate, StrategyChoice
from graphopt.partition.assemble import human_s
from graphopt.partition.devices import DeviceSet
from graphopt.partition.result import Partition
from graphopt.partition.splitter import split
from graphopt.partition.tensor_parallel import TensorParallel, tensor_parallel
from graphopt.partition.tp_blocks import LM_HEAD, find_tp_blocks, splittable
from graphopt.partition.two_d import TwoD, nvlink_groups, two_d

__all__ = ["STRATEGY_CHOICES", "Candidate", "compare", "run_strategy",
           "sequence_parallel_emittable", "tensor_not_emitted", "torch_module"]

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
    not_emitted: str = ""  # case 4: why graphopt cannot emit this costed plan ("" if it can)

    @property
    def feasible(self) -> bool:
        return self.result is not None and not self.why_not

    @property
    def emittable(self) -> bool:
        return not self.not_emitted

    def to_record(self) -> StrategyCandidate:
        return StrategyCandidate(Strategy(self.name), self.latency_s, self.throughput_per_s,
                                 self.feasible, self.emittable, self.not_emitted or None,
                                 self.why_not or None, self.detail)


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


def _emitters() -> SimpleNamespace:
    """The emitters that check a split against the user's torch module (tp_emit, tp_styles,
    two_d_emit: they import torch), loaded at first use so that costing a split never imports
    torch; this is the one place the strategies reach them."""
    from graphopt.partition import tp_emit, tp_styles, two_d_emit

    return SimpleNamespace(tp_emit=tp_emit, tp_styles=tp_styles, two_d_emit=two_d_emit)


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
    found, skipped = find_tp_blocks(plan, source=source)
    blocks, fallbacks = splittable([b for b in found if b.kind != LM_HEAD], degree)
    if skipped or fallbacks:  # an LM head that does not divide just stays whole
        return False, f"not every block splits {degree} ways: {(skipped + fallbacks)[0]}"
    return _emitters().tp_emit.sequence_parallel_support(blocks, torch_module(source, module))


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


def tensor_not_emitted(plan: Plan, tp: TensorParallel, source: Any, module: Any = None) -> str:
    """Case 4: why :mod:`.tp_emit` cannot split every block ``tp`` split ("" when it can)."""
    split = {b.block for b in tp.splits}
    blocks = [b for b in find_tp_blocks(plan, source=source)[0] if b.name in split]
    _, unsplit = _emitters().tp_styles.emittable(blocks, torch_module(source, module))
    if not unsplit and len(blocks) == len(split):
        return ""
    first = unsplit[0] if unsplit else "a split block has no module paths"
    return (f"costed with {len(split)} blocks split, of which parallelize_module cannot split "
            f"{max(len(unsplit), 1)}: {first}")


def _tensor_candidate(plan: Plan, devices: DeviceSet, source: Any, module: Any = None
                      ) -> Candidate:
    tp, variant = _tensor_variant(plan, devices, source, module)
    plural = "s" if len(tp.splits) != 1 else ""
    detail = (f"{len(tp.splits)} block{plural} split {tp.degree} ways, "
              f"{human_s(tp.makespan_s - tp.compute_s)} of collectives; "
              f"{tp.throughput_overlapped_per_s:,.1f}/s with collectives overlapped; {variant}")
    return Candidate("tensor", tp.makespan_s, tp.throughput_per_s, "", tp, detail,
                     tensor_not_emitted(plan, tp, source, module))


def _two_d_costed(plan: Plan, devices: DeviceSet, source: Any, sp: bool, mod: Any = None
                  ) -> TwoD:
    """The 2-D split, on ``mod``'s module boundaries when given (raises why not)."""
    res = two_d(plan, devices, source=source, sequence_parallel=sp)
    if res.feasible and mod is not None:
        res = _emitters().two_d_emit.on_module_boundaries(res, plan, mod, source=source)
    if not res.feasible:
        raise GraphoptError(f"the 2-D split overflows memory: {res.overflow_text()}", _MEM_FIX)
    return res


def _two_d_candidate(plan: Plan, devices: DeviceSet, source: Any, module: Any = None
                     ) -> Candidate:
    mod = torch_module(source, module)
    res = _two_d_costed(plan, devices, source, False)
    why = "" if mod is not None else ("no nn.Module given: the 2-D stages are built from the "
                                      "model's own embedding, decoder layers, norm and head")
    if mod is not None:
        try:
            res = _emitters().two_d_emit.on_module_boundaries(res, plan, mod, source=source)
        except GraphoptError as e:
            why = e.problem
    if not res.feasible:
        raise GraphoptError(f"the 2-D split overflows memory: {res.overflow_text()}", _MEM_FIX)
    if why:  # costed only: shown, never picked
        res = replace(res, not_emitted=why)
        return Candidate("2d", res.latency_s, res.throughput_per_s, "", res,
                         _two_d_detail(res, "plain tensor parallelism in each stage"), why)
    ok, no_sp = sequence_parallel_emittable(plan, len(res.stages[0].group), source, mod)
    variant = f"plain (no sequence parallelism: {no_sp})"
    if ok:
        try:
            seq: TwoD | None = _two_d_costed(plan, devices, source, True, mod)
            variant = "plain"
        except GraphoptError as e:
            seq, variant = None, f"plain (with sequence parallelism: {e.problem})"
        if seq is not None and seq.latency_s < res.latency_s:
            res, variant = seq, (f"sequence parallel in each stage: {human_s(seq.latency_s)} "
                                 f"against {human_s(res.latency_s)} plain")
        elif seq is not None:
            variant = (f"plain: {human_s(res.latency_s)}, not slower than with sequence "
                       f"parallelism ({human_s(seq.latency_s)})")
    return Candidate("2d", res.latency_s, res.throughput_per_s, "", res,
                     _two_d_detail(res, variant))


def _two_d_detail(res: TwoD, variant: str) -> str:
    detail = (f"{len(res.stages)} stages over groups "
              f"{', '.join('+'.join(s.group) for s in res.stages)}; slowest stage "
              f"{human_s(res.bottleneck_s)}; {res.micro_batches} micro-batch"
              f"{'es' if res.micro_batches != 1 else ''}, {res.pipeline_schedule}")
    if res.layout is not None:
        detail += "; decoder layers per stage " + ", ".join(
            f"{a}-{b - 1}" if b > a + 1 else (str(a) if b > a else "none")
            for a, b in (s.layers for s in res.layout.stages))
        if res.notes.get("uneven"):
            detail += " (uneven)"
    for c in res.moved_cuts:
        detail += f"; cut moved {c.at} (planned after {c.planned_after}, {c.why})"
    return f"{detail}; {variant}"


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
        runs.append(("2d", lambda: _two_d_candidate(plan, devices, source, module)))
    out = []
    for name, run in runs:
        try:
            out.append(run())
        except GraphoptError as e:
            out.append(Candidate(name, None, None, e.problem, None))
    return out


def _pick(cands: list[Candidate]) -> tuple[Candidate, str]:
    ok = [c for c in cands if c.feasible and c.emittable and c.latency_s is not None]
    if not ok:
        raise GraphoptError("no strategy fits and can be emitted: " + "; ".join(
            f"{c.name}: {c.why_not or c.not_emitted}" for c in cands), _MEM_FIX)
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
    shown = [c for c in cands if c.feasible and not c.emittable]
    if shown:
        why += "; costed but not emitted, so never picked: " + "; ".join(
            f"{c.name} {human_s(c.latency_s)} ({c.not_emitted})" for c in shown)
    return win, why


def run_strategy(plan: Plan, devices: DeviceSet, strategy: str, *, source: Any = None,
                 module: Any = None) -> tuple[Candidate, StrategyChoice]:
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
    seq = bool(tp and tp.notes["sequence_parallel"]["enabled"]) or bool(
        isinstance(win.result, TwoD) and win.result.sequence_parallel)
    section = StrategyChoice(
        Strategy(strategy), Strategy(win.name), seq,
        "latency for one request" if strategy == "auto" else "request", why,
        tuple(tuple(g) for g in nvlink_groups(devices)), tuple(c.to_record() for c in cands))
    return win, section
