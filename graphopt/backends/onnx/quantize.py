"""ONNX quantization: INT8 (dynamic or static QDQ), FP8 QDQ and 4-bit MatMulNBits, applied by
``onnxruntime.quantization`` to the nodes graphopt's decisions pick (dynamic INT8 MatMuls: the
same graph written by graphopt, :mod:`.int8_matmul`, which is faster).

Identity (approximate, hence the accuracy guard, :mod:`graphopt.backends.onnx.guard`):
``x @ W ~= (s_x * q_x) @ (s_w * q_w)`` with ``q = round(v / s) (+ zero point)`` saturated to the
low type; the GEMM runs on the integers/float8 values (or dequantizes 4-bit weights block by
block) and rescales. The error is bounded by half a quantization step per operand.

Modes (``ctx.options.quantize``), numbered as the code refers to them:

1. ``"auto"``: each Conv/MatMul/Gemm follows its plan decision (``precision.format``):
   ``int8`` on a CPU where the plan's cost says so (``decisions/quantization/cpu_int8.py``, any
   int8 ISA path), as static QDQ when calibration data is given, else dynamic (MatMul and Gemm: the
   same nodes torch's pass quantizes; convs only static, so without calibration data they
   stay float and say why); ``int8`` on a GPU
   (Turing/Ampere INT8 tensor cores) as static S8S8 QDQ, which needs calibration data;
   ``fp8_e4m3`` as FP8 QDQ, which needs calibration data; ``nvfp4``/``q4*`` as 4-bit
   MatMulNBits. Without calibration data the QDQ nodes record why, nothing is raised. With an
   explicit ``precision`` nothing is quantized (as in torch): every node says so.
2. ``"none"``: nothing.
3. ``"int8_dynamic"``: every MatMul and Gemm with a constant weight. ONNX Runtime's dynamic
   quantizer has no Gemm: it first rewrites every Gemm as ``<name>_MatMul`` + Add, so a Gemm
   picked by its name would be missed. graphopt writes each picked Gemm (``alpha`` 1, ``A``
   not transposed, ``beta`` 1 or no C) as the MatMul + Add it computes first (``B``
   transposed once if ``transB``), the MatMul keeping the Gemm's name: exact in fp32, and
   torch's Linear and its exported Gemm get the same INT8. Conv: never (ORT's ConvInteger
   measured 2.7-5x slower than fp32).
4. ``"int8_static"``: Conv/MatMul/Gemm, QDQ: on CPUs U8S8 (activations uint8, weights int8 per
   channel; ``reduce_range`` where the int8 path saturates int16: AVX2 u8s8); on GPUs S8S8
   symmetric (TensorRT's convention). Requires ``ctx.calibration``: without it a
   :class:`GraphoptError` names the fix.
5. ``"fp8"``: Conv/MatMul/Gemm as float8e4m3fn QDQ (per tensor), on GPUs with FP8 tensor cores
   (Ada, Hopper, Blackwell) only. Elsewhere every node records "not applied" and the model is
   unchanged: not an error, a plan for another machine must not crash (as for requested
   formats in :mod:`graphopt.decisions.quantization.recommend`). Requires ``ctx.calibration``.
6. ``"int4"``: MatMul with a constant 2-D weight and ``K >= INT4_BLOCK_SIZE`` (one full block
   of 32): 4-bit symmetric weights, fp activations, any target (CPU and CUDA EPs run it).

Which method, where it pays and the 8-bit scheme per target are decided in
:mod:`graphopt.decisions.quantization.choice`; this module checks only that a method can run a node
(a constant 2-D weight, the dtypes and ops ONNX Runtime's quantizers take) and runs them.

Explicit modes (3-6) are the user's override, like ``pad="always"``: every eligible node is
quantized and the plan's own decision is quoted in the reason. Every pass takes ``exclude``,
node names kept in float (the accuracy guard re-runs a pass with more of them); it records a
``quantize`` decision on every Conv/MatMul/Gemm, applied or "not applied: why", and
``ctx.notes["quantize"]`` (mode, nodes per method, exclusions, new op types, and for FP8 the
ORT graph optimization level the CPU EP can load it at).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import onnx
from onnx import helper, numpy_helper

from graphopt.backends.onnx.context import OnnxContext
from graphopt.backends.onnx.int8_matmul import dynamic_int8_matmuls
from graphopt.backends.onnx.ort_runner import topological
from graphopt.backends.onnx.quantize_ort import (
    FP8_CPU_GRAPH_OPTIMIZATION,
    INT4_BLOCK_SIZE,
    ort_int4,
    ort_static_qdq,
)
from graphopt.decisions.quantization.choice import (
    auto_choice,
    auto_quantize_blocked,
    int8_scheme,
    method_blocked,
    method_description,
)
from graphopt.errors import GraphoptError
from graphopt.ir.decision_details import QuantizeDetail

__all__ = ["INT4_BLOCK_SIZE", "QUANTIZE_PASSES", "QuantizePass", "quantize", "quantize_auto",
           "quantize_fp8", "quantize_int4", "quantize_int8_dynamic", "quantize_int8_static"]

logger = logging.getLogger(__name__)

QuantizePass = Callable[[onnx.ModelProto, OnnxContext, frozenset[str]], "onnx.ModelProto | None"]

_GEMMS = ("Conv", "MatMul", "Gemm")
_FLOAT = {onnx.TensorProto.FLOAT}
_FLOAT_OR_HALF = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16}
_FORMAT = {"int8_dynamic": "int8", "int8_static": "int8", "fp8": "fp8_e4m3", "int4": "int4"}


@dataclass(frozen=True)
class _Pick:
    """A node to quantize: with which ORT method and why."""

    mode: str  # "int8_dynamic" | "int8_static" | "fp8" | "int4"
    why: str


def _weights(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    overridable = {i.name for i in model.graph.input}
    return {t.name: t for t in model.graph.initializer if t.name not in overridable}


def _blocked(mode: str, node: onnx.NodeProto, w: onnx.TensorProto | None,
             ctx: OnnxContext) -> str | None:
    """Can ``mode`` run ``node`` here (cases 3-6); the reason when it may not. Legality is
    checked here, whether it should (profitability, numerics) by :func:`method_blocked`."""
    op = node.op_type
    if w is None:
        return "the weight is not a constant initializer"
    if op == "MatMul" and len(w.dims) != 2:
        return "the MatMul weight is not a 2-D matrix"
    if mode == "int4":
        if op != "MatMul":
            return f"MatMulNBits replaces MatMul only, not {op}"
        if w.dims[0] < INT4_BLOCK_SIZE:
            return f"K={w.dims[0]} is below one {INT4_BLOCK_SIZE}-weight block"
        return None if w.data_type in _FLOAT_OR_HALF else "the weight is not fp32/fp16"
    if w.data_type not in _FLOAT:
        return "onnxruntime's INT8/FP8 quantizers take fp32 weights (quantize before fp16)"
    if mode == "int8_dynamic" and op == "Gemm":
        why = _gemm_not_matmul(node, w)
        if why is not None:
            return f"onnxruntime's dynamic quantizer has no Gemm, and {why}"
    return method_blocked(mode, op, ctx.target)


def _attrs(node: onnx.NodeProto) -> dict[str, object]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _gemm_not_matmul(node: onnx.NodeProto, w: onnx.TensorProto) -> str | None:
    """Why Gemm ``node`` is not a MatMul + Add (case 3), else None."""
    at = _attrs(node)
    if at.get("transA", 0) or at.get("alpha", 1.0) != 1.0:
        return "this Gemm scales or transposes A (not a MatMul + Add)"
    if len(node.input) > 2 and node.input[2] and at.get("beta", 1.0) != 1.0:
        return "this Gemm scales C (not a MatMul + Add)"
    return None if len(w.dims) == 2 else "its weight is not a 2-D matrix"


def _gemms_as_matmuls(model: onnx.ModelProto, names: set[str]) -> onnx.ModelProto:
    """Case 3: Gemm -> MatMul (same name) + Add, ``B`` transposed once if ``transB``."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    inits = {t.name: t for t in out.graph.initializer}
    nodes: list[onnx.NodeProto] = []
    replaced: set[str] = set()
    for node in out.graph.node:
        if node.name not in names or node.op_type != "Gemm":
            nodes.append(node)
            continue
        b = node.input[1]
        if _attrs(node).get("transB", 0):
            t = numpy_helper.from_array(np.ascontiguousarray(
                numpy_helper.to_array(inits[b]).T), f"{b}__graphopt_t_{node.name}")
            out.graph.initializer.append(t)
            replaced.add(b)
            b = t.name
        bias = len(node.input) > 2 and bool(node.input[2])
        mm = node.output[0] + "__graphopt_mm" if bias else node.output[0]
        nodes.append(helper.make_node("MatMul", [node.input[0], b], [mm], name=node.name))
        if bias:
            nodes.append(helper.make_node("Add", [mm, node.input[2]], [node.output[0]],
                                          name=f"{node.name}__graphopt_bias"))
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    subgraphs = any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                    for n in out.graph.node for a in n.attribute)
    used = {i for n in out.graph.node for i in n.input} | {o.name for o in out.graph.output}
    dropped = set() if subgraphs else replaced - used  # the fp32 B only its Gemm read
    if dropped:
        kept = [t for t in out.graph.initializer if t.name not in dropped]
        del out.graph.initializer[:]
        out.graph.initializer.extend(kept)
    return out


def _select(model: onnx.ModelProto, ctx: OnnxContext, mode: str, exclude: frozenset[str],
            off: str | None = None) -> tuple[dict[str, _Pick], dict[str, tuple[str, str]]]:
    """(picked nodes, {node: (format, why not)}) over every Conv/MatMul/Gemm; ``off``: why
    case 1 quantizes nothing (:func:`auto_quantize_blocked`)."""
    weights = _weights(model)
    picks: dict[str, _Pick] = {}
    skipped: dict[str, tuple[str, str]] = {}
    for node in model.graph.node:
        if node.op_type not in _GEMMS or node.domain not in ("", "ai.onnx"):
            continue
        pn = ctx.plan_node(node.name)
        prec = pn.decisions.get("precision") if pn is not None else None
        fmt = prec.detail.format if prec is not None else "fp32"
        plan_why = prec.reason if prec is not None else "the node is not in the plan"
        if mode == "auto":
            m, why = (None, off) if off is not None else auto_choice(
                node.op_type, fmt, plan_why, ctx.target, bool(ctx.calibration))
            if m is None:
                skipped[node.name] = (fmt, why)
                continue
        else:
            m, why = mode, f"quantize={mode!r} requested (plan: {fmt}, {plan_why})"
        w = weights.get(node.input[1]) if len(node.input) > 1 else None
        blocked = _blocked(m, node, w, ctx)
        if blocked is None and m == "int8_dynamic" and node.input[0] in weights:
            blocked = "input A is a constant too (dynamic INT8 quantizes an activation per call)"
        if blocked is None and node.name in exclude:
            blocked = "excluded (exclusion set: the accuracy guard keeps it in float)"
        if blocked is not None:
            skipped[node.name] = (_FORMAT[m], blocked)
        else:
            picks[node.name] = _Pick(m, why)
    return picks, skipped


def _still_float(model: onnx.ModelProto) -> set[str]:
    """Conv/MatMul/Gemm nodes whose weight is still a float initializer."""
    weights = _weights(model)
    return {n.name for n in model.graph.node if n.op_type in _GEMMS and len(n.input) > 1
            and n.input[1] in weights and weights[n.input[1]].data_type in _FLOAT_OR_HALF}


def _apply(model: onnx.ModelProto, ctx: OnnxContext, picks: dict[str, _Pick]
           ) -> tuple[onnx.ModelProto, dict[str, str]]:
    """Run the quantizers (4-bit first, then QDQ, then dynamic); failures -> reasons."""
    out, failed = model, {}
    by_mode: dict[str, list[str]] = {}
    for name, p in picks.items():
        by_mode.setdefault(p.mode, []).append(name)
    ops = {n.name: n.op_type for n in model.graph.node}
    for mode in ("int4", "fp8", "int8_static", "int8_dynamic"):
        nodes = by_mode.get(mode)
        if not nodes:
            continue
        try:
            if mode == "int4":
                out = ort_int4(out, nodes)
                continue
            scheme = int8_scheme(ctx.target, mode)
            if mode == "int8_dynamic":
                gemms = {n for n in nodes if ops[n] == "Gemm"}
                out = _gemms_as_matmuls(out, gemms) if gemms else out
                out = dynamic_int8_matmuls(out, nodes, reduce_range=scheme.reduce_range)
            else:
                assert ctx.calibration
                out = ort_static_qdq(out, nodes, sorted({ops[n] for n in nodes}),
                                     ctx.calibration, "fp8" if mode == "fp8" else "int8",
                                     symmetric=scheme.symmetric,
                                     reduce_range=scheme.reduce_range)
        except Exception as exc:  # ORT's quantizers raise many types: report, do not crash
            logger.warning("quantize %s failed: %s", mode, exc)
            failed.update({n: f"the {mode} quantizer failed: {type(exc).__name__}: "
                              f"{str(exc)[:200]}" for n in nodes})
    return out, failed


def _run(model: onnx.ModelProto, ctx: OnnxContext, mode: str, exclude: frozenset[str]
         ) -> onnx.ModelProto | None:
    off = auto_quantize_blocked(ctx.options) if mode == "auto" else None
    picks, skipped = _select(model, ctx, mode, exclude, off)
    out, failed = _apply(model, ctx, picks) if picks else (model, {})
    left = _still_float(out) if picks else set()
    done: dict[str, list[str]] = {}
    for name, p in picks.items():
        why = failed.get(name) or ("the quantizer left it unchanged"
                                   if name in left else None)
        if why is not None:
            skipped[name] = (_FORMAT[p.mode], why)
            continue
        done.setdefault(p.mode, []).append(name)
        method = method_description(p.mode, ctx.target, INT4_BLOCK_SIZE)
        ctx.decide(name, QuantizeDetail(_FORMAT[p.mode], p.mode), f"{method}: {p.why}")
    for name, (fmt, why) in skipped.items():
        ctx.decide(name, QuantizeDetail(fmt), f"not applied: {why}", applied=False)
    before_ops = {m.op_type for m in model.graph.node}
    note: dict[str, object] = {
        "mode": mode, "nodes": {m: sorted(n) for m, n in sorted(done.items())},
        "excluded": sorted(exclude), "not_applied": len(skipped),
        "new_op_types": dict(sorted(Counter(
            f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in out.graph.node
            if n.op_type not in before_ops).items()))}
    if "fp8" in done:
        note["ort_cpu_graph_optimization_level"] = FP8_CPU_GRAPH_OPTIMIZATION
    if off is not None:
        note["reason"] = off
    ctx.notes["quantize"] = note
    logger.info("quantize (%s): %s; %d nodes not applied", mode,
                {m: len(n) for m, n in done.items()} or "nothing", len(skipped))
    return _in_order(out) if done else None


def _in_order(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its nodes in an order the checker takes: ORT's quantizers append the
    nodes they make, and may put a control-flow node before a value its subgraph reads."""
    g = model.graph
    available = {i.name for i in g.input} | {t.name for t in g.initializer}
    nodes = topological(list(g.node), available)
    if nodes != list(g.node):
        del g.node[:]
        g.node.extend(nodes)
    return model


def _need_calibration(ctx: OnnxContext, mode: str) -> None:
    if not ctx.calibration:
        raise GraphoptError(
            f"quantize={mode!r} needs calibration data (a few representative input batches) "
            "and none was given",
            "pass calibration=[{input_name: array, ...}, ...] (10-100 batches of real inputs), "
            "or use quantize='int8_dynamic' (no calibration) or 'int4' (weight-only)")


def quantize_auto(model: onnx.ModelProto, ctx: OnnxContext,
                  exclude: frozenset[str] = frozenset()) -> onnx.ModelProto | None:
    """Case 1: the plan's per-node precision decisions, with the ORT method that runs them."""
    return _run(model, ctx, "auto", exclude)


def quantize_int8_dynamic(model: onnx.ModelProto, ctx: OnnxContext,
                          exclude: frozenset[str] = frozenset()) -> onnx.ModelProto | None:
    """Case 3: dynamic INT8 MatMuls (DynamicQuantizeLinear + MatMulInteger)."""
    return _run(model, ctx, "int8_dynamic", exclude)


def quantize_int8_static(model: onnx.ModelProto, ctx: OnnxContext,
                         exclude: frozenset[str] = frozenset()) -> onnx.ModelProto | None:
    """Case 4: static INT8 QDQ from ``ctx.calibration``; GraphoptError without it."""
    _need_calibration(ctx, "int8_static")
    return _run(model, ctx, "int8_static", exclude)


def quantize_fp8(model: onnx.ModelProto, ctx: OnnxContext,
                 exclude: frozenset[str] = frozenset()) -> onnx.ModelProto | None:
    """Case 5: FP8 E4M3 QDQ on FP8 GPUs (elsewhere: reasons, no change)."""
    if ctx.target.is_gpu and ctx.target.has("fp8"):
        _need_calibration(ctx, "fp8")
    return _run(model, ctx, "fp8", exclude)


def quantize_int4(model: onnx.ModelProto, ctx: OnnxContext,
                  exclude: frozenset[str] = frozenset()) -> onnx.ModelProto | None:
    """Case 6: 4-bit weight-only MatMulNBits for MatMuls with K >= one block."""
    return _run(model, ctx, "int4", exclude)


#: mode -> pass; the accuracy guard calls ``QUANTIZE_PASSES[mode](model, ctx, exclude)``
QUANTIZE_PASSES: Mapping[str, QuantizePass] = MappingProxyType({
    "auto": quantize_auto, "int8_dynamic": quantize_int8_dynamic,
    "int8_static": quantize_int8_static, "fp8": quantize_fp8, "int4": quantize_int4})


def quantize(model: onnx.ModelProto, ctx: OnnxContext,
             exclude: frozenset[str] = frozenset()) -> onnx.ModelProto | None:
    """The pass for ``ctx.options.quantize`` (an :data:`OnnxPass` with ``exclude`` empty)."""
    mode = ctx.options.quantize
    if mode == "none":
        ctx.notes["quantize"] = {"mode": "none", "nodes": {}}
        return None
    return QUANTIZE_PASSES[mode](model, ctx, exclude)
