"""ONNX Runtime's fusions, per execution provider: the kernels an ``.onnx`` file really runs as.

An ONNX model is deployed on ONNX Runtime, whose graph optimizer fuses only the sub-graphs its
transformers recognise, each for a fixed list of execution providers (EPs). Grouping such a plan
the Inductor way (:mod:`graphopt.cost.fusion`) would invent kernels ORT never launches, so here
the groups replay ORT's transformers, in ORT's order, on the plan's nodes:

1. Each node starts as one unit whose op is the op ORT sees.
2. Each rule below, in the order ``GenerateTransformers`` registers it (Level 1, 2, then 3 of
   ``ORT_ENABLE_ALL``), walks the units in graph order and merges a match into one unit that
   carries the fused op's name, so later rules see it as ORT does (MatMul+Add becomes a Gemm,
   which GemmActivationFusion can then take with its Relu; a fused LayerNormalization can take
   its residual Add as SkipLayerNormalization).
3. A rule whose EP list lacks the target's EP does not run: ConvActivationFusion lists no CUDA,
   so on an NVIDIA target Conv and Relu stay two kernels.

The rules are :mod:`.ort_rules`'s table (the EP lists come from
``onnxruntime/core/optimizer/graph_transformer_utils.cc`` at commit
001290de2e0ce8429d461156843f7ce9b19e7a5d, microsoft/onnxruntime) joined with
:mod:`.ort_match`'s patterns (each read from its own ``*_fusion.cc``, cited beside it with the
commit read); :mod:`.ort_view` keeps the units' edges as they merge. Constant *values*
(GeluFusion's sqrt(2), 1 and 0.5; an epsilon) are not in the plan: a rule checks that the
operand is a constant of the right shape. Not modelled, so their nodes stay separate kernels
here: the BERT-only AttentionFusion and EmbedLayerNormFusion, GroupQueryAttentionFusion (CUDA),
BiasSoftmax and MatmulTransposeFusion (they read attributes the plan does not keep), PadFusion,
the QDQ and quantization fusions, and x86's NchwcTransformer (it fuses the same
Conv+Add+activation as ConvAddActivationFusion). MultiHeadAttention and RotaryEmbedding come
from ORT's offline ``onnxruntime.transformers`` tool, not from a session's optimizer, so they are
not here either.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from graphopt.cost.ort_match import MATCHERS, Match
from graphopt.cost.ort_rules import CPU_ACL_CUDA_DML_ROCM as CPU_ACL_CUDA_DML_ROCM
from graphopt.cost.ort_rules import CPU_CUDA_DML_ROCM as CPU_CUDA_DML_ROCM
from graphopt.cost.ort_rules import CPU_CUDA_ROCM as CPU_CUDA_ROCM
from graphopt.cost.ort_rules import CPU_EP, CUDA_EP, FUSIONS, MAX_STEPS, NOT_FOLDED, ROCM_EP
from graphopt.cost.ort_rules import CPU_ONLY as CPU_ONLY
from graphopt.cost.ort_rules import CPU_ROCM_ACL_ARMNN_JS_WEBGPU as CPU_ROCM_ACL_ARMNN_JS_WEBGPU
from graphopt.cost.ort_view import OrtUnit, UnitView
from graphopt.ir.graph import TensorInfo

__all__ = ["CPU_EP", "CUDA_EP", "ROCM_EP", "RULES", "OrtRule", "OrtUnit", "execution_provider",
           "ort_units"]


def execution_provider(target: Any) -> str:
    """The EP graphopt's session config picks for ``target`` (``backends.onnx.session``):
    CUDA on NVIDIA GPUs, ROCm on AMD GPUs, else the CPU EP."""
    if getattr(target, "kind", "cpu") == "gpu":
        vendor = str(getattr(target, "vendor", "")).lower()
        if vendor == "nvidia":
            return CUDA_EP
        if vendor == "amd":
            return ROCM_EP
    return CPU_EP


@dataclass(frozen=True)
class OrtRule:
    """One ORT transformer: its name, the op it makes, its EPs (None: every EP) and where its
    pattern and EP list were read."""

    name: str
    fused_op: str
    level: int
    eps: frozenset[str] | None
    source: str
    match: Match


#: :data:`.ort_rules.FUSIONS` with their patterns, in the order ORT registers them
RULES: tuple[OrtRule, ...] = tuple(
    OrtRule(f.name, f.fused_op, f.level, f.eps, f.source, MATCHERS[f.name]) for f in FUSIONS)
# the ops each transformer starts its match from: any other unit is skipped without a look
_STARTS: dict[str, frozenset[str]] = {f.name: f.starts for f in FUSIONS}


def ort_units(nodes: Sequence[Any], graph_outputs: Sequence[str], ep: str) -> list[OrtUnit]:
    """The kernels ORT runs for ``nodes`` (``NodePlan``: name, op, inputs, outputs) on ``ep``,
    in graph order. As ORT's GraphTransformerManager does, each level's rules are applied in
    order, over and over until none fires (at most ``MAX_STEPS`` rounds), before the next level."""
    units = _folded([OrtUnit(n.op, [n.name], list(n.inputs), list(n.outputs)) for n in nodes])
    view = UnitView(units, set(graph_outputs), ep)
    for level in (1, 2, 3):
        rules = [r for r in RULES if r.level == level and (r.eps is None or ep in r.eps)]
        for _ in range(MAX_STEPS):
            fired = False
            for rule in rules:
                starts = _STARTS[rule.name]
                for u in [u for u in view.units if u.alive and u.op in starts]:
                    if not u.alive:  # merged by this rule since the list was made
                        continue
                    found = rule.match(view, u)
                    if found and all(m.alive for m in found) and \
                            len({id(m) for m in found}) == len(found):
                        view.merge(found, rule.fused_op, rule.name)
                        fired = True
            if not fired:
                break
    return [u for u in view.units if u.alive]


def _folded(units: list[OrtUnit]) -> list[OrtUnit]:
    """Level 1's ConstantFolding first: a node whose inputs are all constants (or a Shape of a
    static tensor) becomes an initializer; its readers then see a constant (``kind``), as the
    rules after it do in ORT (a scale computed as sqrt(sqrt(1/d)) is a scalar constant)."""
    const: dict[str, TensorInfo] = {}
    for u in units:
        u.inputs = [const.get(t.name, t) if t is not None else None for t in u.inputs]
        ins = [t for t in u.inputs if t is not None]
        if u.op in NOT_FOLDED or not ins or not (
                all(t.kind in ("param", "constant") for t in ins) or
                (u.op == "Shape" and ins[0].is_static)):
            continue
        u.folded, u.op = True, "Constant"
        u.outputs = [None if t is None else replace(t, kind="constant") for t in u.outputs]
        const.update({t.name: t for t in u.outputs if t is not None})
    return units
