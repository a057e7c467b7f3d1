"""Mixed precision: GEMM-like work in bf16/fp16, numerically sensitive ops as fp32 islands.

Identity and assumptions: a bf16/fp16 GEMM, conv or attention whose kernel accumulates in fp32
(cuBLAS/cuDNN and oneDNN do; the runtime flags in ``ctx.notes["precision"]["runtime"]`` forbid
cuBLAS's reduced-precision split-K reductions) differs from the fp32 op only by the rounding of
its inputs (unit roundoff 2^-8 for bf16, 2^-11 for fp16). Ops whose error or range is not
bounded that way stay fp32 (``decisions.precision.by_op``), so the model's outputs stay within
``tolerance.tolerance_for(compute dtype)``, which the pipeline checks after this pass.

The pass assigns every node a run dtype in graph order (dtype propagation). Which role a float
node takes is the rule table both backends share (``decisions.precision.roles``: the plan's
islands and GEMM-like nodes, means over at most 2^p elements, the widest-input rule for
``FOLLOW_OPS``, unknown ops as islands, constants that must fit the format); this pass gives it
the node's facts, read from fx:

1. its ATen op's class in this pass's tables (``precision_rules``: ``LOW_OPS`` it has a low
   path for, ``MEAN_OPS``, ``FOLLOW_OPS``), and its plan node (``decisions.precision.by_op``);
   a node an earlier pass added has none, and an allowlisted op the shared island rule can
   still make an island (``CANONICAL``: a square ``mul``) asks it by canonical op;
2. the run dtype of each activation input (parameters and constants do not vote), and the
   largest finite |value| of each parameter it reads;
3. for means/average pools, how many elements each output averages.

Explicit casts in the model keep their dtype; ops with integer/bool results (argmax,
comparisons) and ops the model runs in another float type read their inputs at their original
dtypes (thresholds are not rounded to 8-11 bits). Integer tensors are never cast.

Then parameters read only by low nodes are converted once (``new_param``, never per call; a
parameter also read in fp32 gets a low copy), ``aten._to_copy`` casts are inserted where a
producer's dtype differs from what a consumer needs (one per producer and dtype), and graph
outputs are cast back to their original dtypes. Inserted casts are tagged in ``node.meta``, so
a second run finds every boundary already cast and changes nothing.
"""

from __future__ import annotations

import logging
import operator
from typing import Any

import torch
from torch import fx

from graphopt.backends.torch.context import RewriteContext
from graphopt.backends.torch.fx_utils import aten_name, get_tensor, new_param, val
from graphopt.backends.torch.precision_rules import (
    CANONICAL,
    CAST_OPS,
    LOW_OPS,
    MEAN_OPS,
    SHAPE_QUERIES,
    TABLES,
    as_dtype,
    explicit_dtype,
    float_dtype,
)
from graphopt.decisions.precision.by_op import kept_fp32
from graphopt.decisions.precision.format import choose_precision
from graphopt.decisions.precision.roles import Backend, Const, NodeFacts, Role, assign_role
from graphopt.hardware.profile import HardwareProfile
from graphopt.ir.decision_details import PrecisionDetail

__all__ = ["reduce_precision"]

logger = logging.getLogger(__name__)

_LOW = {"bf16": torch.bfloat16, "fp16": torch.float16}
_NAME = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16",
         torch.float64: "fp64"}
_CAST_TAG = "graphopt_precision_cast"  # node.meta key on casts this pass inserted
_ORIG_TAG = "graphopt_orig_dtype"  # node.meta key: the dtype a retyped node had before
_F32 = torch.float32


# ---------------------------------------------------------------------------------- helpers
def _orig_dtype(gm: fx.GraphModule, node: fx.Node) -> torch.dtype | None:
    if _ORIG_TAG in node.meta:
        return node.meta[_ORIG_TAG]
    if node.op == "get_attr":
        return float_dtype(get_tensor(gm, node))
    return float_dtype(node.meta.get("val"))


def _reduced_count(node: fx.Node) -> int | None:
    """Elements averaged into each output of a mean/avg-pool: input numel / output numel."""
    src = node.args[0] if node.args else None
    vin, vout = (val(src) if isinstance(src, fx.Node) else None), val(node)
    if vin is None or vout is None:
        return None
    try:
        return int(vin.numel()) // max(int(vout.numel()), 1)
    except (TypeError, ValueError, RuntimeError):  # symbolic sizes without a hint
        return None


def _unit(target: HardwareProfile, fmt: str) -> str:
    cc = target.compute_capability
    return f"tensor cores (sm_{cc[0]}{cc[1]})" if cc else f"{target.display_name} native {fmt}"


# ------------------------------------------------------------------------------- assignment
class _Assigner:
    """Decides the run dtype, role (``precision.roles.Role``) and reason of every node.

    Roles: ``low``; ``island`` (sensitive, fp32); ``wide`` (fp32 for another reason);
    ``keep`` (inputs restored to their original dtypes); ``fixed`` (explicit casts);
    ``item`` (getitem: its producer's dtype); ``weak`` (parameters/constants); ``assert``
    (export's dtype checks, updated to the new dtypes); ``skip``.
    """

    def __init__(self, gm: fx.GraphModule, ctx: RewriteContext, low: torch.dtype) -> None:
        self.gm, self.ctx, self.low, self.fmt = gm, ctx, low, _NAME[low]
        self.dtype: dict[fx.Node, torch.dtype | None] = {}
        self.role: dict[fx.Node, Role] = {}
        self.reason: dict[fx.Node, str] = {}
        self._consts: dict[fx.Node, Const] = {}

    def run(self) -> _Assigner:
        for node in self.gm.graph.nodes:
            role, dtype, reason = self._classify(node)
            self.role[node], self.dtype[node], self.reason[node] = role, dtype, reason
        return self

    def _classify(self, node: fx.Node) -> tuple[str, torch.dtype | None, str]:
        if node.op == "placeholder":
            return Role.SKIP, float_dtype(node.meta.get("val")), ""
        if node.op == "get_attr":
            return Role.WEAK, float_dtype(get_tensor(self.gm, node)), ""
        if node.op != "call_function":
            return Role.SKIP, None, ""
        op = aten_name(node) or getattr(node.target, "__name__", str(node.target))
        orig = _orig_dtype(self.gm, node)
        if node.target is operator.getitem:
            return Role.ITEM, (self.dtype.get(node.args[0]) if orig is not None else None), ""
        if op == "_assert_tensor_metadata":  # export's check of a traced dtype: updated later
            return Role.ASSERT, None, ""
        if op in CAST_OPS:  # type_as: the dtype of the other tensor
            other = node.args[1] if len(node.args) > 1 else None
            return Role.FIXED, self.dtype.get(other) if isinstance(other, fx.Node) else orig, ""
        if node.meta.get(_CAST_TAG) or explicit_dtype(node):
            return Role.FIXED, orig, f"kept {_NAME.get(orig, orig)}: the model sets this dtype"
        if op in SHAPE_QUERIES or op.startswith("sym_"):
            return Role.SKIP, None, ""
        return self._float_op(node, op, orig)

    def _float_op(self, node: fx.Node, op: str, orig: torch.dtype | None
                  ) -> tuple[str, torch.dtype | None, str]:
        """A float op's role: the shared rule table (``decisions.precision.roles``) on the
        facts of the module doc."""
        strong = [i for i in node.all_input_nodes
                  if self.role.get(i) != Role.WEAK and self.dtype.get(i) is not None]
        facts = NodeFacts(
            op=op, op_class=TABLES.op_class(op), plan=self.ctx.plan_node(node),
            work=LOW_OPS.get(op, ""), canonical=CANONICAL.get(op),
            result=None if orig is None else _NAME.get(orig, str(orig)),
            inputs=tuple(a.name if isinstance(a, fx.Node) else None for a in node.args),
            acts=tuple((i.name, _NAME.get(self.dtype[i])) for i in strong),
            consts=tuple(self._const(p) for p in node.all_input_nodes
                         if self.role.get(p) == Role.WEAK and self.dtype.get(p) is not None),
            count=_reduced_count(node) if op in MEAN_OPS else None)
        role, reason = assign_role(facts, self.fmt, Backend.TORCH, _unit(self.ctx.target, self.fmt))
        return role, {Role.LOW: self.low, Role.KEEP: orig}.get(role, _F32), reason

    def _const(self, p: fx.Node) -> Const:
        """A parameter's name and largest finite |value| (read once per parameter)."""
        if p not in self._consts:
            t = get_tensor(self.gm, p)
            big = 0.0 if t is None or t.numel() == 0 else float(
                t.detach().abs().nan_to_num_(0.0, 0.0, 0.0).max())
            self._consts[p] = Const(str(p.target), big)
        return self._consts[p]

    def need(self, consumer: fx.Node, producer: fx.Node) -> torch.dtype | None:
        """The dtype ``consumer`` must read ``producer`` at; None: whatever it is."""
        role = self.role.get(consumer)
        if role in (Role.LOW, Role.ISLAND, Role.WIDE):
            return self.dtype[consumer]
        if role == Role.KEEP:
            return _orig_dtype(self.gm, producer)
        return None


# ---------------------------------------------------------------------------------- rewrite
def _convert_params(gm: fx.GraphModule, asg: _Assigner) -> int:
    """Give each parameter's readers the dtype they run at, converted once, ahead of time."""
    converted = 0
    for node in [n for n in gm.graph.nodes if asg.role.get(n) == Role.WEAK]:
        tensor = get_tensor(gm, node)
        if tensor is None or not tensor.is_floating_point():
            continue
        groups: dict[torch.dtype, list[fx.Node]] = {}
        for user in node.users:
            need = asg.need(user, node)
            if need is not None and need != tensor.dtype:
                groups.setdefault(need, []).append(user)
        for dtype, users in groups.items():
            name = f"{node.target}_{_NAME.get(dtype, 'cast')}"
            copy = new_param(gm, name, tensor.detach().to(dtype), node)
            asg.role[copy], asg.dtype[copy] = Role.WEAK, dtype
            for user in users:
                user.replace_input_with(node, copy)
            converted += 1
            logger.debug("parameter %s -> %s for %d readers", node.target, dtype, len(users))
        if groups and not node.users:
            target = str(node.target)
            gm.graph.erase_node(node)
            if not any(n.op == "get_attr" and n.target == target for n in gm.graph.nodes):
                prefix, _, leaf = target.rpartition(".")
                owner = gm.get_submodule(prefix) if prefix else gm
                delattr(owner, leaf)  # the fp32 original is no longer read: free it
    return converted


def _insert_casts(gm: fx.GraphModule, asg: _Assigner) -> int:
    """Cast where a producer's dtype differs from what a reader needs; outputs get theirs back."""
    graph = gm.graph
    cache: dict[tuple[fx.Node, torch.dtype], fx.Node] = {
        (n.args[0], n.kwargs["dtype"]): n for n in graph.nodes
        if n.meta.get(_CAST_TAG) and isinstance(n.args[0], fx.Node)}
    inserted = 0

    def cast(src: fx.Node, dtype: torch.dtype, before: fx.Node) -> fx.Node:
        nonlocal inserted
        if (src, dtype) not in cache:
            with graph.inserting_before(before):
                c = graph.call_function(torch.ops.aten._to_copy.default, (src,),
                                        {"dtype": dtype})
            c.meta.update({"val": as_dtype(src.meta.get("val"), dtype), _CAST_TAG: True})
            asg.role[c], asg.dtype[c] = Role.FIXED, dtype
            cache[(src, dtype)] = c
            inserted += 1
        return cache[(src, dtype)]

    for node in list(graph.nodes):
        if node.op == "output":
            def back(arg: fx.Node, out: fx.Node = node) -> fx.Node:
                want, have = _orig_dtype(gm, arg), asg.dtype.get(arg)
                if want is None or have is None or want == have or val(arg) is None:
                    return arg
                return cast(arg, want, out)
            node.args = fx.node.map_arg(node.args, back)
            continue
        if node.op != "call_function":
            continue
        for src in list(dict.fromkeys(node.all_input_nodes)):
            if asg.role.get(src) == Role.WEAK or val(src) is None:
                continue  # parameters were converted ahead of time; tuples are read by getitem
            need, have = asg.need(node, src), asg.dtype.get(src)
            if need is not None and have is not None and need != have:
                node.replace_input_with(src, cast(src, need, node))
    return inserted


def _retype(gm: fx.GraphModule, asg: _Assigner) -> int:
    """Record the new dtypes in ``node.meta["val"]`` (and the old one under ``_ORIG_TAG``),
    and in export's ``_assert_tensor_metadata`` checks, which would fail on a retyped input."""
    retyped = 0
    for node in gm.graph.nodes:
        if asg.role.get(node) == Role.ASSERT and isinstance(node.args[0], fx.Node):
            have = asg.dtype.get(node.args[0])
            if have is not None and node.kwargs.get("dtype") not in (None, have):
                node.kwargs = {**node.kwargs, "dtype": have}
                retyped += 1
            continue
        want = asg.dtype.get(node)
        if node.op != "call_function" or want is None or asg.role.get(node) not in (
                Role.LOW, Role.ITEM):
            continue
        if float_dtype(node.meta.get("val")) != want:
            node.meta.setdefault(_ORIG_TAG, _orig_dtype(gm, node))
            node.meta["val"] = as_dtype(node.meta.get("val"), want)
            retyped += 1
    return retyped


def _record(gm: fx.GraphModule, ctx: RewriteContext, asg: _Assigner,
            tf32_ok: bool) -> dict[str, int]:
    """One "precision" decision per float node this pass ran low or deliberately kept."""
    counts = {"low": 0, "island": 0, "wide": 0, "tf32": 0}
    for node in gm.graph.nodes:
        role, dtype = asg.role.get(node), asg.dtype.get(node)
        if node.meta.get(_CAST_TAG) or role not in (Role.LOW, Role.ISLAND, Role.WIDE, Role.KEEP,
                                                    Role.FIXED):
            continue
        if role == Role.KEEP:  # computes at its inputs' original dtype; skip integer-only ops
            dtype = next((d for i in node.all_input_nodes
                          if (d := _orig_dtype(gm, i)) is not None), None)
        if dtype is None:
            continue
        form, reason = _NAME.get(dtype, str(dtype)), asg.reason[node]
        if role in (Role.ISLAND, Role.WIDE) and tf32_ok and aten_name(node) in LOW_OPS:
            form, reason, role = "tf32", f"tf32: {reason}; fp32 GEMM on tensor cores", Role.TF32
        counts[role] = counts.get(role, 0) + 1
        ctx.decide(node, PrecisionDetail(form), reason, applied=role in (Role.LOW, Role.TF32))
    return counts


def _record_full_precision(gm: fx.GraphModule, ctx: RewriteContext, why: str,
                           tf32: bool) -> int:
    """fp32/tf32: no dtype changes; each GEMM-like node says which format it runs at and why."""
    count = 0
    for node in gm.graph.nodes:
        if aten_name(node) not in LOW_OPS:
            continue
        if tf32:
            ctx.decide(node, PrecisionDetail("tf32"), f"tf32: fp32 GEMM on "
                       f"{_unit(ctx.target, 'tf32')} with 10-bit mantissa inputs, fp32 "
                       "accumulation")
            count += 1
        else:
            ctx.decide(node, PrecisionDetail("fp32"), kept_fp32(why), applied=False)
    return count


# ------------------------------------------------------------------------------------ pass
def reduce_precision(gm: fx.GraphModule, ctx: RewriteContext) -> bool:
    """Run GEMM-like work at ``ctx.compute_dtype`` (bf16/fp16) with fp32 islands; see module doc.

    For fp32/tf32 the graph is unchanged (returns False); GEMMs still get a decision saying
    which format they run at and why.
    """
    fmt, target = ctx.compute_dtype, ctx.target
    chosen, why = choose_precision(target, ctx.options.precision)
    if chosen != fmt:
        why = f"{fmt}: the compute dtype the pipeline set"
    tf32_ok = target.is_gpu and target.has("tf32") and fmt != "fp32"
    note: dict[str, Any] = {"requested": ctx.options.precision, "compute_dtype": fmt,
                            "reason": why}
    ctx.notes["precision"] = note
    if fmt not in _LOW:
        tf32 = _record_full_precision(gm, ctx, why, fmt == "tf32" and tf32_ok)
        note.update(runtime={"allow_tf32": tf32 > 0}, tf32_gemms=tf32, low_nodes=0,
                    casts_inserted=0, params_converted=0)
        return False

    asg = _Assigner(gm, ctx, _LOW[fmt]).run()
    params = _convert_params(gm, asg)
    casts = _insert_casts(gm, asg)
    retyped = _retype(gm, asg)
    counts = _record(gm, ctx, asg, tf32_ok)
    runtime: dict[str, bool] = {"allow_tf32": counts["tf32"] > 0}
    if target.is_gpu:  # PyTorch's defaults (True) let cuBLAS reduce split-K partials in 16 bit
        runtime.update(allow_fp16_reduced_precision_reduction=False,
                       allow_bf16_reduced_precision_reduction=False)
    note.update(runtime=runtime, low_nodes=counts["low"], fp32_islands=counts["island"],
                fp32_nodes=counts["wide"], tf32_gemms=counts["tf32"], casts_inserted=casts,
                casts_total=sum(1 for n in gm.graph.nodes if n.meta.get(_CAST_TAG)),
                params_converted=params, low_params_total=sum(
                    p.dtype == asg.low for p in gm.parameters()))
    changed = bool(params or casts or retyped)
    if changed:
        gm.graph.lint()
        gm.recompile()
    logger.info("precision %s: %d low nodes, %d fp32 islands, %d fp32 nodes, %d casts, "
                "%d parameters converted", fmt, counts["low"], counts["island"],
                counts["wide"], casts, params)
    return changed
