"""Dims, FLOPs and bytes of single nodes, by op family.

Conventions (so both frontends agree):

1. GEMM-like dims are ``M, N, K, batch``. A ``MatMul`` whose right operand is 2-D folds the left
   operand's leading dims into ``M`` (``batch = 1``), exactly like ``Linear``. A grouped
   (mixture-of-experts) ``MatMul(A[S, K], B[G, K, N], offs)`` has ``M = S``, ``batch = 1``:
   each row meets one group's matrix, and all of ``B`` is read once.
2. Convolutions use implicit-GEMM dims: ``M = N * prod(out_spatial)``, ``N = C_out``,
   ``K = C_in / groups * prod(kernel)``; ``ConvTranspose`` uses the input spatial size for ``M``.
3. Attention dims are ``batch, heads, seq_q, seq_kv, head_dim``; FLOPs are the two matmuls
   (halved when causal over a square mask) plus the softmax.
4. Everything else reports ``numel`` (output elements), plus ``rows``/``cols`` for row-wise ops.
5. Free views move no bytes; gathers and slices read what they write, not the whole source.
   A scatter reads and writes its whole input (a copy with the updates written in) unless it
   is in place (``inplace=True``): then it reads its indices and updates and writes only the
   updated elements. One op per update when it reduces (add, max, ...; mean: a sum and a
   divide), none when it overwrites. Its dims add ``updates``.
6. A node whose every output has zero elements (a batch of 0, an empty slice) does no work:
   frameworks return before launching a kernel, so it has no FLOPs and moves no bytes. Its dims
   keep the zeros, so the report shows why.
7. ``Einsum`` and ``LSTM``/``GRU``/``RNN`` take dims and FLOPs from :mod:`graphopt.analysis.einsum`
   and :mod:`graphopt.analysis.recurrent`, whatever their class.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from graphopt.analysis.einsum import einsum_work
from graphopt.analysis.kernel_class import KernelClass
from graphopt.analysis.recurrent import rnn_dims, rnn_flops
from graphopt.ir.graph import Graph, Node, TensorInfo, dtype_bytes

__all__ = ["OpWork", "attention_dims_from_qk", "attention_flops", "einsum_shapes", "gemm_dims",
           "has_empty_outputs", "node_work"]

# FLOPs per output element of elementwise ops that are more than one add or multiply. Rough
# counts of the arithmetic a vectorized kernel does; they matter little, since these ops are
# memory-bound on every target in the database.
_ELEMENTWISE_FLOPS: dict[str, int] = {
    "Sigmoid": 4, "Silu": 5, "Gelu": 8, "FastGelu": 8, "BiasGelu": 9, "Tanh": 4, "Exp": 2,
    "Log": 2, "Erf": 4, "Softplus": 4, "Mish": 8, "HardSwish": 3, "HardSigmoid": 2, "Elu": 3,
    "Selu": 3, "Celu": 3, "Pow": 2, "Sqrt": 1, "Rsqrt": 2, "Reciprocal": 1, "Sin": 4, "Cos": 4,
    "Cast": 0, "Dropout": 0, "QuantizeLinear": 3, "DequantizeLinear": 2,
    "Glu": 5,  # a sigmoid and a multiply
    "Polar": 10,  # a cos, a sin and two multiplies
}
_SOFTMAX_FLOPS_PER_ELEMENT = 5  # max, subtract, exp, sum, divide
_NORM_FLOPS_PER_ELEMENT = {"LayerNormalization": 8, "GroupNormalization": 8,
                           "InstanceNormalization": 8, "BatchNormalization": 2,
                           "RMSNormalization": 4,
                           "SkipLayerNormalization": 9, "SkipSimplifiedLayerNormalization": 5,
                           "LpNormalization": 3}
# torch _weight_norm: square and sum for ||v||, then v / ||v|| * g
_WEIGHT_NORM_FLOPS_PER_ELEMENT = 4


class OpWork:
    """Work of one node before classification: dims, FLOPs and the bytes it moves."""

    __slots__ = ("bytes_read", "bytes_written", "dims", "flops", "param_count")

    def __init__(self, dims: dict[str, int], flops: int, bytes_read: int, bytes_written: int,
                 param_count: int) -> None:
        self.dims = dims
        self.flops = flops
        self.bytes_read = bytes_read
        self.bytes_written = bytes_written
        self.param_count = param_count


def _shape(t: TensorInfo | None) -> tuple[int, ...]:
    """Static shape with dynamic dims taken as 1 (they are flagged elsewhere)."""
    if t is None or t.shape is None:
        return ()
    return tuple(d if isinstance(d, int) else 1 for d in t.shape)


def gemm_dims(node: Node, ins: list[TensorInfo | None]) -> dict[str, int]:
    """M, N, K and batch of a Linear, Gemm or MatMul (conventions 1)."""
    a = _shape(ins[0]) if ins else ()
    b = _shape(ins[1]) if len(ins) > 1 else ()
    op = node.op_type
    if op == "QGemm":  # com.microsoft: A, a_scale, a_zp, B, ...; Gemm's transA/transB
        a = a if len(a) == 2 else (1, a[0] if a else 1)
        b = _shape(ins[3]) if len(ins) > 3 else ()
        b = b if len(b) == 2 else ((b[0] if b else 1), 1)
        m, k = (a[1], a[0]) if node.attrs.get("transA", 0) else a
        n = b[0] if node.attrs.get("transB", 0) else b[1]
        return {"M": m, "N": n, "K": k, "batch": 1}
    if op in ("Linear", "MatMulNBits"):
        k = a[-1] if a else 1
        if op == "MatMulNBits":
            n, k = int(node.attrs.get("N", 1)), int(node.attrs.get("K", k))
        else:
            n = b[0] if b else 1
        m = math.prod(a[:-1]) if len(a) > 1 else 1
        return {"M": m, "N": n, "K": k, "batch": 1}
    if op == "Gemm":
        a2 = a if len(a) == 2 else (1, a[0] if a else 1)
        b2 = b if len(b) == 2 else ((b[0] if b else 1), 1)
        m, k = (a2[1], a2[0]) if node.attrs.get("transA", 0) else a2
        n = b2[0] if node.attrs.get("transB", 0) else b2[1]
        return {"M": m, "N": n, "K": k, "batch": 1}
    # MatMul family (numpy semantics), incl. MatMulInteger / QLinearMatMul operands.
    if op == "QLinearMatMul" and len(ins) > 3:
        b = _shape(ins[3])
    if op == "MatMul" and node.attrs.get("transB"):  # com.microsoft FusedMatMul
        b = b[:-2] + (b[-1], b[-2]) if len(b) >= 2 else b
    if op == "MatMul" and node.attrs.get("transA"):
        a = a[:-2] + (a[-1], a[-2]) if len(a) >= 2 else a
    if len(a) <= 1:
        m, k = 1, (a[0] if a else 1)
        lead_a: tuple[int, ...] = ()
    else:
        m, k = a[-2], a[-1]
        lead_a = a[:-2]
    if len(b) <= 1:
        n, lead_b = 1, ()
    else:
        n, lead_b = b[-1], b[:-2]
    if node.attrs.get("grouped") and len(a) == 2 and len(b) == 3:  # each row: one group
        return {"M": m, "N": n, "K": k, "batch": 1}
    if len(b) == 2 and len(a) > 2:  # weight-like right operand: fold A's batch into M
        return {"M": m * math.prod(lead_a), "N": n, "K": k, "batch": 1}
    batch = math.prod(_broadcast(lead_a, lead_b))
    return {"M": m, "N": n, "K": k, "batch": batch}


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + a
    b = (1,) * (n - len(b)) + b
    return tuple(max(x, y) for x, y in zip(a, b, strict=False))


def _conv_dims(node: Node, ins: list[TensorInfo | None], out: TensorInfo | None) -> dict[str, int]:
    x, w = _shape(ins[0]), _shape(ins[1]) if len(ins) > 1 else ()
    if node.op_type == "QLinearConv" and len(ins) > 3:
        w = _shape(ins[3])
    groups = int(node.attrs.get("group", 1) or 1)
    n = x[0] if x else 1
    kernel = math.prod(w[2:]) if len(w) > 2 else 1
    if node.op_type == "ConvTranspose":
        c_in = x[1] if len(x) > 1 else 1
        c_out = (w[1] if len(w) > 1 else 1) * groups
        m = n * math.prod(x[2:])
    else:
        c_out = w[0] if w else 1
        c_in = (w[1] if len(w) > 1 else 1) * groups
        m = n * math.prod(_shape(out)[2:])
    return {"M": m, "N": c_out, "K": c_in // groups * kernel, "groups": groups,
            "batch": n, "C_in": c_in, "C_out": c_out}


def attention_dims_from_qk(q: TensorInfo | None, k: TensorInfo | None,
                           num_heads: int | None = None) -> dict[str, int]:
    """Attention dims from Q [B, H, Sq, D] and K [B, H, Skv, D] (or packed [B, S, H*D])."""
    qs, ks = _shape(q), _shape(k)
    if len(qs) == 3 and num_heads:  # packed layout (com.microsoft Attention / MHA)
        b, sq, hidden = qs
        skv = ks[1] if len(ks) == 3 else sq
        return {"batch": b, "heads": num_heads, "seq_q": sq, "seq_kv": skv,
                "head_dim": hidden // num_heads}
    if len(qs) < 2:
        return {"batch": 1, "heads": 1, "seq_q": 1, "seq_kv": 1, "head_dim": qs[-1] if qs else 1}
    lead = qs[:-2]
    b = lead[0] if lead else 1
    h = math.prod(lead[1:]) if len(lead) > 1 else 1
    skv = ks[-2] if len(ks) >= 2 else qs[-2]
    return {"batch": b, "heads": h, "seq_q": qs[-2], "seq_kv": skv, "head_dim": qs[-1]}


def attention_flops(d: dict[str, int], head_dim_v: int | None = None, causal: bool = False) -> int:
    bh = d["batch"] * d["heads"]
    scores = bh * d["seq_q"] * d["seq_kv"]
    mm = 2 * scores * d["head_dim"] + 2 * scores * (head_dim_v or d["head_dim"])
    if causal and d["seq_q"] == d["seq_kv"]:
        mm //= 2  # a causal kernel skips the masked upper triangle
    return mm + _SOFTMAX_FLOPS_PER_ELEMENT * scores


def _io_bytes(ins: list[TensorInfo | None], outs: list[TensorInfo | None]) -> tuple[int, int, int]:
    seen: set[str] = set()
    read = params = 0
    for t in ins:
        if t is None or t.name in seen:
            continue
        seen.add(t.name)
        read += t.nbytes
        if t.kind == "param":
            params += t.numel
    written = sum(t.nbytes for t in outs if t is not None)
    return read, written, params


def einsum_shapes(ins: list[TensorInfo | None]) -> list[tuple[int, ...]]:
    """The operands' static shapes for :func:`graphopt.analysis.einsum.einsum_work`."""
    return [_shape(t) for t in ins]


def has_empty_outputs(outs: list[TensorInfo | None]) -> bool:
    """True when every output is known to have zero elements (convention 6)."""
    return bool(outs) and all(t is not None and t.shape is not None and 0 in t.shape
                              for t in outs)


def node_work(graph: Graph, node: Node, kernel_class: KernelClass) -> OpWork:
    """Dims, FLOPs and bytes of ``node`` if it runs as one kernel of ``kernel_class``."""
    ins = graph.input_infos(node)
    outs = graph.output_infos(node)
    out = outs[0] if outs else None
    read, written, params = _io_bytes(ins, outs)
    numel = out.numel if out is not None else 0
    handler = _OP_HANDLERS.get(node.op_type) or _HANDLERS.get(kernel_class)
    if handler is not None:
        dims, flops, read = handler(node, ins, out, numel, read)
    else:
        dims, flops = {"numel": numel}, 0
    if node.op_type in _SCATTERS and node.attrs.get("inplace") and "updates" in dims:  # 5
        written = _updated_bytes(dims["updates"], out)
    if kernel_class is KernelClass.VIEW:
        read = written = 0
    if has_empty_outputs(outs):  # convention 6
        flops = read = written = 0
    return OpWork(dims, flops, read, written, params)


_Handler = Callable[[Node, list, "TensorInfo | None", int, int], tuple[dict[str, int], int, int]]


def _gemm(node, ins, out, numel, read):
    d = gemm_dims(node, ins)
    flops = 2 * d["M"] * d["N"] * d["K"] * d["batch"]
    if node.op_type in ("Linear", "Gemm") and len(ins) > 2 and ins[2] is not None:
        flops += d["M"] * d["N"] * d["batch"]  # bias add
    return d, flops, read


def _conv(node, ins, out, numel, read):
    d = _conv_dims(node, ins, out)
    flops = 2 * d["M"] * d["N"] * d["K"]
    if len(ins) > 2 and ins[2] is not None and node.op_type in ("Conv", "ConvTranspose"):
        flops += numel
    return d, flops, read


def _attention(node, ins, out, numel, read):
    heads = node.attrs.get("num_heads")
    d = attention_dims_from_qk(ins[0] if ins else None, ins[1] if len(ins) > 1 else None,
                               int(heads) if heads else None)
    v = _shape(ins[2]) if len(ins) > 2 else ()
    dv = v[-1] if len(v) == 4 else None
    causal = bool(node.attrs.get("is_causal"))
    flops = attention_flops(d, dv, causal)
    return ({**d, "causal": 1} if causal else d), flops, read


def _rowwise(per_element: int | None):
    def handler(node, ins, out, numel, read):
        shape = _shape(out)
        axis = int(node.attrs.get("axis", -1))
        cols = shape[axis] if shape and -len(shape) <= axis < len(shape) else 1
        if node.op_type in ("LayerNormalization", "RMSNormalization"):
            cols = math.prod(shape[axis:]) if shape else 1  # normalizes axis..end
        rate = per_element if per_element is not None else _NORM_FLOPS_PER_ELEMENT.get(
            node.op_type, 8)
        if node.attrs.get("variant") == "weight_norm":  # one norm per slice along dim
            dim = int(node.attrs.get("dim", 0))
            rows = shape[dim] if shape and 0 <= dim < len(shape) else 1  # -1: the whole tensor
            cols, rate = (numel // rows if rows else 0), _WEIGHT_NORM_FLOPS_PER_ELEMENT
        rows = numel // cols if cols else 0
        return {"numel": numel, "rows": rows, "cols": cols}, rate * numel, read
    return handler


def _elementwise(node, ins, out, numel, read):
    return {"numel": numel}, _ELEMENTWISE_FLOPS.get(node.op_type, 1) * numel, read


def _reduction(node, ins, out, numel, read):
    src = ins[0].numel if ins and ins[0] is not None else 0
    flops = src
    kernel = node.attrs.get("kernel_shape")
    if kernel and node.op_type in ("MaxPool", "AveragePool", "LpPool"):
        flops = numel * math.prod(kernel)
    return {"numel": numel, "input_numel": src}, flops, read


def _data_movement(node, ins, out, numel, read):
    if node.op_type in _SCATTERS:
        return _scatter(node, ins, out, numel, read)
    if node.op_type in ("Gather", "GatherElements", "GatherND", "Slice", "Embedding",
                        "IndexSelect") and out is not None and node.attrs.get(
                            "variant") != "im2col":  # im2col reads each input once (reuse)
        # reads only the gathered rows (plus the indices), not the whole table
        idx = sum(t.nbytes for t in ins[1:] if t is not None and t.dtype in ("int64", "int32"))
        read = out.nbytes + idx
    return {"numel": numel}, 0, read


_SCATTERS = frozenset({"ScatterElements", "ScatterND"})
_NO_REDUCTION = (None, "none")


def _scatter(node, ins, out, numel, read):
    """Convention 5: the updated elements, and the whole input unless in place."""
    updates = node.attrs.get("updates")
    if not isinstance(updates, int):
        src = ins[-1] if len(ins) > 2 else out  # ONNX: (data, indices, updates)
        updates = src.numel if src is not None else numel
    flops = 0 if node.attrs.get("reduction") in _NO_REDUCTION else updates
    if node.attrs.get("reduction") == "mean":
        flops *= 2
    if node.attrs.get("inplace"):  # indices and updates, and the old values it reduces into
        kept = read - (ins[0].nbytes if ins and ins[0] is not None else 0)
        read = kept + (_updated_bytes(updates, out) if flops else 0)
    return {"numel": numel, "updates": updates}, flops, read


def _updated_bytes(updates: int, out: TensorInfo | None) -> int:
    return math.ceil(updates * dtype_bytes(out.dtype if out is not None else None))


def _einsum(node, ins, out, numel, read):
    work = einsum_work(str(node.attrs.get("equation", "")), einsum_shapes(ins))
    if work is None:
        return {"numel": numel}, 0, read
    return dict(work.dims), work.flops, read


def _recurrent(node, ins, out, numel, read):
    d = rnn_dims(node, ins)
    return d, rnn_flops(node, ins, d), read


_OP_HANDLERS: dict[str, _Handler] = {"Einsum": _einsum, "LSTM": _recurrent, "GRU": _recurrent,
                                     "RNN": _recurrent}
_HANDLERS: dict[KernelClass, _Handler] = {
    KernelClass.GEMM: _gemm,
    KernelClass.GEMV: _gemm,
    KernelClass.QUANT_GEMM: _gemm,
    KernelClass.QUANT_DOT: _gemm,
    KernelClass.CONV: _conv,
    KernelClass.ATTENTION: _attention,
    KernelClass.SOFTMAX: _rowwise(_SOFTMAX_FLOPS_PER_ELEMENT),
    KernelClass.NORM: _rowwise(None),
    KernelClass.RMSNORM: _rowwise(None),
    KernelClass.ELEMENTWISE: _elementwise,
    KernelClass.SILU: _elementwise,
    KernelClass.ROPE: _elementwise,
    KernelClass.REDUCTION: _reduction,
    KernelClass.DATA_MOVEMENT: _data_movement,
}
