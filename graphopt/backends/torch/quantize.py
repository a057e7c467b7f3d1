"""Dynamic INT8 for the Linear layers the plan puts at INT8 on the host CPU.

Identity (approximate, hence verified against the int8 tolerance): ``x @ W.T + b`` with ``W``
quantized per output channel, ``W ~= s_c * q_c`` (``q`` int8, symmetric, ``s_c = max|W_c|/127``)
and ``x`` quantized per call to uint8 by its own range, computed by oneDNN/FBGEMM's
``quantized::linear_dynamic`` with int32 accumulation and a float result.

Legality: ``aten.linear`` with a constant 2-D float weight, on a target that is *this* machine's
CPU (the kernel runs here, so the decision can be checked). The kernel takes and gives fp32: in
a bf16/fp16 model (the precision pass ran first) the input is widened and the output narrowed
back around it, and where the input is itself a cast of an fp32 value (the precision pass's
boundary after an fp32 island) the kernel reads that value instead (no round trip through
bf16). The weight is quantized from its float value (from bf16 in a bf16 model).

Profitability is the plan's: each Linear's precision decision
(``decisions/quantization/cpu_int8.py``: the int8 GEMM plus quantizing the activations, costed
against the carrier, fp32 or bf16, with the
casts), applied where its format is ``int8`` and ``runs_on`` is ``torch``. An explicit
``precision`` turns ``quantize="auto"`` off, as on ONNX (:func:`auto_quantize_blocked`).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable

import torch
from torch import fx

from graphopt.backends.torch.context import RewriteContext
from graphopt.backends.torch.fx_utils import float_linear, get_tensor, is_aten, val
from graphopt.backends.torch.quant_kernels import quantize_rows_int8
from graphopt.decisions.quantization.choice import auto_quantize_blocked
from graphopt.hardware import is_this_machine
from graphopt.ir.decision_details import QuantizeDetail, RunsOn
from graphopt.ir.legality import Legality

__all__ = ["dynamic_int8", "dynamic_int8_without_ends", "pack_int8_weight"]

logger = logging.getLogger(__name__)


def pack_int8_weight(weight: torch.Tensor, bias: torch.Tensor | None) -> object:
    """The weight rounded by graphopt's one per-row int8 quantizer, packed for oneDNN/FBGEMM."""
    q, scale = quantize_rows_int8(weight)
    zero = torch.zeros(weight.shape[0], dtype=torch.long)
    with warnings.catch_warnings():  # quantized tensors are deprecated but still the CPU path
        warnings.simplefilter("ignore", UserWarning)
        packed = torch._make_per_channel_quantized_tensor(q, scale.double(), zero, 0)
        return torch.ops.quantized.linear_prepack(packed, bias)


_CAST_TAG = "graphopt_int8_cast"  # node.meta key on the casts this pass inserts


def can_quantize(gm: fx.GraphModule, node: fx.Node, ctx: RewriteContext) -> Legality:
    """May ``node`` run as dynamic INT8 here."""
    if not is_this_machine(ctx.target):
        return Legality.no("INT8 is applied only for the host CPU target (the kernel must run "
                           "here)")
    operands = float_linear(gm, node)
    if isinstance(operands, str):
        return Legality.no(operands)
    if not hasattr(torch.ops.quantized, "linear_dynamic"):
        return Legality.no("this torch build has no quantized::linear_dynamic kernel")
    return Legality.OK


def _cast(gm: fx.GraphModule, src: fx.Node, dtype: torch.dtype) -> fx.Node:
    node = gm.graph.call_function(torch.ops.aten._to_copy.default, (src,), {"dtype": dtype})
    v = val(src)
    node.meta.update({_CAST_TAG: True, **({"val": v.to(dtype)} if v is not None else {})})
    return node


def _fp32_input(gm: fx.GraphModule, x: fx.Node) -> fx.Node:
    """``x`` as fp32: itself, the fp32 value it is a cast of, or a new widening cast."""
    v = val(x)
    if v is None or v.dtype == torch.float32:
        return x
    if x.op == "call_function" and x.target is torch.ops.aten._to_copy.default \
            and isinstance(x.args[0], fx.Node) and set(x.kwargs) <= {"dtype"}:
        src = val(x.args[0])
        if src is not None and src.dtype == torch.float32:
            return x.args[0]
    return _cast(gm, x, torch.float32)


def _replace(gm: fx.GraphModule, node: fx.Node, packed: object) -> None:
    """``node`` (aten.linear) -> linear_dynamic on fp32, cast back to ``node``'s dtype."""
    attr = f"_graphopt_int8_{node.name}"
    setattr(gm, attr, packed)
    out = val(node)
    with gm.graph.inserting_before(node), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # fx warns on non-tensor attributes
        x = _fp32_input(gm, node.args[0])
        weights = gm.graph.get_attr(attr)
        new = gm.graph.call_function(torch.ops.quantized.linear_dynamic.default,
                                     (x, weights, True))
        new.meta = dict(node.meta)
        if out is not None and out.dtype != torch.float32:
            new.meta["val"] = out.to(torch.float32)
            result = _cast(gm, new, out.dtype)
        else:
            result = new
    node.replace_all_uses_with(result)
    gm.graph.erase_node(node)
    if result is not new:  # a consumer that widens the result again reads the fp32 directly
        for user in list(result.users):
            if user.target is torch.ops.aten._to_copy.default and set(user.kwargs) <= {"dtype"} \
                    and user.kwargs.get("dtype") is torch.float32:
                user.replace_all_uses_with(new)


def dynamic_int8_without_ends(gm: fx.GraphModule, ctx: RewriteContext) -> bool:
    """The second try, after :func:`dynamic_int8` was reverted (its Linears are back in the
    graph): the same set without the plan's first and last weight GEMMs (``edge``: their
    error is not averaged out by later layers). Changes nothing when the first try was kept
    or the plan marks no edge."""
    def edge(node: fx.Node) -> bool:
        plan_node = ctx.plan_node(node)
        precision = plan_node.decisions.get("precision") if plan_node else None
        return precision is not None and precision.detail.edge is not None
    if not any(is_aten(n, "linear") and edge(n) for n in gm.graph.nodes):
        return False
    return dynamic_int8(gm, ctx, skip=edge)


def dynamic_int8(gm: fx.GraphModule, ctx: RewriteContext,
                 skip: Callable[[fx.Node], bool] | None = None) -> bool:
    """Replace profitable ``aten.linear`` nodes with ``quantized::linear_dynamic`` (not those
    ``skip`` names)."""
    mode = ctx.options.quantize
    if mode == "none":
        return False
    off = auto_quantize_blocked(ctx.options)
    if off is not None:  # an explicit precision: INT8 only when asked for by name
        ctx.notes["quantize"] = {"applied": 0, "reason": off}
        return False
    changed = False
    for node in list(gm.graph.nodes):
        if not is_aten(node, "linear"):
            continue
        plan_node = ctx.plan_node(node)
        precision = plan_node.decisions.get("precision") if plan_node else None
        wanted = precision is not None and precision.detail.format == "int8" \
            and precision.detail.runs_on is RunsOn.TORCH
        if mode == "auto" and not wanted or skip is not None and skip(node):
            continue
        legal = can_quantize(gm, node, ctx)
        if not legal:
            ctx.decide(node, QuantizeDetail(), f"not applied: {legal.reason}", applied=False)
            continue
        w = get_tensor(gm, node.args[1])
        b = get_tensor(gm, node.args[2]) if len(node.args) > 2 and node.args[2] is not None \
            else None
        name, low = node.name, val(node.args[0])
        _replace(gm, node, pack_int8_weight(w.float(), None if b is None else b.float()))
        around = "" if low is None or low.dtype == torch.float32 else \
            f" (fp32 kernel in a {ctx.compute_dtype} model: cast around it)"
        ctx.decide(name, QuantizeDetail("int8"), "dynamic INT8 (per-channel weights, per-call "
                   f"activation range){around}: " + (precision.reason if precision else "forced"))
        changed = True
    if changed:
        gm.graph.eliminate_dead_code()
    return changed
