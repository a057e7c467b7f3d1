"""Mixed precision on ONNX: GEMM-like nodes in fp16, sensitive ops as fp32 islands, Casts at
the boundaries; the model's input and output types are kept.

Identity: a fp16 MatMul/Gemm/Conv whose kernel accumulates in fp32 (cuBLAS/cuDNN and MLAS do)
differs from the fp32 op only by the rounding of its inputs (unit roundoff 2^-11); ops whose
error or range is not bounded that way stay fp32, with the same rules and reasons as the torch
path (``decisions.precision.by_op``). ``Cast(Cast(x, fp16), fp32)`` is ``x`` rounded once, so
casts at island boundaries add no error beyond that rounding. The pipeline's accuracy guard
measures the result and blocks nodes until it is within tolerance.

Why not ``onnxruntime.transformers.float16`` or onnxconverter-common (checked, 1.16.0 installs
and imports with onnx 1.23): both cast every blocked node's output back to fp16, so a chain of
fp32 nodes (a decomposed RMSNorm ``Pow -> ReduceMean -> Add -> Sqrt``) round-trips through fp16
between its ops and ``x^2`` overflows exactly where the island should protect it; ORT's copy
also gives two blocked readers of one tensor the same Cast output name (invalid SSA) and
appends its Casts out of order, and onnxconverter-common clamps weights to 1e4 by default and
sorts the graph in O(n^2). Here dtypes propagate like autocast, so an island stays fp32 until a
GEMM wants fp16 again.

Cases, per node in topological order; which role a float node takes is the rule table both
backends share (``decisions.precision.roles``), on facts this pass reads from the ONNX graph:

1. GEMM-like nodes of the plan run fp16 where this pass can rewrite them (``LOW_OPS``; a node
   without a plan node by its op), unless a constant they read does not fit fp16 (a finite
   value beyond 65504; inf and NaN convert exactly).
2. fp32 islands are the plan's decision (``decisions.precision.by_op``: softmax, norms,
   exp/log/pow/sqrt, sums, trig by canonical op, squares ``Mul(x, x)``, norm patterns,
   norm/softmax kernel classes); a node without a plan node (added by an earlier pass) by its
   op type, which is canonical, and its inputs.
3. Means/average pools: fp16 over at most 2^11 elements, else an island.
4. ``FOLLOW_OPS`` (elementwise, data movement) run fp16 when all their activation inputs are
   fp16, else fp32 (a fp32 residual stream stays fp32). Constants do not vote.
5. Unknown ops, custom domains and the nodes in ``exclude`` (the guard's): fp32.
6. ``Cast``/``Shape``/``Size`` read any dtype; ops with integer/bool results read their inputs
   at the original dtypes (comparisons are not rounded).
7. Not applicable: no fp16 compute dtype, control flow (subgraphs read outer tensors by name).

Constants read only in fp16 are converted once (same name); read in both, a ``__fp16`` copy is
added. Each fp32/fp16 boundary gets one Cast per tensor and dtype; a graph output computed in
fp16 is renamed ``<name>__fp16`` and cast back to its original name and type.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from functools import lru_cache
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from graphopt.backends.onnx.context import OnnxContext
from graphopt.backends.onnx.ort_runner import tensor_types, topological
from graphopt.decisions.precision.by_op import LOW_KINDS, kept_fp32, node_island
from graphopt.decisions.precision.roles import (
    Backend,
    Const,
    NodeFacts,
    OpTables,
    Role,
    assign_role,
)
from graphopt.ir.decision_details import PrecisionDetail
from graphopt.ir.order import unique_name

__all__ = ["FOLLOW_OPS", "LOW_OPS", "MEAN_OPS", "TABLES", "reduce_precision"]

logger = logging.getLogger(__name__)

_T = onnx.TensorProto

LOW_OPS = {"MatMul": "GEMM", "Gemm": "GEMM", "Einsum": "GEMM", "Conv": "conv",
           "ConvTranspose": "conv"}
MEAN_OPS = frozenset({"ReduceMean", "GlobalAveragePool", "AveragePool"})
FOLLOW_OPS = frozenset({
    "Add", "Sub", "Mul", "Div", "Sum", "Neg", "Abs", "Relu", "Gelu", "Sigmoid", "Tanh",
    "HardSigmoid", "HardSwish", "LeakyRelu", "Elu", "Selu", "Celu", "Mish", "PRelu", "Clip",
    "Where", "Max", "Min", "Erf", "Sign", "Floor", "Ceil", "Round", "Softsign", "Dropout",
    "Identity", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Concat", "Split",
    "Slice", "Gather", "GatherElements", "GatherND", "Expand", "Tile", "Pad", "MaxPool",
    "GlobalMaxPool", "ReduceMax", "ReduceMin", "DepthToSpace", "SpaceToDepth", "Resize",
    "Trilu", "ScatterND", "ScatterElements", "ThresholdedRelu", "Shrink",
    "TopK",  # order statistics are exact in any format (torch's topk/sort follow too)
})
#: the tables as the shared role rules read them (``decisions.precision.roles``)
TABLES = OpTables(LOW_OPS, MEAN_OPS, FOLLOW_OPS)
_ANY_INPUT = frozenset({"Cast", "CastLike", "Shape", "Size"})
_NAMES = {_T.FLOAT16: "fp16", _T.FLOAT: "fp32"}


# ---------------------------------------------------------------------------------- helpers
@lru_cache(maxsize=512)
def _bound(domain: str, op: str, opset: int, n_in: int, n_out: int
           ) -> tuple[frozenset[int], frozenset[int]] | None:
    """(inputs, outputs) typed by a type variable that allows fp16 and fp32: the slots that
    change dtype when the node runs in fp16. None when ONNX has no schema for the op."""
    try:
        schema = onnx.defs.get_schema(op, max_inclusive_version=opset, domain=domain)
    except onnx.defs.SchemaError:
        return None
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    ok = {v for v, types in allowed.items() if {"tensor(float16)", "tensor(float)"} <= types}

    def formal(params: Any, n: int) -> list[str]:
        out = []
        for i in range(n):
            if i < len(params):
                out.append(params[i].type_str)
            elif params and params[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic:
                out.append(params[-1].type_str)
            else:
                out.append("")
        return out

    outs = formal(schema.outputs, n_out)
    vars_ = {t for t in outs if t in ok}
    ins = formal(schema.inputs, n_in)
    return (frozenset(i for i, t in enumerate(ins) if t in vars_),
            frozenset(i for i, t in enumerate(outs) if t in vars_))


def _const_array(node: onnx.NodeProto) -> np.ndarray | None:
    for a in node.attribute:
        if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
            return numpy_helper.to_array(a.t)
        if a.name == "value_float":
            return np.asarray(a.f, dtype=np.float32)
        if a.name == "value_floats":
            return np.asarray(list(a.floats), dtype=np.float32)
    return None


def _numel(vi: onnx.ValueInfoProto | None) -> int | None:
    if vi is None or not vi.type.tensor_type.HasField("shape"):
        return None
    dims = [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
    return None if None in dims else int(np.prod(dims, dtype=np.int64))


# ------------------------------------------------------------------------------------- pass
class _Rewriter:
    """Role assignment (cases 1-6) and the rewrite, over one copy of the model."""

    def __init__(self, model: onnx.ModelProto, ctx: OnnxContext, exclude: frozenset[str]
                 ) -> None:
        self.ctx, self.model = ctx, model
        g = model.graph
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                          17)
        self.types = tensor_types(model)
        graph_inputs = {vi.name for vi in g.input}  # an initializer listed as an input can
        self.inits = {t.name: t for t in g.initializer  # be overridden: an activation then
                      if t.name not in graph_inputs}
        self.consts = {n.output[0]: n for n in g.node if n.op_type == "Constant" and n.output
                       and _const_array(n) is not None}  # sparse values: cast at run time
        self.blocked = set(exclude)
        self.cur: dict[str, int] = {}
        self._weak_max: dict[str, float] = {}
        self.names = {t for n in g.node for t in (*n.input, *n.output)} | set(self.inits)
        self.names |= {vi.name for vi in (*g.input, *g.output)}

    def orig(self, t: str) -> int:
        vi = self.types.get(t)
        return vi.type.tensor_type.elem_type if vi is not None else _T.UNDEFINED

    def weak(self, t: str) -> bool:
        return t in self.inits or t in self.consts

    def weak_max(self, t: str) -> float:
        if t not in self._weak_max:
            arr = (numpy_helper.to_array(self.inits[t]) if t in self.inits
                   else _const_array(self.consts[t]))
            finite = np.abs(arr[np.isfinite(arr)]) if arr is not None else np.zeros(0)
            self._weak_max[t] = float(finite.max()) if finite.size else 0.0  # inf fits
        return self._weak_max[t]

    def fresh(self, base: str) -> str:
        return unique_name(base, self.names)

    def role(self, node: onnx.NodeProto, bound: tuple[frozenset[int], frozenset[int]] | None
             ) -> tuple[Role, str]:
        """(role, reason): ``any`` for casts and shape queries, else the shared rule table
        (``decisions.precision.roles``) on the node's facts."""
        if node.op_type in _ANY_INPUT and node.domain in ("", "ai.onnx"):
            return Role.ANY, "casts and shape queries read any dtype"
        return assign_role(self.facts(node, bound), self.ctx.compute_dtype, Backend.ONNX)

    def facts(self, node: onnx.NodeProto, bound: tuple[frozenset[int], frozenset[int]] | None
              ) -> NodeFacts:
        """Cases 1-5 of the module doc, as facts: the fp32 inputs in the slots that change
        dtype split into activations (with their dtype so far) and constants."""
        op, excluded = node.op_type, None
        if node.name in self.blocked:
            excluded = "kept fp32 by the accuracy guard (most sensitive node)"
        elif node.domain not in ("", "ai.onnx") or bound is None:
            excluded = f"{node.domain or 'ai.onnx'}::{op} has no ONNX schema: numerics unknown"
        fp32_in = [node.input[i] for i in sorted(bound[0] if bound else ())
                   if i < len(node.input) and node.input[i]
                   and self.orig(node.input[i]) == _T.FLOAT]
        return NodeFacts(
            op=op, op_class=TABLES.op_class(op), plan=self.ctx.plan_node(node.name),
            result="fp32" if any(self.orig(o) == _T.FLOAT for o in node.output if o) else None,
            excluded=excluded, work=LOW_OPS.get(op, ""), canonical=op, inputs=tuple(node.input),
            acts=tuple((t, _NAMES.get(self.cur.get(t, _T.UNDEFINED)))
                       for t in fp32_in if not self.weak(t)),
            consts=tuple(Const(t, self.weak_max(t)) for t in fp32_in if self.weak(t)),
            count=self._reduced(node) if op in MEAN_OPS and excluded is None else None)

    def _reduced(self, node: onnx.NodeProto) -> int | None:
        n_in, n_out = _numel(self.types.get(node.input[0])), _numel(self.types.get(node.output[0]))
        return None if not n_in or not n_out else n_in // n_out

    def run(self) -> tuple[list[onnx.NodeProto], dict[str, int], dict[str, str]]:
        g = self.model.graph
        for vi in g.input:
            self.cur[vi.name] = self.orig(vi.name)
        for t in (*self.inits, *self.consts):
            self.cur[t] = self.orig(t)
        avail = {vi.name for vi in g.input} | set(self.inits)
        order = topological(list(g.node), avail)
        casts: dict[tuple[str, int], str] = {}
        weak_low: dict[str, list[tuple[onnx.NodeProto, int]]] = defaultdict(list)
        weak_fp32_readers: set[str] = set()
        out_nodes: list[onnx.NodeProto] = []
        roles: dict[str, str] = {}
        for node in order:
            if node.op_type == "Constant":
                out_nodes.append(node)
                continue
            bound = _bound(node.domain if node.domain != "ai.onnx" else "", node.op_type,
                           self.opset, len(node.input), len(node.output))
            role, why = self.role(node, bound)
            roles[node.name] = role.value
            low = role == Role.LOW
            ins, outs = bound if (low and bound) else (frozenset(), frozenset())
            for i, t in enumerate(node.input):
                if not t or role == Role.ANY:
                    continue
                want = _T.FLOAT16 if (i in ins and self.orig(t) == _T.FLOAT) else self.orig(t)
                if self.weak(t):
                    if want == _T.FLOAT16:
                        weak_low[t].append((node, i))
                    else:
                        weak_fp32_readers.add(t)
                    continue
                have = self.cur.get(t, self.orig(t))
                if have != want and want in (_T.FLOAT, _T.FLOAT16):
                    key = (t, want)
                    if key not in casts:
                        casts[key] = self.fresh(f"{t}__{_NAMES[want]}")
                        out_nodes.append(onnx.helper.make_node(
                            "Cast", [t], [casts[key]], to=want,
                            name=self.fresh(f"graphopt_precision/{t}/to_{_NAMES[want]}")))
                        self.cur[casts[key]] = want
                    node.input[i] = casts[key]
            for j, o in enumerate(node.output):
                if not o:
                    continue
                self.cur[o] = (_T.FLOAT16 if j in outs and self.orig(o) == _T.FLOAT
                               else self.orig(o))
            if node.op_type == "CastLike" and len(node.input) > 1 and node.output:
                self.cur[node.output[0]] = self.cur.get(node.input[1], self.orig(node.input[1]))
            out_nodes.append(node)
            detail = PrecisionDetail("fp16" if low else "fp32", role=role)
            self.ctx.decide(node.name, detail, why, applied=low)
        self._convert_weak(weak_low, weak_fp32_readers)
        return out_nodes, casts, roles

    def _convert_weak(self, readers: dict[str, list[tuple[onnx.NodeProto, int]]],
                      fp32_readers: set[str]) -> None:
        g = self.model.graph
        out_names = {o.name for o in g.output}
        for t, uses in readers.items():
            shared = t in fp32_readers or t in out_names
            arr = (numpy_helper.to_array(self.inits[t]) if t in self.inits
                   else _const_array(self.consts[t]))
            half = np.asarray(arr).astype(np.float16)
            if not shared and t in self.inits:
                self.inits[t].CopyFrom(numpy_helper.from_array(half, t))
                self.cur[t] = _T.FLOAT16
                continue
            if not shared:  # a Constant node read only in fp16: convert its value
                node = self.consts[t]
                del node.attribute[:]
                node.attribute.append(onnx.helper.make_attribute(
                    "value", numpy_helper.from_array(half, t)))
                self.cur[t] = _T.FLOAT16
                continue
            copy = self.fresh(f"{t}__fp16")
            g.initializer.append(numpy_helper.from_array(half, copy))
            self.cur[copy] = _T.FLOAT16
            for node, i in uses:
                node.input[i] = copy


def _finish(model: onnx.ModelProto, nodes: list[onnx.NodeProto], rw: _Rewriter) -> int:
    """Graph outputs back to their types, value_info with the new dtypes; returns the number
    of output casts added."""
    g = model.graph
    added = 0
    for out in g.output:
        o = out.name
        if rw.cur.get(o, rw.orig(o)) == rw.orig(o):
            continue
        low = rw.fresh(f"{o}__fp16")
        for n in nodes:
            for i, t in enumerate(n.input):
                if t == o:
                    n.input[i] = low
            for i, t in enumerate(n.output):
                if t == o:
                    n.output[i] = low
        rw.cur[low] = rw.cur[o]
        rw.types[low] = rw.types[o]
        nodes.append(onnx.helper.make_node("Cast", [low], [o], to=rw.orig(o),
                                           name=rw.fresh(f"graphopt_precision/{o}/output")))
        rw.cur[o] = rw.orig(o)
        added += 1
    copies = []
    for n in nodes:  # detach from the repeated field before clearing it
        c = onnx.NodeProto()
        c.CopyFrom(n)
        copies.append(c)
    del g.node[:]
    g.node.extend(copies)
    nodes = copies
    graph_io = {vi.name for vi in (*g.input, *g.output)} | set(rw.inits)
    del g.value_info[:]
    for n in nodes:
        for o in n.output:
            src = rw.types.get(o) or rw.types.get(n.input[0] if n.input else "")
            if not o or o in graph_io or src is None or o not in rw.cur:
                continue
            vi = onnx.ValueInfoProto()
            vi.CopyFrom(src)
            vi.name = o
            vi.type.tensor_type.elem_type = rw.cur[o]
            g.value_info.append(vi)
    return added


def reduce_precision(model: onnx.ModelProto, ctx: OnnxContext,
                     exclude: frozenset[str] = frozenset()) -> onnx.ModelProto | None:
    """The precision pass (cases 1-7); None when it does not apply or changes nothing.

    ``exclude``: node names kept fp32 (the accuracy guard re-runs the pass with more of them).
    """
    if ctx.compute_dtype != "fp16":
        ctx.notes["precision"] = {"format": ctx.compute_dtype,
                                  "reason": f"compute dtype {ctx.compute_dtype}: no fp16 nodes"}
        if ctx.compute_dtype == "fp32":  # each GEMM-like node says why, as on torch
            why = ctx.notes.get("precision_choice", {}).get("reason", "fp32")
            for node in ctx.plan.nodes:
                if node.op_type in LOW_KINDS and node_island(node) is None:
                    ctx.decide(node.name, PrecisionDetail("fp32"), kept_fp32(why),
                               applied=False)
        return None
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
           for n in model.graph.node for a in n.attribute):
        ctx.notes["precision"] = {"format": "fp32", "reason": "control-flow subgraphs read "
                                  "outer tensors by name: the pass does not retype them"}
        return None
    out = onnx.ModelProto()
    out.CopyFrom(model)
    rw = _Rewriter(out, ctx, exclude)
    nodes, casts, roles = rw.run()
    low = sorted(n for n, r in roles.items() if r == "low")
    if not low:
        ctx.notes["precision"] = {"format": "fp32", "reason": "no node can run in fp16"}
        return None
    added = _finish(out, nodes, rw)
    counts = {r: sum(1 for v in roles.values() if v == r) for r in sorted(set(roles.values()))}
    ctx.notes["precision"] = {"format": "fp16", "roles": counts, "casts": len(casts) + added,
                              "blocked": sorted(rw.blocked)}
    logger.info("precision: %d of %d nodes in fp16, %d casts, %d blocked by the guard",
                len(low), len(roles), len(casts) + added, len(rw.blocked))
    return out
