"""One precision rule table for both backends (``decisions.precision.roles``, issue 20 item 3).

The rule function case by case, in both backends' words; the named exceptions (ONNX lowers to
fp16 only; the op tables' one difference); inf/NaN constants decided once, by value, with
numbers compared before and after the rewrite on both backends; and one small model that gets
the same role per node from the torch pass and from the ONNX pass on its export.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import fx, nn

from graphopt.analysis.kernel_class import KernelClass
from graphopt.analysis.record import NodeAnalysis
from graphopt.backends.onnx import precision as onnx_precision
from graphopt.backends.onnx.context import OnnxContext
from graphopt.backends.torch import precision_rules as torch_rules
from graphopt.backends.torch.pipeline import prepare
from graphopt.backends.torch.precision import _Assigner, reduce_precision
from graphopt.decisions.planner import build_plan
from graphopt.decisions.precision.by_op import LOW_KINDS
from graphopt.decisions.precision.islands import ISLAND_OPS, SIGNIFICAND_BITS
from graphopt.decisions.precision.roles import (
    BACKEND_FORMATS,
    FORMAT_MAX,
    OP_TABLE_EXCEPTIONS,
    RULES,
    Backend,
    Const,
    NodeFacts,
    OpClass,
    Outcome,
    Role,
    assign_role,
    constant_fits,
    mean_limit,
    outcome,
)
from graphopt.decisions.tolerance import tolerance_for
from graphopt.frontends.onnx_export import export_torch
from graphopt.frontends.onnx_frontend import load_onnx
from graphopt.hardware import get_target
from graphopt.ir.options import Options
from graphopt.ir.plan import NodePlan

BOTH = (Backend.TORCH, Backend.ONNX)


def _plan_node(op_type: str, kc: KernelClass = KernelClass.ELEMENTWISE,
               pattern: str | None = None) -> NodePlan:
    """A plan node with just what the precision rules read (canonical op, kernel class)."""
    analysis = NodeAnalysis(kc, {}, 0, 0, 0, 0, "fp32", pattern)
    return NodePlan(name="n", op=op_type, op_type=op_type, analysis=analysis, cost=None,
                    inputs=(), outputs=())


def _role(facts: NodeFacts, fmt: str = "fp16", backend: Backend = Backend.ONNX,
          ) -> tuple[Role, str]:
    return assign_role(facts, fmt, backend, unit="tensor cores (sm_90)")


# --------------------------------------------------------------------------- the rule table
def test_every_outcome_has_a_role_and_both_backends_words() -> None:
    assert set(RULES) == set(Outcome)
    for rule in RULES.values():
        assert isinstance(rule.role, Role) and rule.torch and rule.onnx


@pytest.mark.parametrize("backend", BOTH)
def test_a_result_that_is_not_fp32_keeps_its_inputs_dtypes(backend: Backend) -> None:
    role, why = _role(NodeFacts("eq", OpClass.OTHER, result=None), backend=backend)
    assert role is Role.KEEP
    assert why == ("kept: integer/bool result; reads its inputs at their original dtype, so "
                   "comparisons and thresholds are not rounded" if backend is Backend.TORCH
                   else "no fp32 result (integer/bool/other): inputs at their original dtypes")
    facts = NodeFacts("add", OpClass.FOLLOW, result="fp16", acts=(("x", "fp16"),))
    assert _role(facts, backend=Backend.TORCH)[1].startswith("kept: fp16 result;")


def test_a_backends_own_reason_keeps_a_node_fp32_verbatim() -> None:
    facts = NodeFacts("MatMul", OpClass.LOW, excluded="kept fp32 by the accuracy guard")
    assert _role(facts) == (Role.WIDE, "kept fp32 by the accuracy guard")


@pytest.mark.parametrize("backend", BOTH)
def test_the_plans_island_comes_before_the_constants(backend: Backend) -> None:
    """A LayerNorm whose weight would not fit fp16 is an island (why it is fp32), on both
    backends: the constants are a legality check of going low, asked only on that path."""
    facts = NodeFacts("LayerNormalization", OpClass.OTHER,
                      plan=_plan_node("LayerNormalization", KernelClass.NORM),
                      consts=(Const("w", 1e6),))
    role, why = _role(facts, backend=backend)
    assert role is Role.ISLAND and why.startswith("fp32 island: norm kernel;")


@pytest.mark.parametrize("backend", BOTH)
def test_a_square_a_pass_added_is_an_island_by_its_canonical_op(backend: Backend) -> None:
    facts = NodeFacts("mul", OpClass.FOLLOW, canonical="Mul", inputs=("h", "h"),
                      acts=(("h", "fp16"),))
    assert _role(facts, backend=backend) == (
        Role.ISLAND, f"fp32 island: x*x is a square; {ISLAND_OPS['Pow']}")
    product = NodeFacts("mul", OpClass.FOLLOW, canonical="Mul", inputs=("h", "g"),
                        acts=(("h", "fp16"), ("g", "fp16")))
    assert _role(product, backend=backend)[0] is Role.LOW


@pytest.mark.parametrize("fmt", ["bf16", "fp16"])
def test_gemm_like_on_the_plan_runs_low_with_the_plans_reason(fmt: str) -> None:
    facts = NodeFacts("linear", OpClass.LOW, plan=_plan_node("Gemm", KernelClass.GEMM),
                      work="GEMM")
    assert _role(facts, fmt, Backend.TORCH) == (Role.LOW, f"{fmt}: GEMM with fp32 accumulation")
    if fmt in BACKEND_FORMATS[Backend.ONNX]:
        assert _role(facts, fmt) == (Role.LOW, f"{fmt}: GEMM with fp32 accumulation")


@pytest.mark.parametrize("plan", [None, _plan_node("aten.custom_gemm", KernelClass.GEMM)])
def test_without_a_canonical_op_on_the_plan_the_op_table_decides(plan: NodePlan | None) -> None:
    facts = NodeFacts("MatMul", OpClass.LOW, plan=plan, work="GEMM")
    assert _role(facts, backend=Backend.TORCH) == (Role.LOW,
                                                   "fp16: GEMM on tensor cores (sm_90)")
    assert _role(facts) == (Role.LOW, "GEMM in fp16 with fp32 accumulation")


def test_gemm_like_on_the_plan_without_an_edit_here_cant_apply() -> None:
    facts = NodeFacts("Attention", OpClass.OTHER, plan=_plan_node("Attention",
                                                                  KernelClass.ATTENTION))
    assert _role(facts) == (Role.ISLAND, "kept fp32: can't apply here: Attention has no fp16 "
                            "rewrite in this pass (the plan: fp16: attention with fp32 "
                            "accumulation)")
    assert _role(facts, "bf16", Backend.TORCH)[1].startswith(
        "kept fp32: can't apply here: aten.Attention has no bf16 path in this pass")


@pytest.mark.parametrize("fmt", ["bf16", "fp16"])
def test_a_mean_runs_low_only_over_2_to_the_significand_bits(fmt: str) -> None:
    limit = 2 ** SIGNIFICAND_BITS[fmt]
    assert mean_limit(fmt) == limit

    def mean(count: int | None) -> NodeFacts:
        return NodeFacts("mean", OpClass.MEAN, count=count, acts=(("x", fmt),))

    assert _role(mean(limit), fmt, Backend.TORCH)[0] is Role.LOW
    assert _role(mean(limit + 1), fmt, Backend.TORCH) == (
        Role.ISLAND, f"fp32 island: averages {limit + 1} elements, more than the {limit} a "
        f"{fmt} sum adds exactly")
    assert "an unknown number of" in _role(mean(None), fmt, Backend.TORCH)[1]
    if fmt == "fp16":
        assert _role(mean(4096)) == (Role.ISLAND, "mean over 4096 elements: an fp16 running "
                                     "sum stalls past 2^11")


def test_an_op_off_the_allowlist_is_an_island() -> None:
    facts = NodeFacts("cumprod", OpClass.OTHER, acts=(("x", "bf16"),))
    assert _role(facts, "bf16", Backend.TORCH) == (
        Role.ISLAND, "fp32 island: aten.cumprod is not on the reduced-precision allowlist, so "
        "its numerics are not risked")
    assert _role(NodeFacts("Hardmax", OpClass.OTHER)) == (
        Role.ISLAND, "Hardmax: numerics in fp16 not known to be safe")


@pytest.mark.parametrize(("acts", "which", "torch_words"), [
    ((), Outcome.NO_ACTIVATION, "fp32: reads no reduced-precision activation"),
    ((("a", "fp32"), ("b", "fp32")), Outcome.ALL_WIDE, "fp32: no input is in reduced precision"),
    ((("a", "bf16"), ("b", "fp32")), Outcome.MIXED,
     "fp32: input b is fp32; mixed inputs run at the wider type (autocast's rule), so a fp32 "
     "residual stream keeps its precision"),
    ((("a", "bf16"), ("b", "bf16")), Outcome.FOLLOWS, "bf16: follows its inputs (no cast needed)"),
])
def test_follow_ops_take_the_widest_input(acts: tuple[tuple[str, str], ...], which: Outcome,
                                          torch_words: str) -> None:
    facts = NodeFacts("add", OpClass.FOLLOW, acts=acts, consts=(Const("bias", 1.0),))
    assert outcome(facts, "bf16")[0] is which
    assert _role(facts, "bf16", Backend.TORCH) == (RULES[which].role, torch_words)
    onnx_acts = tuple((n, "fp16" if d == "bf16" else d) for n, d in acts)
    role, words = _role(NodeFacts("Add", OpClass.FOLLOW, acts=onnx_acts))
    assert role is RULES[which].role
    assert words == ("follows its fp16 inputs" if which is Outcome.FOLLOWS
                     else "an input is fp32 (widest-input rule)")


def test_a_constant_that_does_not_fit_keeps_a_low_node_fp32() -> None:
    big = (Const("w", 1e5),)
    gemm = NodeFacts("MatMul", OpClass.LOW, plan=_plan_node("MatMul", KernelClass.GEMM),
                     consts=big)
    assert _role(gemm) == (Role.WIDE, "constant w (max |v| 1e+05) does not fit fp16")
    assert _role(gemm, "fp16", Backend.TORCH) == (
        Role.WIDE, "fp32: w holds values beyond fp16's range (65504); converting it would "
        "give inf")
    assert _role(gemm, "bf16", Backend.TORCH)[0] is Role.LOW  # bf16 has fp32's range
    huge = NodeFacts("add", OpClass.FOLLOW, acts=(("x", "bf16"),),
                     consts=(Const("mask", float(torch.finfo(torch.float32).max)),))
    assert _role(huge, "bf16", Backend.TORCH) == (
        Role.WIDE, "fp32: mask holds values beyond bf16's range (3.38953e+38); converting it "
        "would give inf")
    # a follow op whose inputs are not low says so, whatever its constants
    wide = NodeFacts("Add", OpClass.FOLLOW, acts=(("x", "fp32"),), consts=big)
    assert _role(wide) == (Role.WIDE, "an input is fp32 (widest-input rule)")


def test_a_constant_fits_when_its_finite_values_do() -> None:
    """inf converts to inf and NaN to NaN exactly: only finite values can overflow."""
    for fmt, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        assert FORMAT_MAX[fmt] == torch.finfo(dtype).max
        assert constant_fits(FORMAT_MAX[fmt], fmt)
        assert not constant_fits(float(torch.finfo(torch.float32).max), fmt)
        special = torch.tensor([-math.inf, math.inf, math.nan, 1.0])
        assert torch.equal(special.to(dtype).float().nan_to_num(7.0), special.nan_to_num(7.0))
    assert not constant_fits(65520.0, "fp16") and constant_fits(65520.0, "bf16")


# ------------------------------------------------------------------------ named exceptions
def test_onnx_lowers_to_fp16_only() -> None:
    """Named exception ``BACKEND_FORMATS``: ONNX's mean limit is fp16's 2**11, its constants
    are checked against 65504, and the table refuses bf16 for it."""
    assert BACKEND_FORMATS[Backend.ONNX] == ("fp16",)
    assert set(BACKEND_FORMATS[Backend.TORCH]) == {"bf16", "fp16"}
    with pytest.raises(ValueError, match="does not lower to bf16"):
        assign_role(NodeFacts("Add", OpClass.FOLLOW), "bf16", Backend.ONNX)


#: (ATen op, ONNX op) that are the same computation; the ONNX op is the canonical one
_PAIRS = [
    ("linear", "Gemm"), ("addmm", "Gemm"), ("matmul", "MatMul"), ("mm", "MatMul"),
    ("bmm", "MatMul"), ("einsum", "Einsum"), ("conv2d", "Conv"), ("convolution", "Conv"),
    ("conv_transpose2d", "ConvTranspose"), ("scaled_dot_product_attention", "Attention"),
    ("mean", "ReduceMean"), ("avg_pool2d", "AveragePool"),
    ("adaptive_avg_pool2d", "GlobalAveragePool"),
    ("add", "Add"), ("sub", "Sub"), ("mul", "Mul"), ("div", "Div"), ("neg", "Neg"),
    ("abs", "Abs"), ("relu", "Relu"), ("gelu", "Gelu"), ("sigmoid", "Sigmoid"),
    ("tanh", "Tanh"), ("hardsigmoid", "HardSigmoid"), ("hardswish", "HardSwish"),
    ("leaky_relu", "LeakyRelu"), ("elu", "Elu"), ("selu", "Selu"), ("celu", "Celu"),
    ("mish", "Mish"), ("_prelu_kernel", "PRelu"), ("prelu", "PRelu"), ("clamp", "Clip"),
    ("where", "Where"), ("maximum", "Max"), ("minimum", "Min"), ("erf", "Erf"),
    ("sign", "Sign"), ("floor", "Floor"), ("ceil", "Ceil"), ("round", "Round"),
    ("dropout", "Dropout"), ("alias", "Identity"), ("view", "Reshape"), ("reshape", "Reshape"),
    ("permute", "Transpose"), ("flatten", "Flatten"), ("squeeze", "Squeeze"),
    ("unsqueeze", "Unsqueeze"), ("cat", "Concat"), ("split", "Split"), ("slice", "Slice"),
    ("index_select", "Gather"), ("embedding", "Gather"), ("gather", "GatherElements"),
    ("index", "GatherND"), ("expand", "Expand"), ("repeat", "Tile"),
    ("constant_pad_nd", "Pad"), ("max_pool2d", "MaxPool"), ("adaptive_max_pool2d",
                                                           "GlobalMaxPool"),
    ("amax", "ReduceMax"), ("amin", "ReduceMin"), ("pixel_shuffle", "DepthToSpace"),
    ("pixel_unshuffle", "SpaceToDepth"), ("upsample_nearest2d", "Resize"),
    ("upsample_bilinear2d", "Resize"), ("triu", "Trilu"), ("index_put", "ScatterND"),
    ("scatter", "ScatterElements"), ("threshold", "ThresholdedRelu"),
    ("hardshrink", "Shrink"), ("softshrink", "Shrink"), ("topk", "TopK"),
    # islands by the plan on both (the op tables leave them out)
    ("softmax", "Softmax"), ("layer_norm", "LayerNormalization"), ("exp", "Exp"),
    ("pow", "Pow"), ("sqrt", "Sqrt"), ("sum", "ReduceSum"), ("log", "Log"),
]
#: ONNX ops of the tables with no single ATen op (torch writes them as several)
_ONNX_ONLY = {"Sum": "n-ary Add", "Softsign": "x / (1 + |x|)"}


def _classes(aten: str, onnx_op: str) -> tuple[OpClass, OpClass]:
    return torch_rules.TABLES.op_class(aten), onnx_precision.TABLES.op_class(onnx_op)


def test_the_op_tables_agree_but_for_the_named_exceptions() -> None:
    """The same computation has the same class in both backends' tables, except where
    ``OP_TABLE_EXCEPTIONS`` names the difference (Attention: no ONNX fp16 rewrite)."""
    seen = {}
    for aten, onnx_op in _PAIRS:
        t, o = _classes(aten, onnx_op)
        if t is not o:
            seen[onnx_op] = {Backend.TORCH: t, Backend.ONNX: o}
    assert seen == {k: dict(v) for k, v in OP_TABLE_EXCEPTIONS.items()}
    assert set(OP_TABLE_EXCEPTIONS) <= set(LOW_KINDS)


def test_every_onnx_table_op_is_paired_with_its_aten_op() -> None:
    """So a new entry in one table is checked against the other (or said to have none)."""
    paired = {o for _, o in _PAIRS}
    tables = onnx_precision.FOLLOW_OPS | onnx_precision.MEAN_OPS | set(onnx_precision.LOW_OPS)
    assert tables - paired == set(_ONNX_ONLY)
    torch_low = {a for a, _ in _PAIRS if a in torch_rules.LOW_OPS}
    assert torch_low, "the pairs cover torch's GEMM-like ops"


# ----------------------------------------------------------------- inf/NaN, by the numbers
class Masked(nn.Module):
    """Linear -> min with a cap holding +inf -> + a mask holding -inf -> softmax -> x*x, a
    mean, a Linear head, plus a slice of the fp32 input: every role of the rules once."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.head = nn.Linear(16, 16), nn.Linear(16, 8)
        mask, cap = torch.zeros(16), torch.full((16,), math.inf)
        mask[::3], cap[1::4] = -math.inf, 0.5
        self.register_buffer("mask", mask)
        self.register_buffer("cap", cap)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = torch.softmax(torch.minimum(self.fc(x), self.cap) + self.mask, -1)
        return self.head(p) + (p * p).mean(-1, keepdim=True) + x[:, :8]


def _masked() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return Masked().eval(), torch.randn(4, 16, generator=torch.Generator().manual_seed(1))


def _torch_roles(model: nn.Module, x: torch.Tensor, fmt: str
                 ) -> tuple[fx.GraphModule, Any, list[tuple[str, str, str]]]:
    """The torch pass on ``model`` at ``fmt`` on h100: (module, context, [(canonical op,
    role, reason)] in plan order)."""
    gm, ctx = prepare(model, (x,), get_target("h100"))
    ctx.compute_dtype = fmt
    asg = _Assigner(gm, ctx, {"bf16": torch.bfloat16, "fp16": torch.float16}[fmt]).run()
    fx_nodes = {n.name: n for n in gm.graph.nodes}
    roles = [(p.op_type, asg.role[fx_nodes[p.name]], asg.reason[fx_nodes[p.name]])
             for p in ctx.plan.nodes if p.name in fx_nodes]
    assert reduce_precision(gm, ctx)
    return gm, ctx, roles


def _onnx_roles(model: nn.Module, x: torch.Tensor) -> tuple[Any, Any, list[tuple[str, str, str]]]:
    """The ONNX pass on graphopt's export of ``model`` (fp16, h100): (rewritten model, export,
    [(op, role, reason)] in plan order)."""
    exp = export_torch(model, (x,))
    graph = load_onnx(exp.model)
    plan = build_plan(graph, get_target("h100"))
    ctx = OnnxContext(plan, plan.target, Options(), [exp.feeds], compute_dtype="fp16")
    out = onnx_precision.reduce_precision(graph.source_model, ctx)
    assert out is not None
    roles = [(n.op_type, ctx.decisions[n.name]["precision"].detail.role,
              ctx.decisions[n.name]["precision"].reason) for n in plan.nodes]
    return out, exp, roles


@pytest.mark.parametrize("fmt", ["bf16", "fp16"])
def test_torch_lowers_the_readers_of_inf_constants_and_the_numbers_hold(fmt: str) -> None:
    """The mask's -inf and the cap's +inf convert exactly: the min and the add run low (they
    used to stay fp32), and the rewritten module matches the original within the format's
    tolerance, infinities and all."""
    model, x = _masked()
    gm, _, roles = _torch_roles(model, x, fmt)
    by_op = {op: (role, why) for op, role, why in roles}
    assert by_op["Min"] == (Role.LOW, f"{fmt}: follows its inputs (no cast needed)")
    assert by_op["Softmax"][0] == Role.ISLAND
    low = {"bf16": torch.bfloat16, "fp16": torch.float16}[fmt]
    consts = [*gm.named_parameters(), *gm.named_buffers()]
    assert {t.dtype for n, t in consts if "cap" in n or "mask" in n} == {low}
    with torch.no_grad():
        ref, out = model(x), gm(x)
    tol = tolerance_for(fmt).rel_to_scale
    assert out.dtype == ref.dtype and torch.isfinite(out).all()
    assert float((ref - out).abs().max()) <= tol * float(ref.abs().max())


def test_onnx_lowers_the_readers_of_inf_constants_and_the_numbers_hold() -> None:
    model, x = _masked()
    out, exp, roles = _onnx_roles(model, x)
    assert ("Min", "low", "follows its fp16 inputs") in roles
    assert ("Add", "low", "follows its fp16 inputs") in roles

    def run(proto: Any) -> np.ndarray:
        sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
        return sess.run(None, exp.feeds)[0]

    ref, got = run(exp.model), run(out)
    assert np.isfinite(got).all() and got.dtype == ref.dtype
    assert float(np.abs(ref - got).max()) <= tolerance_for("fp16").rel_to_scale * float(
        np.abs(ref).max())


def test_a_weight_holding_nan_no_longer_keeps_its_reader_fp32() -> None:
    """NaN converts to NaN: the reader runs low and gives NaN where the original does."""
    model, x = _masked()
    model.cap[0] = math.nan
    gm, _, roles = _torch_roles(model, x, "bf16")
    assert ("Min", Role.LOW, "bf16: follows its inputs (no cast needed)") in roles
    with torch.no_grad():
        ref, out = model(x), gm(x)
    assert torch.equal(ref.isnan(), out.isnan()) and ref.isnan().any()
    torch.testing.assert_close(out, ref, equal_nan=True, atol=0.05, rtol=0.05)


def test_the_onnx_pass_checks_constants_only_on_the_way_to_fp16() -> None:
    """The order both backends now share: a LayerNormalization whose scale (1e5) does not fit
    fp16 is an island for the plan's reason (it was "wide: constant ... does not fit"), an Add
    reading the fp32 input and a big constant is wide by the widest-input rule, and a GEMM
    reading a big weight is still kept fp32 because of it."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(a.astype(np.float32), name) for name, a in (
        ("W", rng.standard_normal((16, 16))), ("scale", np.full(16, 1e5)),
        ("bias", np.zeros(16)), ("big", np.full(16, 7e4)), ("V", np.full((16, 16), 1e5)))]
    graph = helper.make_graph([
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
        helper.make_node("LayerNormalization", ["h", "scale", "bias"], ["n"], axis=-1, name="ln"),
        helper.make_node("Add", ["x", "big"], ["r"], name="add"),
        helper.make_node("MatMul", ["r", "V"], ["v"], name="mm_big"),
        helper.make_node("Add", ["n", "v"], ["y"], name="out")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    loaded = load_onnx(model)
    plan = build_plan(loaded, get_target("h100"))
    ctx = OnnxContext(plan, plan.target, Options(), [], compute_dtype="fp16")
    assert onnx_precision.reduce_precision(loaded.source_model, ctx) is not None
    got = {n: (ctx.decisions[n]["precision"].detail.role, ctx.decisions[n]["precision"].reason)
           for n in ("mm", "ln", "add", "mm_big")}
    assert got["mm"] == ("low", "fp16: GEMM with fp32 accumulation")
    assert got["ln"][0] == "island" and got["ln"][1].startswith("fp32 island: norm kernel;")
    assert got["add"] == ("wide", "an input is fp32 (widest-input rule)")
    assert got["mm_big"] == ("wide", "constant V (max |v| 1e+05) does not fit fp16")


# ------------------------------------------------------------------------- across backends
_SAME_OP = {"Linear": "Gemm"}  # the torch frontend's canonical op for a 2-D nn.Linear


def test_the_same_model_gets_the_same_role_per_node_on_both_backends() -> None:
    """Masked at fp16 on h100: the torch pass on the module and the ONNX pass on its export
    give each corresponding node (same canonical op, same position) the same role."""
    model, x = _masked()
    _, _, t_roles = _torch_roles(model, x, "fp16")
    _, _, o_roles = _onnx_roles(model, x)
    torch_seq = [(_SAME_OP.get(op, op), str(role)) for op, role, _ in t_roles]
    onnx_seq = [(op, role) for op, role, _ in o_roles]
    assert torch_seq == onnx_seq
    assert [r for _, r in onnx_seq] == [
        "low", "low", "low", "island", "low", "island", "wide", "wide", "wide", "wide"]
