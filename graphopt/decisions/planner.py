"""Build a :class:`~graphopt.ir.plan.Plan`: annotate the graph, cost every node, summarize."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import replace

from graphopt.analysis import KernelClass, annotate
from graphopt.cost import estimate_all
from graphopt.cost.calibrated import for_runtime
from graphopt.cost.fusion import fusion_section
from graphopt.cost.ort_fusion import execution_provider
from graphopt.decisions.decide import decide
from graphopt.decisions.range_plan import at_opt, with_hints, with_range
from graphopt.hardware.profile import HardwareProfile
from graphopt.ir.graph import Graph
from graphopt.ir.plan import NodePlan, Plan
from graphopt.ir.plan_summary import CostlyNode, ModelInfo, Summary, TensorSpec

__all__ = ["build_plan", "model_info"]

logger = logging.getLogger(__name__)

_COSTLIEST = 10


def model_info(graph: Graph) -> ModelInfo:
    """The ``model`` section of the report: name, source, size and its inputs/outputs."""
    params = [t for t in graph.tensors.values() if t.kind == "param"]
    return ModelInfo(
        name=graph.name, source=graph.source, num_nodes=len(graph.nodes),
        param_count=sum(t.numel for t in params), param_bytes=sum(t.nbytes for t in params),
        inputs=tuple(TensorSpec.of(graph.tensors[t]) for t in graph.inputs
                     if t in graph.tensors),
        outputs=tuple(TensorSpec.of(graph.tensors[t]) for t in graph.outputs
                      if t in graph.tensors))


def build_plan(graph: Graph, target: HardwareProfile, *, decisions: bool = True) -> Plan:
    """Analyze and cost ``graph`` on ``target``, then decide per node and per model (precision,
    execution path, memory, quantization, runtime settings) unless ``decisions`` is False.

    A graph with a shape range is planned at its opt point and costed at min and max too
    (:mod:`graphopt.decisions.range_plan`).
    """
    target = for_runtime(target, graph.source)  # a calibrated CPU: its runtime's fixed costs
    if graph.shape_range:
        ranged = with_range(build_plan(at_opt(graph), target, decisions=False), graph, target)
        if not decisions:
            return with_hints(ranged, graph, target)
        return with_fusion(with_hints(decide(ranged), graph, target))
    analyses = annotate(graph)
    costs = estimate_all(analyses, target)
    nodes = tuple(
        NodePlan(name=n.name, op=n.source_op, op_type=n.op_type, analysis=analyses[n.name],
                 cost=costs[n.name],
                 inputs=tuple(graph.input_infos(n)), outputs=tuple(graph.output_infos(n)))
        for n in graph.nodes
    )
    summary = summarize(nodes)
    warnings = list(graph.warnings)
    flagged = summary.flagged_nodes
    if flagged.get("dynamic_shape"):
        warnings.append(_unknown_dims_warning(nodes, flagged["dynamic_shape"]))
    if flagged.get("unknown_shape"):
        warnings.append(f"{flagged['unknown_shape']} nodes have outputs of unknown shape: their "
                        "cost is a lower bound")
    if flagged.get("zero_size"):
        warnings.append(f"{flagged['zero_size']} nodes touch zero-size tensors: they do no work")
    if summary.unsupported_ops:
        ops = ", ".join(f"{op} x{c}" for op, c in summary.unsupported_ops.items())
        warnings.append(f"ops graphopt does not know are kept as they are and classed "
                        f"'other': {ops}")
    logger.info("planned %d nodes on %s: %.3g s", len(nodes), target.name,
                summary.est_latency_s)
    plan = Plan(model=model_info(graph), target=target, nodes=nodes, summary=summary,
                warnings=tuple(warnings))
    if not decisions:
        return plan
    return with_fusion(decide(plan))


def _unknown_dims_warning(nodes: tuple[NodePlan, ...], count: int) -> str:
    """The dynamic-shape warning, naming the nodes and the dims no input size decides."""
    named = []
    for n in nodes:
        if "dynamic_shape" not in n.analysis.flags:
            continue
        dims = dict.fromkeys(str(d) for t in (*n.inputs, *n.outputs) if t is not None
                             and t.shape is not None for d in t.shape if not isinstance(d, int))
        named.append(f"{n.name} ({', '.join(dims)})")
        if len(named) == 5:
            break
    more = f" and {count - len(named)} more" if count > len(named) else ""
    return (f"{count} nodes have dimensions that no input size decides, each planned as 1: "
            f"{'; '.join(named)}{more}; give static example shapes, or sizes for every "
            "symbolic input dim, for exact numbers")


def with_fusion(plan: Plan) -> Plan:
    """``plan`` with its fusion groups (:mod:`graphopt.cost.fusion`): the ``fusion`` section
    and ``summary.est_latency_fused_s`` beside the unfused ``est_latency_s``. An ONNX model is
    grouped as ONNX Runtime fuses it for the target's execution provider, which is where it
    runs (:mod:`graphopt.cost.ort_fusion`)."""
    ep = execution_provider(plan.target) if plan.model.source == "onnx" else None
    # the summary ranks what runs (``costliest_kernels``, fused) beside the nodes (unfused)
    section, kernels = fusion_section(plan.nodes, plan.model.output_names, ep)
    return replace(plan, summary=replace(plan.summary,
                                         est_latency_fused_s=section.est_latency_fused_s,
                                         costliest_kernels=kernels),
                   fusion=section)


def summarize(nodes: tuple[NodePlan, ...]) -> Summary:
    """Totals, bottleneck mix, time per kernel class, costliest nodes, unsupported ops."""
    total = sum(n.cost.est_time_s for n in nodes)
    kernels = [n for n in nodes if n.analysis.kernel_class is not KernelClass.VIEW]
    mix = Counter(n.cost.bottleneck for n in kernels)
    time_by_bound: Counter[str] = Counter()
    time_by_class: Counter[str] = Counter()
    for n in nodes:
        time_by_bound[n.cost.bottleneck] += n.cost.est_time_s
        time_by_class[n.analysis.kernel_class.value] += n.cost.est_time_s
    classes = Counter(n.analysis.kernel_class.value for n in nodes)
    # pattern ids are "name:index": count the distinct instances of each pattern name
    instances = Counter(p.split(":")[0] for p in {n.analysis.pattern for n in nodes
                                                  if n.analysis.pattern})
    costliest = sorted(kernels, key=lambda n: (-n.cost.est_time_s, n.name))[:_COSTLIEST]
    unsupported = Counter(n.op for n in nodes if "unsupported_op" in n.analysis.flags)
    flags = Counter(f for n in nodes for f in n.analysis.flags)
    return Summary(
        est_latency_s=total,
        total_flops=sum(n.analysis.flops for n in nodes),
        total_bytes=sum(n.analysis.bytes_total for n in nodes),
        node_count=len(nodes),
        kernel_count=len(kernels),
        bottleneck_mix={b: mix.get(b, 0) for b in ("compute", "memory", "latency")},
        time_by_bottleneck_s={b: time_by_bound.get(b, 0.0)
                              for b in ("compute", "memory", "latency")},
        kernel_class_counts=dict(sorted(classes.items())),
        time_by_kernel_class_s=dict(sorted(time_by_class.items())),
        patterns=dict(sorted(instances.items())),
        costliest_nodes=tuple(
            CostlyNode(name=n.name, kernel_class=n.analysis.kernel_class.value,
                       est_time_s=n.cost.est_time_s,
                       share=n.cost.est_time_s / total if total else 0.0)
            for n in costliest),
        unsupported_ops=dict(sorted(unsupported.items())),
        flagged_nodes=dict(sorted(flags.items())),
    )
