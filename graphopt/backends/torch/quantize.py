"""Dynamic INT8 for Linear layers on CPUs where it pays (VNNI / AMX-INT8).

Identity (approximate, hence verified against the int8 tolerance): ``x @ W.T + b`` with ``W``
quantized per output channel, ``W ~= s_c * q_c`` (``q`` int8, symmetric, ``s_c = max|W_c|/127``)
and ``x`` quantized per call to uint8 by its own range, computed by oneDNN/FBGEMM's
``quantized::linear_dynamic`` with int32 accumulation and a float result.

Legality: ``aten.linear`` with a constant 2-D fp32 weight, on a target that is *this* machine's
CPU (the kernel runs here, so the decision can be checked). Profitability: the planner's per-node
precision decision (cost model: INT8 only on VNNI/AMX CPUs, only for Linear, only where it
saves >= 10% after quantizing activations). Convolutions are never quantized dynamically: ONNX
Runtime's dynamic INT8 convs measured 2.2-2.5x slower on this project's CPUs. An explicit
``precision`` turns ``quantize="auto"`` off, as on ONNX (:func:`auto_quantize_blocked`).
"""

from __future__ import annotations

import logging
import warnings

import torch
from torch import fx

from graphopt.backends.torch.context import RewriteContext
from graphopt.backends.torch.fx_utils import get_tensor, is_aten
from graphopt.decisions.quantize_choice import auto_quantize_blocked
from graphopt.hardware import is_this_machine

__all__ = ["dynamic_int8", "pack_int8_weight"]

logger = logging.getLogger(__name__)


def pack_int8_weight(weight: torch.Tensor, bias: torch.Tensor | None) -> object:
    scale = (weight.abs().amax(dim=1) / 127).clamp_min(1e-12).double()
    zero = torch.zeros(weight.shape[0], dtype=torch.long)
    with warnings.catch_warnings():  # quantized tensors are deprecated but still the CPU path
        warnings.simplefilter("ignore", UserWarning)
        q = torch.quantize_per_channel(weight.float(), scale, zero, 0, torch.qint8)
        return torch.ops.quantized.linear_prepack(q, bias)


def can_quantize(gm: fx.GraphModule, node: fx.Node, ctx: RewriteContext) -> str | None:
    """None if ``node`` may run as dynamic INT8 here, else the reason it may not."""
    if not is_this_machine(ctx.target):
        return "INT8 is applied only for the host CPU target (the kernel must run here)"
    if ctx.compute_dtype != "fp32":
        return f"the model runs in {ctx.compute_dtype}; dynamic INT8 takes fp32 activations"
    w = get_tensor(gm, node.args[1] if len(node.args) > 1 else None)
    if w is None or w.dim() != 2 or w.dtype != torch.float32:
        return "the weight is not a constant fp32 matrix"
    if not hasattr(torch.ops.quantized, "linear_dynamic"):
        return "this torch build has no quantized::linear_dynamic kernel"
    return None


def dynamic_int8(gm: fx.GraphModule, ctx: RewriteContext) -> bool:
    """Replace profitable ``aten.linear`` nodes with ``quantized::linear_dynamic``."""
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
        wanted = precision is not None and precision.fields.get("format") == "int8" \
            and precision.fields.get("runs_on") == "torch"
        if mode == "auto" and not wanted:
            continue
        why_not = can_quantize(gm, node, ctx)
        if why_not is not None:
            ctx.decide(node, "quantize", f"not applied: {why_not}", applied=False)
            continue
        w = get_tensor(gm, node.args[1])
        b = get_tensor(gm, node.args[2]) if len(node.args) > 2 and node.args[2] is not None \
            else None
        attr = f"_graphopt_int8_{node.name}"
        setattr(gm, attr, pack_int8_weight(w, b))
        with gm.graph.inserting_before(node), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # fx warns on non-tensor attributes
            packed = gm.graph.get_attr(attr)
            new = gm.graph.call_function(torch.ops.quantized.linear_dynamic.default,
                                         (node.args[0], packed, True))
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        ctx.decide(node.name, "quantize", "dynamic INT8 (per-channel weights, per-call "
                   "activation range): " + (precision.reason if precision else "forced"),
                   format="int8")
        changed = True
    if changed:
        gm.graph.eliminate_dead_code()
    return changed
