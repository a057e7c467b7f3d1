"""Which of graphopt's artifacts to deploy: the torch module, ``torch.compile`` of it, an ONNX
Runtime session of its ONNX export, or OpenVINO compiling that export, and by how much it beats
the others.

1. Candidates: from a torch model, all four (torch.compile only where it could win); from
   an ONNX model, ONNX Runtime and OpenVINO (there is no torch module to run). A candidate
   that failed to build (an export or a compile error) or whose outputs left its tolerance is
   shown with why, never chosen.
2. Measured (the target is this machine's CPU, ``measure`` on; ``api/deploy.py`` times them
   in interleaved rounds): from the simplest (the torch module: no compile at load, no second
   runtime) to the least simple, a candidate replaces the current choice only when the 95%
   interval of its speedup over it, from the paired rounds, clears :data:`MEASURED_MARGIN`. A
   tie between any two (not only against the torch module) keeps the simpler, so noise never
   decides; the reason gives each interval.
3. Predicted (``measure=False``, a GPU or another machine's CPU: a timing here says nothing
   about the target): from the plan's cost model. torch: the plan's estimate at its decisions
   (each op its own kernel, eager's fixed cost per op); torch.compile: the same with the plan's
   fusion groups (Inductor fuses patterns, GEMM epilogues and pointwise chains,
   ``cost/fusion.py``); ONNX Runtime: each op at ORT's fixed cost instead of eager's, where the
   target's calibration measured both (``cost/calibrated.for_runtime``), else not estimated;
   OpenVINO: the same with OpenVINO's fixed costs, plus its fixed cost per call (this host's
   cached calibration, made with ``openvino`` installed; never a GPU). The cheapest wins only by at
   least :data:`PREDICTED_MARGIN`, the roofline's uncertainty, over the torch module, and
   OpenVINO by as much over the pick of the others; the report says the choice was not
   measured.
"""

from __future__ import annotations

from collections.abc import Iterator

from graphopt.cost.calibrated import call_cost, fixed_cost, for_runtime
from graphopt.decisions.deploy.confidence import clears, speedup_interval
from graphopt.ir.plan import Plan
from graphopt.ir.plan_deploy import ARTIFACTS, Artifact, ArtifactTiming, DeployChoice

__all__ = ["ARTIFACTS", "MEASURED_MARGIN", "PREDICTED_MARGIN", "Artifact", "ArtifactTiming",
           "DeployChoice", "pick_measured", "predict_deploy", "unsettled"]

#: case 2: a measured gain below this is timer and scheduler noise on a shared host (the
#: passes' timing guard allows the same, ``backends/timing.NOISE``)
MEASURED_MARGIN = 0.03
#: case 3: a predicted gain below this is inside the cost model's uncertainty
PREDICTED_MARGIN = 0.10


def _ratio(slow: ArtifactTiming | None, fast: ArtifactTiming | None) -> float | None:
    if slow is None or fast is None or not slow.seconds or not fast.seconds:
        return None
    return slow.seconds / fast.seconds


def _times(rows: tuple[ArtifactTiming, ...]) -> str:
    return ", ".join(f"{r.artifact} {r.seconds * 1e3:.3g} ms" for r in rows if r.usable
                     and r.seconds is not None)


def pick_measured(rows: tuple[ArtifactTiming, ...], method: str,
                  original_s: float | None = None) -> DeployChoice:
    """Case 2: the simplest usable candidate (:data:`ARTIFACTS` order), replaced by a less
    simple one only when the 95% interval of its speedup over the current choice clears
    :data:`MEASURED_MARGIN` (``decisions/confidence``); a tie keeps the simpler artifact."""
    usable = _usable(rows)
    if not usable:  # the report shows each one's failure; the torch module stays the answer
        why = ("no candidate ran within tolerance: " + "; ".join(
            f"{r.artifact} ({r.error or r.note})" for r in rows) + "; the torch module, as "
            "optimize returned it (see its numerics)")
        return DeployChoice.of(Artifact.TORCH, True, why, rows, method, original_s)
    best, said = usable[0], []
    for simpler, challenger, interval in _challenges(usable):
        text = f"{challenger.artifact} {interval[0]:.2f}-{interval[1]:.2f}x {simpler.artifact}"
        if clears(interval, MEASURED_MARGIN):
            best = challenger
            said.append(f"{text}: faster")
        else:
            said.append(f"{text}: a tie or slower, the simpler stays")
    times = _times(rows)
    why = (f"measured {times}: the only candidate that runs within tolerance"
           if len(usable) == 1 else
           f"measured {times}; at 95% over paired rounds, {'; '.join(said)} (a more complex "
           f"artifact must be {MEASURED_MARGIN:.0%} faster than the simpler one)")
    out = [r for r in rows if not r.usable]
    if out:
        why += "; not candidates: " + "; ".join(f"{r.artifact} ({r.error or r.note})"
                                                for r in out)
    return DeployChoice.of(best.artifact, True, why, rows, method, original_s)


def _usable(rows: tuple[ArtifactTiming, ...]) -> list[ArtifactTiming]:
    """The candidates that ran within tolerance, simplest first (:data:`ARTIFACTS` order)."""
    return sorted((r for r in rows if r.usable), key=lambda r: ARTIFACTS.index(r.artifact))


def unsettled(rows: tuple[ArtifactTiming, ...]) -> bool:
    """Whether the choice :func:`pick_measured` makes from ``rows`` could change with more
    rounds: unless the pick's speedup interval clears the margin over every simpler candidate
    and no less simple one could clear it over the pick. A tie between two candidates that
    both lose to the pick does not matter (timing them on would only cost time)."""
    usable = _usable(rows)
    if len(usable) < 2:
        return False
    pick = usable[0]
    for _, challenger, interval in _challenges(usable):
        if clears(interval, MEASURED_MARGIN):
            pick = challenger
    at = usable.index(pick)
    return not (all(clears(_interval(simpler, pick), MEASURED_MARGIN)
                    for simpler in usable[:at])
                and all(_interval(pick, other)[1] <= 1 + MEASURED_MARGIN
                        for other in usable[at + 1:]))


def _challenges(usable: list[ArtifactTiming]
                ) -> Iterator[tuple[ArtifactTiming, ArtifactTiming, tuple[float, float]]]:
    """(the current choice, its challenger, the challenger's speedup interval over it) from
    the simplest up; a challenger whose interval clears the margin becomes the choice."""
    best = usable[0] if usable else None
    for challenger in usable[1:]:
        interval = _interval(best, challenger)
        yield best, challenger, interval
        if clears(interval, MEASURED_MARGIN):
            best = challenger


def _interval(simpler: ArtifactTiming, challenger: ArtifactTiming) -> tuple[float, float]:
    """The challenger's speedup over the simpler artifact: from paired rounds, else the one
    ratio of best times (an interval of zero width)."""
    if len(simpler.rounds) >= 2 and len(simpler.rounds) == len(challenger.rounds):
        return speedup_interval(simpler.rounds, challenger.rounds)
    ratio = _ratio(simpler, challenger) or 0.0
    return ratio, ratio


def predict_deploy(plan: Plan, *, torch_model: bool, not_measured: str) -> DeployChoice:
    """Case 3: the choice from the plan's estimates; ``not_measured``: why no timing decided."""
    method = f"predicted from the plan's cost model, not measured: {not_measured}"
    if not torch_model:
        row = ArtifactTiming(Artifact.ONNXRUNTIME, plan.summary.est_latency_with_decisions_s,
                             note="the optimized ONNX model in its session config")
        return DeployChoice.of(Artifact.ONNXRUNTIME, False, "an ONNX input has one artifact: the "
                            "optimized model in ONNX Runtime", (row,), method)
    eager = float(plan.summary.est_latency_with_decisions_s
                  or plan.summary.est_latency_s or 0.0)
    rows = [ArtifactTiming(Artifact.TORCH, eager,
                           note="each op its own kernel, eager's fixed cost")]
    fusion = plan.fusion
    if fusion is not None and fusion.est_latency_fused_s and fusion.est_latency_unfused_s:
        # the plan's fusion groups, at the decided precisions
        rows.append(ArtifactTiming(Artifact.TORCH_COMPILE, eager * float(fusion.est_latency_fused_s)
                                   / float(fusion.est_latency_unfused_s),
                                   note=f"{fusion.kernels_fused} fused kernels for "
                                        f"{fusion.nodes} nodes (cost/fusion.py)"))
    ort = _runtime_estimate(plan, eager, "onnx")
    rows.append(ArtifactTiming(Artifact.ONNXRUNTIME, ort,
                               note="each op at ONNX Runtime's measured fixed cost" if ort else
                               "not estimated: the target has no measured ONNX Runtime fixed "
                               "costs (graphopt calibrate measures them on a CPU)"))
    timed = [r for r in rows if r.seconds]
    rows.append(_openvino_row(plan, eager))
    if not timed:  # an empty batch: nothing to run, nothing to choose between
        return DeployChoice.of(Artifact.TORCH, False, "the plan estimates no time (no work to "
                               "run): the torch module, the simplest artifact", tuple(rows),
                               method)
    best = min(timed, key=lambda r: r.seconds or 0.0)
    est = ", ".join(f"{r.artifact} {r.seconds * 1e3:.3g} ms" for r in rows if r.seconds)
    if best.artifact != Artifact.TORCH and (best.seconds or 0.0) > eager * (1 - PREDICTED_MARGIN):
        best = rows[0]
        why = (f"estimated {est}: no other artifact is predicted {PREDICTED_MARGIN:.0%} faster "
               "than the torch module")
    else:
        why = f"estimated {est}: {best.artifact} is predicted fastest"
    ov = rows[-1]
    if ov.seconds and ov.seconds < (best.seconds or 0.0) * (1 - PREDICTED_MARGIN):
        best, why = ov, (f"estimated {est}: {ov.artifact} is predicted fastest, "
                         f"{PREDICTED_MARGIN:.0%} faster than the best of the others")
    elif ov.seconds:
        why += f" ({ov.artifact} is not predicted {PREDICTED_MARGIN:.0%} faster than it)"
    return DeployChoice.of(best.artifact, False, why, tuple(rows), method)


def _openvino_row(plan: Plan, eager_s: float) -> ArtifactTiming:
    """OpenVINO's predicted row: the plan with OpenVINO's fixed costs per op and per call, or
    why there is no estimate."""
    if plan.target.is_gpu:
        return ArtifactTiming(Artifact.OPENVINO, None, note="not a candidate: graphopt deploys "
                              "OpenVINO on CPUs")
    ov = _runtime_estimate(plan, eager_s, "openvino")
    if ov is None:
        return ArtifactTiming(Artifact.OPENVINO, None, note="not estimated: the target has no "
                              "measured OpenVINO fixed costs (target 'cpu' is calibrated with "
                              "them where openvino is installed)")
    return ArtifactTiming(Artifact.OPENVINO, ov + (call_cost(plan.target, "openvino") or 0.0),
                          note="each op at OpenVINO's measured fixed cost, plus its fixed cost "
                               "per call")


def _runtime_estimate(plan: Plan, eager_s: float, source: str) -> float | None:
    """The plan's estimate with each op's fixed cost as the runtime running a ``source`` graph
    pays it (``"onnx"``: ONNX Runtime, ``"openvino"``), or None when the target has no measured
    costs of that runtime (``for_runtime`` returns it unchanged)."""
    target = plan.target
    costs = for_runtime(target, source)
    if costs is target or target.is_gpu:
        return None
    delta = sum(fixed_cost(n.analysis, costs) - n.cost.overhead_s for n in plan.nodes
                if n.cost.overhead_s > 0)
    return max(eager_s + delta, 0.0) or None
