"""Low-bit Linear layers in the torch module: the plan's FP8, INT8 and INT4, node by node.

Identity (approximate; :mod:`.quant_guard` checks it against the format's budget):
``aten.linear(x, W, b)`` -> ``graphopt::<format>_linear(x, *pack(W), b)``, torch's own kernel
over plain tensors (:mod:`.quant_ops`): FP8 e4m3 with per-row weight and per-token activation
scales, INT8 weights and per-token INT8 activations (``_int_mm``), 8-bit or group-wise 4-bit
weights with float activations.

Cases:

1. ``quantize="auto"``: the Linear nodes whose precision decision has ``runs_on="torch"`` and a
   torch ``kernel`` (the plan's format where torch's kernel takes the node on the target,
   ``decisions/precision/gpu_formats.py``), and the first and last weight GEMMs, which the plan
   keeps
   float by its prior, with the format they would get as a ``candidate``: measured by the
   guard, not assumed. A CPU INT8 decision without a ``kernel`` is :mod:`.quantize`'s dynamic
   INT8 (``quantized::linear_dynamic``), not this pass's.
2. A format by name (``fp8``, ``int4``, ``int8_weight_only``, and ``int8_dynamic`` for a GPU
   target): every Linear with a constant 2-D float weight, unless the method is blocked on the
   target (``quantization.choice.method_blocked``: FP8 without FP8 tensor cores, INT8 without int8
   tensor cores, INT4 without bf16).
3. Legality, per node: a constant 2-D float weight, a float input, and torch's kernel taking its
   K, N, input dtype and group on the target's device and on this CPU, where the artifact is
   checked (``quantization.torch_kernels.kernel_refuses``). A node refused keeps its float format
   and the report says why.
4. Numbers: :func:`.quant_guard.guard` measures each node's share of the output error and keeps
   the most sensitive nodes in float until the outputs are within the budget.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from typing import Any

from torch import fx

from graphopt.backends.driver import PassResult
from graphopt.backends.torch.context import RewriteContext
from graphopt.backends.torch.fx_utils import float_linear, get_tensor, is_aten, val
from graphopt.backends.torch.quant_guard import guard
from graphopt.backends.torch.quant_ops import QUANT_OPS, pack_linear
from graphopt.decisions.quantization.choice import auto_quantize_blocked, method_blocked
from graphopt.decisions.quantization.torch_kernels import (
    MODE_FORMAT,
    int4_group,
    kernel_refuses,
    torch_kernel_for,
)
from graphopt.decisions.tolerance import loosest
from graphopt.frontends.aten_ops import TORCH_DTYPES
from graphopt.ir.decision_details import QuantizeDetail, RunsOn

__all__ = ["Lowering", "guard_chooses", "host_dynamic_int8", "low_bit_linears",
           "quantize_tolerance"]

logger = logging.getLogger(__name__)



@dataclass(frozen=True)
class Lowering:
    """One node's low-bit form: the plan's format, torch's kernel for it, the int4 group."""

    fmt: str
    kernel: str
    group: int | None
    why: str


def host_dynamic_int8(ctx: RewriteContext) -> bool:
    """On a CPU target, ``auto`` and ``int8_dynamic`` are :mod:`.quantize`'s dynamic INT8
    (quantized::linear_dynamic, the plan's CPU INT8) and not this pass's."""
    return not ctx.target.is_gpu and ctx.options.quantize in ("auto", "int8_dynamic")


def _planned(ctx: RewriteContext, node: fx.Node) -> Lowering | None:
    """Case 1: the plan's torch format for ``node``, if it has one."""
    plan_node = ctx.plan_node(node)
    d = plan_node.decisions.get("precision") if plan_node else None
    if d is None or d.detail.runs_on is not RunsOn.TORCH:
        return None
    p = d.detail
    if p.candidate:  # a first or last GEMM: the plan's prior, measured here
        return Lowering(p.candidate, str(p.candidate_kernel), p.candidate_group or None,
                        f"the {p.edge} weight GEMM, measured by the guard "
                        "(the plan keeps it float by default)")
    if not p.kernel:
        return None
    return Lowering(p.format, p.kernel, p.group or None, d.reason)


def guard_chooses(ctx: RewriteContext) -> bool:
    """Whether this run's quantize pass may choose from data: the low-bit guard ranks layers on
    real batches (the host CPU's dynamic INT8 and the precision pass only check)."""
    mode = ctx.options.quantize
    if mode == "none" or host_dynamic_int8(ctx) or auto_quantize_blocked(ctx.options):
        return False
    if mode != "auto":
        return method_blocked(mode, "Linear", ctx.target, backend="torch") is None
    return any(_planned_format(n.decisions.get("precision")) for n in ctx.plan.nodes)


def _planned_format(d: Any) -> str | None:
    """The low-bit format a plan precision decision gives torch's kernels, if any."""
    if d is None or d.detail.runs_on is not RunsOn.TORCH:
        return None
    fmt = d.detail.candidate or (d.detail.format if d.detail.kernel else None)
    return fmt or None


def quantize_tolerance(ctx: RewriteContext) -> str:
    """The budget this pass is checked against: the loosest format it may apply."""
    mode = ctx.options.quantize
    if mode in MODE_FORMAT:
        return MODE_FORMAT[mode]
    formats = {f for n in ctx.plan.nodes
               if (f := _planned_format(n.decisions.get("precision"))) is not None}
    return loosest(formats) if formats else "int8"


def _wanted(ctx: RewriteContext, node: fx.Node, k: int) -> Lowering | str | None:
    """Cases 1-2: the lowering ``node`` should get, why not (str), or None (not asked)."""
    mode = ctx.options.quantize
    if mode == "auto":
        return _planned(ctx, node)
    fmt = MODE_FORMAT[mode]
    kernel = torch_kernel_for(fmt)
    if kernel is None:
        return f"{fmt}: no torch kernel"
    group = int4_group(k) if kernel == "int4_weight_only" else None
    if kernel == "int4_weight_only" and group is None:
        return f"K={k} splits into no int4 group size (32, 64, 128, 256)"
    return Lowering(fmt, kernel, group, f"quantize={mode!r} requested")


def _refused(gm: fx.GraphModule, node: fx.Node, low: Lowering, ctx: RewriteContext
             ) -> str | None:
    """Case 3: why ``node`` cannot run ``low`` here, else None."""
    operands = float_linear(gm, node)
    if isinstance(operands, str):
        return operands
    w, x = operands
    n, k = w.shape
    act = TORCH_DTYPES[x.dtype]
    devices = ("cpu", "cuda") if ctx.target.is_gpu else ("cpu",)
    for device in devices:
        why = kernel_refuses(low.kernel, k, n, act, low.group, device=device)
        if why is not None:
            return f"{why} ({device})"
    return None


def _lower(gm: fx.GraphModule, node: fx.Node, low: Lowering) -> dict[str, Any]:
    """Pack ``node``'s weight and return the low-bit call's (target, args) beside the float
    one's, without switching: the guard switches."""
    w = get_tensor(gm, node.args[1])
    x = val(node.args[0])
    bias = node.args[2] if len(node.args) > 2 else None
    packed = pack_linear(low.kernel, w, x.dtype, low.group)
    args: list[Any] = [node.args[0]]
    with gm.graph.inserting_before(node), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for i, t in enumerate(packed):
            name = f"_graphopt_q{i}_{node.name}"
            gm.register_buffer(name, t)
            args.append(gm.graph.get_attr(name))
    if low.kernel == "int4_weight_only":
        args.append(low.group)
    args.append(bias)
    return {"float": (node.target, node.args, dict(node.kwargs)),
            "low": (QUANT_OPS[low.kernel], tuple(args), {})}


def low_bit_linears(gm: fx.GraphModule, ctx: RewriteContext) -> bool | PassResult:
    """Cases 1-4 on ``gm`` in place; False when no node was asked for or could take it."""
    mode = ctx.options.quantize
    if mode == "none" or host_dynamic_int8(ctx):
        return False
    off = auto_quantize_blocked(ctx.options)
    if off is not None:
        return False
    if mode != "auto":
        blocked = method_blocked(mode, "Linear", ctx.target, backend="torch")
        if blocked is not None:
            ctx.notes["quantize"] = {"mode": mode, "applied": 0, "reason": blocked}
            return False
    lowered: dict[str, tuple[Lowering, dict[str, Any]]] = {}
    for node in list(gm.graph.nodes):
        if not is_aten(node, "linear"):
            continue
        w = get_tensor(gm, node.args[1] if len(node.args) > 1 else None)
        low = _wanted(ctx, node, int(w.shape[-1]) if w is not None and w.dim() == 2 else 0)
        if low is None:
            continue
        why = low if isinstance(low, str) else _refused(gm, node, low, ctx)
        if why is not None:
            ctx.decide(node, QuantizeDetail(), f"not applied, keeps its float format: {why}",
                       applied=False)
            continue
        lowered[node.name] = (low, _lower(gm, node, low))
    if not lowered:
        return False
    return guard(gm, ctx, lowered)
