"""The precision role of a node: one rule table for the torch and the ONNX pass (issue 20, item 3).

Why: both passes decide, per float node, whether it runs in the reduced format (``low``), stays
an fp32 island, or stays fp32 for another reason, and both used to write those rules out again
in their own IR (fx, ONNX). The two copies drifted: a weight holding inf kept its torch reader
fp32 while ONNX lowered it, and ONNX checked constants before the plan's island decision while
torch checked them only on the way to ``low``. Here the rules are written once, over facts about
a node that either IR computes (:class:`NodeFacts`); a backend keeps only what is its IR's:
which of its ops it has an edit for (its op tables, read into :class:`OpClass`), dtype
propagation, reading tensors, the casts.

Rules, in order; the first that matches decides (``RULES`` has each outcome's role and words):

1. A result that is not fp32 (integer/bool, or a dtype the model chose): ``keep``, the node
   reads its inputs at their original dtypes, so comparisons and thresholds are not rounded.
2. A reason of the backend's own to keep the node fp32 (ONNX: the accuracy guard's blocked
   nodes, ops without a schema): ``wide``.
3. The plan's island decision (``precision.by_op.node_decision``): ``island``.
4. A node a pass added (no plan node) whose canonical op the shared island rule makes an
   island (``precision.by_op.island_reason``, e.g. a square): ``island``.
5. An op the backend can lower (``OpClass.LOW``) that the plan makes GEMM-like, or that has no
   canonical op on the plan: ``low``, if every constant it reads fits the format (rule 9).
6. GEMM-like on the plan but no reduced-precision edit in this backend: ``island``, "kept fp32:
   can't apply here".
7. A mean/average pool over more than 2**significand bits elements: ``island`` (a running sum
   in the format stalls past that, ``precision.islands.SIGNIFICAND_BITS``).
8. Any op neither mean nor follow (``OpClass.OTHER``): ``island``, unknown numerics.
9. Means and follow ops run low only when all their activation inputs are low (autocast's
   widest-input rule; constants do not vote), and every constant they read fits the format.

A constant fits when its finite values are within the format's largest finite value
(:func:`constant_fits`): converting inf gives inf and NaN gives NaN, exactly, so a mask holding
-inf does not keep its reader fp32; a finite value beyond the range would become inf.

Named exceptions (where the backends differ; each tested in ``tests/test_precision_roles.py``):

* :data:`BACKEND_FORMATS`: ONNX lowers to fp16 only (``precision.format.onnx_precision``), so
  its mean limit is fp16's 2**11 and its constants are checked against 65504.
* :data:`OP_TABLE_EXCEPTIONS`: canonical ops one backend can lower and the other cannot.
* Words: each backend words an outcome in its IR's terms (``aten.linear``, ``MatMul``); the
  two columns of ``RULES`` are the text its reports showed before this table, kept byte for
  byte. The rule and the role are the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any, NamedTuple

from graphopt.decisions.precision.by_op import island_reason, node_decision
from graphopt.decisions.precision.islands import SIGNIFICAND_BITS
from graphopt.ir.decision_details import PrecisionRole as Role
from graphopt.ir.ops import KNOWN_OPS
from graphopt.ir.plan import NodePlan

__all__ = ["BACKEND_FORMATS", "FORMAT_MAX", "OP_TABLE_EXCEPTIONS", "RULES", "Backend", "Const",
           "NodeFacts", "OpClass", "OpTables", "Outcome", "Role", "Rule", "assign_role",
           "constant_fits", "mean_limit", "outcome"]


class OpClass(StrEnum):
    """The class of an op in one backend's op tables."""

    LOW = "low"  # the backend has a reduced-precision edit for it (GEMM-like: LOW_OPS)
    MEAN = "mean"  # averaging reductions (MEAN_OPS)
    FOLLOW = "follow"  # benign elementwise and data movement (FOLLOW_OPS)
    OTHER = "other"  # anything else: an island (rule 8)


class Backend(StrEnum):
    TORCH = "torch"
    ONNX = "onnx"


#: the reduced formats each backend lowers to. The named exception: ONNX only to fp16 (no bf16
#: Conv in ONNX, no bf16 kernels in ORT's CPU EP: ``precision.format.onnx_precision``)
BACKEND_FORMATS: Mapping[Backend, tuple[str, ...]] = MappingProxyType(
    {Backend.TORCH: ("bf16", "fp16"), Backend.ONNX: ("fp16",)})

#: canonical GEMM-like ops (``precision.by_op.LOW_KINDS``) one backend has no low edit for, so
#: the plan's ``low`` becomes "kept fp32: can't apply here" there; the named exception to one
#: op table. Attention: torch lowers scaled_dot_product_attention whole; the ONNX pass has no
#: fp16 rewrite of an ``Attention`` node (the exporters write MatMul -> Softmax -> MatMul,
#: whose MatMuls it lowers).
OP_TABLE_EXCEPTIONS: Mapping[str, Mapping[Backend, OpClass]] = MappingProxyType({
    "Attention": MappingProxyType({Backend.TORCH: OpClass.LOW, Backend.ONNX: OpClass.OTHER}),
})

#: largest finite value of each reduced format [IEEE 754 binary16; bfloat16: (2 - 2^-7) * 2^127]
FORMAT_MAX: Mapping[str, float] = MappingProxyType(
    {"fp16": 65504.0, "bf16": 3.3895313892515355e38})


@dataclass(frozen=True)
class OpTables:
    """One backend's op tables, by its own op names: the ops it has a low edit for (op -> the
    work: GEMM, conv, attention), the averaging reductions, the ops that follow their inputs."""

    low: Mapping[str, str]
    mean: frozenset[str]
    follow: frozenset[str]

    def op_class(self, op: str) -> OpClass:
        if op in self.low:
            return OpClass.LOW
        if op in self.mean:
            return OpClass.MEAN
        return OpClass.FOLLOW if op in self.follow else OpClass.OTHER


def constant_fits(max_abs_finite: float, fmt: str) -> bool:
    """Whether a constant converts to ``fmt`` without a finite value becoming inf.

    Only the finite values count: inf converts to inf and NaN to NaN in every float format, so
    a constant holding them (an attention mask of -inf) is the same constant after conversion.
    """
    return max_abs_finite <= FORMAT_MAX[fmt]


def mean_limit(fmt: str) -> int:
    """How many elements a mean may average in ``fmt``: 2**significand bits (rule 7)."""
    return 2 ** SIGNIFICAND_BITS[fmt]


@dataclass(frozen=True)
class Const:
    """A constant (parameter, initializer) a node reads and would convert to the format."""

    name: str  # as the backend's reason names it (``fc.weight``, an initializer's name)
    max_abs: float  # the largest |value| of its finite values; 0.0 when it has none


@dataclass(frozen=True)
class NodeFacts:
    """What the rules need to know about one float node, computed by its backend.

    ``op`` is the backend's op name as its reasons write it (``linear``, ``MatMul``);
    ``canonical`` the canonical op of a node without a plan node, where the backend knows it
    (rule 4); ``inputs`` the input tensor names (a square reads one name twice); ``acts`` the
    activation inputs that vote (rule 9) with the dtype each runs at (None: unknown);
    ``consts`` the constants the node would convert; ``count`` the elements a mean averages.
    """

    op: str
    op_class: OpClass
    plan: NodePlan | None = None
    result: str | None = "fp32"
    excluded: str | None = None
    work: str = ""
    canonical: str | None = None
    inputs: tuple[str | None, ...] = ()
    acts: tuple[tuple[str, str | None], ...] = ()
    consts: tuple[Const, ...] = ()
    count: int | None = None


class Outcome(StrEnum):
    """Which rule decided, and how (one row of ``RULES``)."""

    KEEP = "keep"  # rule 1
    EXCLUDED = "excluded"  # rule 2
    PLAN_ISLAND = "plan island"  # rule 3
    ADDED_ISLAND = "added island"  # rule 4
    PLAN_LOW = "plan low"  # rule 5, GEMM-like on the plan
    TABLE_LOW = "table low"  # rule 5, no canonical op on the plan: by the op table
    CANT_APPLY = "can't apply"  # rule 6
    LONG_MEAN = "long mean"  # rule 7
    NOT_ALLOWED = "not allowed"  # rule 8
    NO_ACTIVATION = "no activation"  # rule 9: no activation input votes
    ALL_WIDE = "all wide"  # rule 9: none is low
    MIXED = "mixed"  # rule 9: some are low, one is not
    FOLLOWS = "follows"  # rule 9: all low
    TOO_BIG = "too big"  # rules 5 and 9: a constant does not fit


class Rule(NamedTuple):
    """An outcome's role, and the reason each backend's report gives (``str.format`` fields:
    op, fmt, work, unit, plan, why, excluded, result, count, limit, bits, input, dtype, const,
    max_abs, fmt_max)."""

    role: Role
    torch: str
    onnx: str


_FP32_IN = "an input is fp32 (widest-input rule)"

#: the rule table: outcome -> role, torch's words, ONNX's words
RULES: Mapping[Outcome, Rule] = MappingProxyType({
    Outcome.KEEP: Rule(
        Role.KEEP, "kept: {result} result; reads its inputs at their original dtype, so "
        "comparisons and thresholds are not rounded",
        "no fp32 result (integer/bool/other): inputs at their original dtypes"),
    Outcome.EXCLUDED: Rule(Role.WIDE, "{excluded}", "{excluded}"),
    Outcome.PLAN_ISLAND: Rule(Role.ISLAND, "{plan}", "{plan}"),
    Outcome.ADDED_ISLAND: Rule(Role.ISLAND, "fp32 island: {why}", "fp32 island: {why}"),
    Outcome.PLAN_LOW: Rule(Role.LOW, "{plan}", "{plan}"),
    Outcome.TABLE_LOW: Rule(Role.LOW, "{fmt}: {work} on {unit}",
                            "{work} in {fmt} with fp32 accumulation"),
    Outcome.CANT_APPLY: Rule(
        Role.ISLAND, "kept fp32: can't apply here: aten.{op} has no {fmt} path in this pass "
        "(the plan: {plan})",
        "kept fp32: can't apply here: {op} has no {fmt} rewrite in this pass (the plan: {plan})"),
    Outcome.LONG_MEAN: Rule(
        Role.ISLAND, "fp32 island: averages {count} elements, more than the {limit} a {fmt} "
        "sum adds exactly",
        "mean over {count} elements: an {fmt} running sum stalls past 2^{bits}"),
    Outcome.NOT_ALLOWED: Rule(
        Role.ISLAND, "fp32 island: aten.{op} is not on the reduced-precision allowlist, so its "
        "numerics are not risked", "{op}: numerics in {fmt} not known to be safe"),
    Outcome.NO_ACTIVATION: Rule(Role.WIDE, "fp32: reads no reduced-precision activation",
                                _FP32_IN),
    Outcome.ALL_WIDE: Rule(Role.WIDE, "fp32: no input is in reduced precision", _FP32_IN),
    Outcome.MIXED: Rule(
        Role.WIDE, "fp32: input {input} is {dtype}; mixed inputs run at the wider type "
        "(autocast's rule), so a fp32 residual stream keeps its precision", _FP32_IN),
    Outcome.FOLLOWS: Rule(Role.LOW, "{fmt}: follows its inputs (no cast needed)",
                          "follows its {fmt} inputs"),
    Outcome.TOO_BIG: Rule(
        Role.WIDE, "fp32: {const} holds values beyond {fmt}'s range ({fmt_max:.6g}); "
        "converting it would give inf", "constant {const} (max |v| {max_abs:.3g}) does not fit "
        "{fmt}"),
})


def _lower(facts: NodeFacts, fmt: str, low: Outcome, **values: Any
           ) -> tuple[Outcome, dict[str, Any]]:
    """``low`` (with ``values``), unless a constant the node reads does not fit ``fmt``."""
    for c in facts.consts:
        if not constant_fits(c.max_abs, fmt):
            return Outcome.TOO_BIG, {"const": c.name, "max_abs": c.max_abs}
    return low, values


def _follow(facts: NodeFacts, fmt: str) -> tuple[Outcome, dict[str, Any]]:
    """Rule 9: the widest-input rule, then the constants' fit."""
    if not facts.acts:
        return Outcome.NO_ACTIVATION, {}
    wide = [(name, dtype) for name, dtype in facts.acts if dtype != fmt]
    if len(wide) == len(facts.acts):
        return Outcome.ALL_WIDE, {}
    if wide:
        return Outcome.MIXED, {"input": wide[0][0], "dtype": wide[0][1]}
    return _lower(facts, fmt, Outcome.FOLLOWS)


def outcome(facts: NodeFacts, fmt: str) -> tuple[Outcome, dict[str, Any]]:
    """Which rule decides ``facts`` at ``fmt`` (rules 1-9 of the module doc), with the values
    its reason names."""
    if facts.result != "fp32":
        return Outcome.KEEP, {"result": facts.result or "integer/bool"}
    if facts.excluded is not None:
        return Outcome.EXCLUDED, {"excluded": facts.excluded}
    plan = facts.plan
    decided = node_decision(plan, fmt) if plan is not None else None
    if decided is not None and decided.detail.island:
        return Outcome.PLAN_ISLAND, {"plan": decided.reason}
    if plan is None and facts.canonical is not None and (
            why := island_reason(facts.canonical, None, facts.inputs)) is not None:
        return Outcome.ADDED_ISLAND, {"why": why}
    if facts.op_class is OpClass.LOW:
        if decided is not None:
            return _lower(facts, fmt, Outcome.PLAN_LOW, plan=decided.reason)
        if plan is None or plan.op_type not in KNOWN_OPS:  # no canonical op to ask
            return _lower(facts, fmt, Outcome.TABLE_LOW)
    if decided is not None:
        return Outcome.CANT_APPLY, {"plan": decided.reason}
    if facts.op_class is OpClass.MEAN:
        if facts.count is None or facts.count > mean_limit(fmt):
            return Outcome.LONG_MEAN, {"count": facts.count or "an unknown number of"}
    elif facts.op_class is not OpClass.FOLLOW:
        return Outcome.NOT_ALLOWED, {}
    return _follow(facts, fmt)


def assign_role(facts: NodeFacts, fmt: str, backend: Backend, unit: str = "") -> tuple[Role, str]:
    """(role, reason) of the node ``facts`` describes, at reduced format ``fmt``, in the words
    of ``backend``'s reports (``unit``: where torch runs an unplanned GEMM, for its reason)."""
    if fmt not in BACKEND_FORMATS[backend]:
        raise ValueError(f"{backend} does not lower to {fmt}")
    which, values = outcome(facts, fmt)
    rule = RULES[which]
    words = rule.torch if backend == Backend.TORCH else rule.onnx
    return rule.role, words.format(
        op=facts.op, fmt=fmt, work=facts.work, unit=unit, limit=mean_limit(fmt),
        bits=SIGNIFICAND_BITS[fmt], fmt_max=FORMAT_MAX[fmt], **values)
