"""Same model, same precision decisions: the torch plan and the plan of graphopt's ONNX export
of it agree on which GEMM / norm / softmax nodes are fp32 islands (``decisions.precision.by_op``).

Compared by kernel class (derived from the canonical op: torch's ``Linear`` is ONNX's ``Gemm``
or ``MatMul``), as the set of (kernel class, island) pairs of each plan. The only differences
are the exporter's rewrites, each asserted with its reason below.

And one rule per node: the planner's precision (``precision.gemm``) makes the islands the
backends make, and the torch and ONNX passes apply them (x*x, softmax, layernorm, a Linear).
"""

from __future__ import annotations

from dataclasses import replace

import onnx
import pytest
import torch

import graphopt
from graphopt.analysis.kernel_class import GEMM_LIKE, KernelClass
from graphopt.decisions.precision.by_op import LOW_KINDS, island_reason, plan_decisions
from graphopt.decisions.precision.format import choose_precision, native_format
from graphopt.decisions.precision.gemm import carrier_format
from graphopt.decisions.precision.islands import ISLAND_OPS
from graphopt.frontends.onnx_export import export_torch
from graphopt.hardware import list_targets
from graphopt.ir import ops
from graphopt.ir.plan import NodePlan, Plan
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
            pairs.add((node.analysis.kernel_class.value, bool(d.detail.island)))
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


def test_a_square_is_an_island_by_canonical_op_and_inputs() -> None:
    """Mul(x, x) is Pow(x, 2) (same range, same reason); a product of two tensors is not."""
    assert "square" in island_reason("Mul", None, ["h", "h"])
    assert ISLAND_OPS["Pow"] in island_reason("Mul", None, ("h", "h"))
    for inputs in (["h", "g"], ["h"], ["", ""], [None, None], []):
        assert island_reason("Mul", None, inputs) is None, inputs
    assert island_reason("Add", None, ["h", "h"]) is None


@pytest.mark.parametrize("name", sorted(_EXPECTED))
def test_the_planners_islands_are_the_backends_rule(name: str) -> None:
    """On h100 (bf16 carrier) a plan node is fp32 exactly where ``precision.by_op`` makes it an
    island, with the same reason the backends record."""
    model, inputs = zoo()[name]
    for plan in (graphopt.plan(model, inputs, target="h100"),
                 graphopt.plan(export_torch(model, inputs).model, target="h100")):
        decided = plan_decisions(plan, "bf16")
        for node in plan.nodes:
            d, rule = node.decisions["precision"], decided.get(node.name)
            island = rule is not None and rule.detail.island
            assert (d.detail.format == "fp32") == island, (node.name, d.reason)
            assert not island or d.reason == rule.reason, (node.name, d.reason)


class _Square(torch.nn.Module):
    """LayerNorm -> Linear -> x*x -> softmax: one node per kind of decision."""

    def __init__(self) -> None:
        super().__init__()
        self.ln, self.fc = torch.nn.LayerNorm(16), torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(self.ln(x))
        return torch.softmax(h * h, -1)


def _kind(node: NodePlan) -> str | None:
    names = [t.name if t is not None else None for t in node.inputs]
    if node.op_type in LOW_KINDS:
        return "gemm"
    if node.op_type == "Mul":
        return "square" if len(names) == 2 and names[0] == names[1] else None
    return node.op_type if node.op_type in ("LayerNormalization", "Softmax") else None


def _by_kind(plan: Plan) -> dict[str, tuple[bool, str]]:
    """{kind: (fp32 island?, reason)} from each node's precision decision."""
    out = {}
    for n in plan.nodes:
        if (kind := _kind(n)) is not None:
            d = n.decisions["precision"]
            out[kind] = (d.detail.format == "fp32", d.reason if d.detail.format ==
                         "fp32" else "")
    return out


def test_plan_torch_and_onnx_backends_make_one_decision_per_node() -> None:
    """The plan's precision per node (planner) == what the torch pass applies == what the ONNX
    pass applies on the exported model: islands, with the same reason, and a low GEMM."""
    torch.manual_seed(0)
    model, x = _Square().eval(), torch.randn(2, 4, 16)
    proto = export_torch(model, (x,)).model
    seen = {"torch plan": _by_kind(graphopt.plan(model, (x,), target="h100")),
            "torch backend": _by_kind(graphopt.optimize(model, x, target="h100").plan),
            "ONNX plan": _by_kind(graphopt.plan(proto, target="h100")),
            "ONNX backend": _by_kind(graphopt.optimize(proto, target="h100").plan)}
    islands = {k: v[0] for k, v in seen["torch plan"].items()}
    assert islands == {"LayerNormalization": True, "gemm": False, "square": True,
                       "Softmax": True}
    assert "square" in seen["torch plan"]["square"][1]
    for where, decided in seen.items():
        assert decided == seen["torch plan"], where


def test_onnx_pass_makes_a_square_an_island_without_a_plan_node() -> None:
    """A node a pass added has no plan node: the ONNX pass asks the same rule by its op type
    and inputs, so Mul(h, h) is still an island (and the GEMM still fp16)."""
    from graphopt.backends.onnx.context import OnnxContext
    from graphopt.backends.onnx.precision import reduce_precision
    from graphopt.ir.options import Options

    torch.manual_seed(0)
    model, x = _Square().eval(), torch.randn(2, 4, 16)
    proto = export_torch(model, (x,)).model
    plan = graphopt.plan(proto, target="h100")
    ctx = OnnxContext(plan=replace(plan, nodes=()), target=plan.target, options=Options(),
                      samples=[], compute_dtype="fp16")
    assert reduce_precision(proto, ctx) is not None
    squares = [n for n in proto.graph.node if n.op_type == "Mul" and n.input[0] == n.input[1]]
    assert len(squares) == 1
    d = ctx.decisions[squares[0].name]["precision"]
    assert d.detail.role == "island" and "square" in d.reason
    assert all(ctx.decisions[n.name]["precision"].detail.format == "fp16"
               for n in proto.graph.node if n.op_type == "MatMul")

