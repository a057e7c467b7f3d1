"""The cleanup pass's effect on graphopt's IR, for ``graphopt.plan``'s dry run.

The padding pass reads the graph the cleanup pass (:mod:`.cleanup`) leaves: BatchNorms folded
into the conv/linear before them, eval dropouts gone. The dry run needs that graph without
running the pass, which would unlift the exported program into a module first (most of the dry
run's time on a small CNN). This applies the same rules, in the same node order, to the plan's
IR: a BatchNorm folds when its input is a conv1d/2d/3d or linear output read by nothing else,
its running statistics and the weight are constants and it is in eval mode; an eval dropout is
dropped. Readers of a removed node read its input instead. The decisions (``fold``, ``drop``)
and their reasons are the pass's own. ``tests/test_plan_dry_run.py`` checks the two agree.
"""

from __future__ import annotations

from dataclasses import replace

from graphopt.backends.torch.cleanup import (
    BATCHNORMS,
    DROPOUTS,
    DROPPED,
    FOLDS_INTO,
    NOT_AFTER_GEMM,
    STATS_NOT_CONSTANT,
    TRAINING_BN,
    TRAINING_DROPOUT,
    WEIGHT_NOT_CONSTANT,
    other_readers,
    record_fold,
)
from graphopt.decisions.rewrites import DryRunContext
from graphopt.ir.decision_details import DropDetail, FoldDetail
from graphopt.ir.graph import Graph, Node, TensorInfo

__all__ = ["cleaned_graph"]

_CONSTANT = ("param", "constant")


def _aten(node: Node) -> str:
    """``aten.batch_norm.default`` -> ``batch_norm`` (the fx pass's ``is_aten`` name)."""
    parts = node.source_op.split(".")
    return parts[1] if len(parts) >= 2 and parts[0] == "aten" else ""


def _fold_blocked(graph: Graph, bn: Node, src: Node | None, readers: int) -> str | None:
    """Why the cleanup pass keeps this BatchNorm (its reason), or None: it folds."""
    if src is None or _aten(src) not in FOLDS_INTO:
        return NOT_AFTER_GEMM
    if readers != 1:
        return other_readers(src.name)
    if bn.attrs.get("training_mode"):
        return f"kept: {TRAINING_BN}"
    stats = [graph.tensor(t) for t in bn.inputs[3:5]]
    if len(stats) < 2 or any(t is None or t.kind not in _CONSTANT for t in stats):
        return f"kept: {STATS_NOT_CONSTANT}"
    w = graph.tensor(src.inputs[1]) if len(src.inputs) > 1 else None
    if w is None or w.kind not in _CONSTANT:
        return WEIGHT_NOT_CONSTANT
    return None


def _with_bias(graph: Graph, src: Node, tensors: dict[str, TensorInfo]) -> Node:
    """The folded op has a bias (b' = (b - mu) * g / s + beta) even when it had none."""
    if len(src.inputs) > 2 and src.inputs[2]:
        return src
    out = graph.tensor(src.outputs[0])
    channels = out.shape[1 if _aten(src) != "linear" else -1] if out and out.shape else None
    name = f"{src.name}_folded_bias"
    tensors[name] = TensorInfo(name, (channels,) if isinstance(channels, int) else None,
                               out.dtype if out else None, "param")
    return replace(src, inputs=[*src.inputs[:2], name])


def cleaned_graph(graph: Graph, ctx: DryRunContext) -> Graph:
    """``graph`` as the cleanup pass leaves it; its decisions land on ``ctx``."""
    alias: dict[str, str] = {}  # output of a removed node -> what its readers read instead
    tensors = dict(graph.tensors)
    readers = {t: len(ns) + graph.outputs.count(t) for t, ns in graph.consumers.items()}
    nodes: list[Node] = []
    index: dict[str, int] = {}  # node name -> its place in ``nodes``
    for old in graph.nodes:
        node = replace(old, inputs=[alias.get(t, t) for t in old.inputs])
        op = _aten(node)
        if op in DROPOUTS:
            if node.attrs.get("training_mode"):
                ctx.decide(node.name, DropDetail(), TRAINING_DROPOUT, applied=False)
            else:
                alias[node.outputs[0]] = node.inputs[0]
                readers[node.inputs[0]] = readers.get(node.inputs[0], 0) - 1 + \
                    readers.get(node.outputs[0], 0)
                ctx.decide(node.name, DropDetail(), DROPPED)
                continue
        elif op in BATCHNORMS:
            src = graph.producer.get(node.inputs[0]) if node.inputs else None
            src = nodes[index[src.name]] if src is not None and src.name in index else src
            why = _fold_blocked(graph, node, src, readers.get(node.inputs[0], 0))
            if why is None and src is not None:
                nodes[index[src.name]] = _with_bias(graph, src, tensors)
                alias[node.outputs[0]] = node.inputs[0]
                readers[node.inputs[0]] = readers.get(node.outputs[0], 0)
                record_fold(ctx, node.name, src.name)
                continue
            ctx.decide(node.name, FoldDetail(), why, applied=False)
        index[node.name] = len(nodes)
        nodes.append(node)
    outputs = [alias.get(t, t) for t in graph.outputs]
    return Graph(graph.name, graph.source, nodes, tensors, list(graph.inputs), outputs,
                 list(graph.warnings), graph.source_model, graph.shape_range)
