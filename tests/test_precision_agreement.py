"""Same model, same precision decisions: the torch plan and the plan of graphopt's ONNX export
of it agree on which GEMM / norm / softmax nodes are fp32 islands (``decisions.precision_plan``).

Compared by kernel class (derived from the canonical op: torch's ``Linear`` is ONNX's ``Gemm``
or ``MatMul``), as the set of (kernel class, island) pairs of each plan. The only differences
are the exporter's rewrites, each asserted with its reason below.
"""

from __future__ import annotations

import onnx
import pytest
import torch

import graphopt
from graphopt import ops
from graphopt.analysis.kernel_class import GEMM_LIKE, KernelClass
from graphopt.decisions.gemm_precision import carrier_format
from graphopt.decisions.precision_format import choose_precision, native_format
from graphopt.decisions.precision_islands import ISLAND_OPS
from graphopt.decisions.precision_plan import plan_decisions
from graphopt.hardware import list_targets
from graphopt.onnx_export import export_torch
from graphopt.plan import Plan
from tests.zoo import zoo

_CLASSES = GEMM_LIKE | {KernelClass.NORM, KernelClass.RMSNORM, KernelClass.SOFTMAX}
#: torch-only decisions the ONNX export cannot have, and why
_FOLDED_BN = ("the TorchScript exporter folds eval-mode BatchNormalization into the conv "
              "before it, so the ONNX file has no norm node to keep in fp32")
#: ONNX-only decisions, and why
_SDPA_SPLIT = ("torch keeps scaled_dot_product_attention whole (one Attention node, low; its "
               "kernel keeps the softmax in fp32), the exporter writes MatMul -> Softmax -> "
               "MatMul, whose Softmax is an island")


def _islands(plan: Plan) -> tuple[set[tuple[str, bool]], set[str]]:
    """({(kernel class, island)} over decided GEMM/norm/softmax nodes, {their canonical ops})."""
    decided = plan_decisions(plan, "bf16")
    pairs, op_types = set(), set()
    for node in plan.nodes:
        d = decided.get(node.name)
        if d is not None and node.analysis.kernel_class in _CLASSES:
            pairs.add((node.analysis.kernel_class.value, bool(d.fields["island"])))
            op_types.add(node.op_type)
    return pairs, op_types


def _explain(torch_plan: Plan, onnx_plan: Plan) -> dict[tuple[str, bool], str]:
    """The differences this pair may show, each with its reason."""
    t_pairs, t_ops = _islands(torch_plan)
    allowed: dict[tuple[str, bool], str] = {}
    if ("norm", True) in t_pairs and t_ops & {"BatchNormalization"} and not any(
            n.op_type == "BatchNormalization" for n in onnx_plan.nodes):
        norms = {n.op_type for n in torch_plan.nodes
                 if n.analysis.kernel_class is KernelClass.NORM}
        if norms == {"BatchNormalization"}:
            allowed[("norm", True)] = _FOLDED_BN
    if "Attention" in t_ops and not any(n.op_type == "Attention" for n in onnx_plan.nodes):
        allowed[("softmax", True)] = _SDPA_SPLIT
        allowed[("attention", True)] = f"{_SDPA_SPLIT} (classed attention: part of the pattern)"
        allowed[("attention", False)] = f"{_SDPA_SPLIT}; its MatMuls may class as gemm"
    return allowed


def _agree(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], target: str) -> dict[
        tuple[str, bool], str]:
    torch_plan = graphopt.plan(model, inputs, target=target)
    onnx_plan = graphopt.plan(export_torch(model, inputs).model, target=target)
    t_pairs, _ = _islands(torch_plan)
    o_pairs, _ = _islands(onnx_plan)
    allowed = _explain(torch_plan, onnx_plan)
    unexplained = (t_pairs ^ o_pairs) - set(allowed)
    assert not unexplained, (f"torch {sorted(t_pairs)} vs ONNX {sorted(o_pairs)}: "
                             f"{sorted(unexplained)} differ without a reason")
    return {k: v for k, v in allowed.items() if k in t_pairs ^ o_pairs}


_EXPECTED = {  # model -> the differences it shows (by key); every other pair agrees
    "odd_residual_cnn": {("norm", True)},
    "tc_guide_cnn": set(),
    "convnet_grouped_depthwise": {("norm", True)},
    "norm_zoo": set(),  # GroupNorm exports as InstanceNormalization: both norm islands
    "odd_mlp": set(),
    "transformer_hd72": {("attention", True)},
    "rmsnorm_swiglu": set(),  # RMSNorm decomposed on both: every node of rmsnorm:N an island
}


@pytest.mark.parametrize("name", sorted(_EXPECTED))
def test_torch_and_onnx_plans_agree_on_islands(name: str) -> None:
    model, inputs = zoo()[name]
    diffs = _agree(model, inputs, "h100")
    assert set(diffs) == _EXPECTED[name], diffs
    assert all(diffs.values())


@pytest.mark.zoo
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning",
                            "ignore::UserWarning")
@pytest.mark.parametrize(("name", "expected"), [
    ("llama", {("softmax", True), ("attention", False)}),
    ("gpt2", {("softmax", True), ("attention", False)}),
    ("t5_encoder", {("attention", True)})])
def test_torch_and_onnx_plans_agree_on_islands_for_architectures(
        name: str, expected: set[tuple[str, bool]]) -> None:
    pytest.importorskip("transformers")
    from tests.arch_zoo import build

    model, inputs = build(name)
    assert set(_agree(model, inputs, "h100")) == expected



def test_one_rule_for_a_targets_default_format() -> None:
    """The model-level "auto" choice and the plan's carrier format are the same rule."""
    for target in list_targets():
        fmt = native_format(target)
        assert choose_precision(target, "auto")[0] == fmt, target.display_name
        assert carrier_format(target, "fp32")[0] == fmt, target.display_name


def test_island_rule_is_keyed_by_canonical_op() -> None:
    """Every island key is graphopt's vocabulary or an ONNX operator, never an ATen name."""
    for op in ISLAND_OPS:
        assert op in ops.KNOWN_OPS or onnx.defs.has(op), op
