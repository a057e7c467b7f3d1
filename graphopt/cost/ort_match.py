"""The matcher for ONNX Runtime's fusions: each transformer's pattern, the code that finds the
units ORT fuses (:mod:`.ort_rules` says which run where; :mod:`.ort_fusion` runs them in order).

Each pattern cites the ``*_fusion.cc`` it was read from. Constant *values* (GeluFusion's
sqrt(2), 1 and 0.5; an epsilon) are not in the plan: a pattern checks the operand's shape.
"""

from __future__ import annotations

from collections.abc import Callable

from graphopt.cost.ort_rules import CONV_ACTS, CONV_ADD_ACTS, CPU_EP, GEMM_ACTS
from graphopt.cost.ort_view import OrtUnit, UnitView, nth_input
from graphopt.ir.graph import TensorInfo

__all__ = ["MATCHERS", "Match"]

#: a transformer's pattern: the units it fuses when it starts from ``u``, or None
Match = Callable[[UnitView, OrtUnit], list[OrtUnit] | None]


def _const(t: TensorInfo | None) -> bool:
    return t is not None and t.kind in ("param", "constant")


def _scalar(t: TensorInfo | None) -> bool:
    return _const(t) and t is not None and t.shape is not None and t.numel == 1


def _rank(t: TensorInfo | None) -> int | None:
    return None if t is None or t.shape is None else len(t.shape)


def _is(u: OrtUnit | None, *ops: str) -> bool:
    return u is not None and u.op in ops


_FLOAT = ("fp32", "fp16", "bf16")


# ---- the patterns: each returns the units ORT fuses when ``u`` is the node its transformer
# starts from, or None --------------------------------------------------------------------


def _conv_const_op(op: str) -> Match:
    """ConvAddFusion / ConvMulFusion (conv_add_fusion.cc @047055a5d759, an older version that
    took only a [C,1,1] operand; ORT 1.31 also takes [1,C,1,1] and an Add that is a graph
    output, as the tests check): a Conv with constant weights whose only reader adds
    (multiplies) a per-channel constant; ORT folds it into the Conv's weights and bias."""
    def match(v: UnitView, u: OrtUnit) -> list[OrtUnit] | None:
        nxt = v.sole(u) if _is(u, "Conv") and _const(nth_input(u, 1)) else None
        if not _is(nxt, op) or nxt is None:
            return None
        if len(u.inputs) > 2 and u.inputs[2] is not None and not _const(u.inputs[2]):
            return None
        c = v.other(nxt, u.outputs[0])
        out = u.outputs[0]
        return [u, nxt] if _const(c) and _per_channel(c, out) else None
    return match


def _per_channel(c: TensorInfo | None, out: TensorInfo | None) -> bool:
    """``c`` broadcasts over an NC... conv output along C only ([C,1,..] or [1,C,1,..])."""
    if c is None or out is None or c.shape is None or out.shape is None or len(out.shape) < 2:
        return False
    dims = list(c.shape)
    tail = len(out.shape) - 1  # C and the spatial dims
    if len(dims) not in (tail, tail + 1) or (len(dims) == tail + 1 and dims[0] != 1):
        return False
    dims = dims[-tail:]
    return dims[0] == out.shape[1] and all(d == 1 for d in dims[1:])


def _conv_bn(v: UnitView, u: OrtUnit) -> list[OrtUnit] | None:
    """ConvBNFusion (conv_bn_fusion.cc, not read: the pattern is checked against ORT 1.31 in the
    tests): a Conv with constant weights whose only reader is a BatchNormalization with
    constant scale, bias, mean and variance."""
    nxt = v.sole(u) if _is(u, "Conv") and _const(nth_input(u, 1)) else None
    if nxt is None or nxt.op != "BatchNormalization" or len(nxt.outputs) != 1:
        return None
    return [u, nxt] if all(_const(t) for t in nxt.inputs[1:5]) else None


def _matmul_add(v: UnitView, u: OrtUnit) -> list[OrtUnit] | None:
    """MatMulAddFusion (matmul_add_fusion.cc @01512f8862b9): a float MatMul with a rank-2 B
    whose only reader is an Add of a bias Gemm can broadcast ((N), or (1, N), (M, 1), (M, N)
    when A is 2-D); an N-D A needs a static shape (ORT reshapes it to 2-D around the Gemm)."""
    nxt = v.sole(u) if _is(u, "MatMul") else None
    a, b = nth_input(u, 0), nth_input(u, 1)
    if nxt is None or nxt.op != "Add" or a is None or b is None or _rank(b) != 2:
        return None
    if a.dtype not in _FLOAT or a.dtype != (nxt.inputs[0].dtype if nxt.inputs[0] else None):
        return None
    bias = v.other(nxt, u.outputs[0])
    if bias is None or bias.shape is None or a.shape is None:
        return None
    n, two_d = b.shape[1], len(a.shape) == 2
    if not two_d and not (a.is_static and isinstance(b.shape[0], int) and isinstance(n, int)):
        return None
    s = bias.shape
    ok = (len(s) == 1 and s[0] == n) or (two_d and len(s) == 2 and (
        (s[0] == 1 and s[1] == n) or (s[0] == a.shape[0] and s[1] in (1, n))))
    return [u, nxt] if ok else None


def _gelu(v: UnitView, u: OrtUnit) -> list[OrtUnit] | None:
    """GeluFusion (gelu_fusion.cc @0138cca6fe02): x/sqrt(2) -> Erf -> +1 -> times x and 0.5
    (either order of the two Muls); each link read once."""
    erf = v.sole(u) if _is(u, "Div") and _scalar(nth_input(u, 1)) else None
    if not _is(erf, "Erf") or erf is None:
        return None
    add = v.sole(erf)
    if not _is(add, "Add") or add is None or not _scalar(v.other(add, erf.outputs[0])):
        return None
    x = u.inputs[0]
    mul = [r for r in v.edges(add)]
    if len(mul) != 1 or mul[0].op != "Mul":
        return None
    m1 = mul[0]
    side = v.other(m1, add.outputs[0])
    if side is not None and x is not None and side.name == x.name:  # (x * (erf + 1)) * 0.5
        m2 = v.sole(m1)
        if _is(m2, "Mul") and m2 is not None and _scalar(v.other(m2, m1.outputs[0])):
            return [u, erf, add, m1, m2]
        return None
    half = v.producer.get(side.name) if side is not None else None  # (x * 0.5) * (erf + 1)
    if (_is(half, "Mul") and half is not None and v.sole(half) is m1 and x is not None and
            any(t is not None and t.name == x.name for t in half.inputs) and
            _scalar(v.other(half, x))):
        return [u, erf, add, half, m1]
    return None


def _layer_norm(v: UnitView, u: OrtUnit) -> list[OrtUnit] | None:
    """LayerNormFusion (layer_norm_fusion.cc @00ca16892218): ReduceMean -> Sub -> Pow ->
    ReduceMean -> Add -> Sqrt -> Div -> Mul(1-D scale) -> Add(1-D bias), the Sub read by the
    Pow and the Div; scale and bias constants or graph inputs."""
    if not _is(u, "ReduceMean"):
        return None
    subs = v.edges(u)
    if len(subs) != 1 or subs[0].op != "Sub" or v.is_output(u):
        return None
    sub = subs[0]
    kids = v.edges(sub)
    if len(kids) != 2 or v.is_output(sub):
        return None
    div = next((k for k in kids if k.op == "Div"), None)
    pow_ = next((k for k in kids if k.op == "Pow"), None)
    if div is None or pow_ is None:
        return None
    chain = [pow_]
    for op in ("ReduceMean", "Add", "Sqrt"):
        nxt = v.sole(chain[-1])
        if not _is(nxt, op) or nxt is None:
            return None
        chain.append(nxt)
    if v.sole(chain[-1]) is not div:
        return None
    mul = v.sole(div)
    if not _is(mul, "Mul") or mul is None or not _affine(v, mul, div):
        return None
    add = v.sole(mul) if v.sole(mul) is not None else (v.edges(mul) or [None])[0]
    if not _is(add, "Add") or add is None or len(v.edges(mul)) != 1 or not _affine(v, add, mul):
        return None
    return [u, sub, *chain, div, mul, add]


def _affine(v: UnitView, u: OrtUnit, prev: OrtUnit) -> bool:
    p = v.other(u, prev.outputs[0])
    return p is not None and (_const(p) or p.kind == "input") and _rank(p) == 1


def _simplified_layer_norm(v: UnitView, u: OrtUnit) -> list[OrtUnit] | None:
    """SimplifiedLayerNormFusion (RMSNorm; the layer_norm_fusion.cc read, @00ca16892218,
    predates it: the pattern is checked against ORT 1.31 in the tests): Pow ->
    ReduceMean -> Add -> Sqrt -> Div(x, .) or Div(1, .) -> Mul(x, .), then Mul(1-D scale); x
    read by the Pow and the Div (Mul). A Reciprocal in place of Div(1, .) is not fused (ORT 1.31
    leaves it)."""
    if not _is(u, "Pow"):
        return None
    x, chain = u.inputs[0], [u]
    for op in ("ReduceMean", "Add", "Sqrt"):
        nxt = v.sole(chain[-1])
        if not _is(nxt, op) or nxt is None:
            return None
        chain.append(nxt)
    nxt = v.sole(chain[-1])
    if _is(nxt, "Div") and nxt is not None and _scalar(nth_input(nxt, 0)):  # 1 / sqrt, then x * it
        chain.append(nxt)
        nxt = v.sole(nxt)
        if not _is(nxt, "Mul"):
            return None
    elif not _is(nxt, "Div"):
        return None
    if nxt is None or x is None or not any(t is not None and t.name == x.name
                                          for t in nxt.inputs):
        return None
    chain.append(nxt)
    scale = v.sole(nxt) if v.sole(nxt) is not None else (v.edges(nxt) or [None])[0]
    if not _is(scale, "Mul") or scale is None or len(v.edges(nxt)) != 1 or \
            not _affine(v, scale, nxt):
        return None
    return [*chain, scale]


def _fast_gelu(v: UnitView, u: OrtUnit) -> list[OrtUnit] | None:
    """FastGeluFusion (fast_gelu_fusion.cc @01960e76929a): the tanh GELU in either of ORT's two
    spellings up to the Tanh (see ``_tanh_input``), then Tanh -> Add(1) -> Mul by 0.5 * x.
    Every member but the last Mul is read once; none is a graph output; fp32 only on the CPU."""
    head = _tanh_input(v, u)
    if head is None:
        return None
    members, x = head
    tanh = v.sole(members[-1])
    add2 = v.sole(tanh) if _is(tanh, "Tanh") else None
    if tanh is None or add2 is None or add2.op != "Add" or \
            not _scalar(v.other(add2, tanh.outputs[0])):
        return None
    mul5 = (v.edges(add2) or [None])[0]
    if not _is(mul5, "Mul") or mul5 is None or v.is_output(mul5):
        return None
    mul6 = v.producer.get(getattr(v.other(mul5, add2.outputs[0]), "name", ""))
    if not _is(mul6, "Mul") or mul6 is None or v.is_output(mul6) or \
            _named(v.other(mul6, x)) is None or not _scalar(v.other(mul6, x)):
        return None
    return [*members, tanh, add2, mul6, mul5]


def _named(t: TensorInfo | None) -> str | None:
    return None if t is None else t.name


def _tanh_input(v: UnitView, u: OrtUnit) -> tuple[list[OrtUnit], TensorInfo] | None:
    """The units before the Tanh, and x. Second formula: Pow(x, 3) -> Mul(0.044715) ->
    Add(x) -> Mul(sqrt(2/pi)). First formula: Mul(x, 0.044715) -> Mul(x) -> Add(1) ->
    Mul(with Mul(x, sqrt(2/pi))). Each is read once and is no graph output; on the CPU EP
    FastGelu is fp32 only."""
    dtypes = ("fp32",) if v.ep == CPU_EP else _FLOAT

    def once(w: OrtUnit | None, op: str) -> OrtUnit | None:
        return w if _is(w, op) and w is not None and len(v.edges(w)) == 1 and \
            not v.is_output(w) and all(t is None or t.dtype in dtypes for t in w.inputs) \
            else None

    if once(u, "Pow") and _scalar(nth_input(u, 1)) and u.inputs[0] is not None:
        x = u.inputs[0]
        mul1 = once(v.sole(u), "Mul")
        add1 = once(v.sole(mul1), "Add") if mul1 and _scalar(v.other(mul1, u.outputs[0])) \
            else None
        mul2 = once(v.sole(add1), "Mul") if add1 and \
            _named(v.other(add1, mul1.outputs[0] if mul1 else None)) == x.name else None
        if mul1 and add1 and mul2 and _scalar(v.other(mul2, add1.outputs[0])):
            return [u, mul1, add1, mul2], x
        return None
    if once(u, "Mul") and any(_scalar(t) for t in u.inputs):
        x = next((t for t in u.inputs if not _scalar(t)), None)
        mul2 = once(v.sole(u), "Mul")
        if x is None or mul2 is None or _named(v.other(mul2, u.outputs[0])) != x.name:
            return None
        add1 = once(v.sole(mul2), "Add")
        mul3 = once(v.sole(add1), "Mul") if add1 and \
            _scalar(v.other(add1, mul2.outputs[0])) else None
        mul4 = v.producer.get(_named(v.other(mul3, add1.outputs[0] if add1 else None)) or "")
        if add1 and mul3 and once(mul4, "Mul") and mul4 is not None and \
                _scalar(v.other(mul4, x)) and any(_named(t) == x.name for t in mul4.inputs):
            return [u, mul2, add1, mul4, mul3], x
    return None


def _activation(ops: tuple[str, ...], anchor: str) -> Match:
    def match(v: UnitView, u: OrtUnit) -> list[OrtUnit] | None:
        nxt = v.sole(u) if _is(u, anchor) else None
        if nxt is None or nxt.op not in ops:
            return None
        if nxt.op == "Clip" and not all(_const(t) for t in nxt.inputs[1:]):
            return None  # the activation's bounds must be constants
        return [u, nxt]
    return match


def _bias_gelu(v: UnitView, u: OrtUnit) -> list[OrtUnit] | None:
    """BiasGeluFusion (bias_gelu_fusion.cc @00ca16892218): an Add of a 1-D bias the size of
    the last dim, read only by a (fused) Gelu or FastGelu."""
    nxt = v.sole(u) if _is(u, "Add") else None
    if nxt is None or nxt.op not in ("Gelu", "FastGelu") or len(u.inputs) != 2:
        return None
    a, b = u.inputs
    ra, rb = _rank(a), _rank(b)
    if a is None or b is None or ra is None or rb is None or ra < 1 or rb < 1:
        return None
    if not (isinstance(a.shape[-1], int) and a.shape[-1] == b.shape[-1]) or 1 not in (ra, rb):
        return None
    return [u, nxt]


def _skip_layer_norm(v: UnitView, u: OrtUnit) -> list[OrtUnit] | None:
    """SkipLayerNormFusion (skip_layer_norm_fusion.cc @037b07fe08ab): the Add feeding a
    LayerNormalization, both its inputs 3-D of one shape (formats 1 and 2 also take a second
    Add of a 1-D constant bias in front)."""
    if u.op != "LayerNormalization":
        return None
    add1 = v.parent(u, 0)
    if not _is(add1, "Add") or add1 is None or not _same_3d(add1) or v.sole(add1) is not u:
        return None
    for i in (0, 1):
        add2 = v.parent(add1, i)
        if (_is(add2, "Add") and add2 is not None and v.sole(add2) is add1 and
                _rank(nth_input(add2, 0)) == 3 and _rank(nth_input(add2, 1)) == 1 and
                _const(nth_input(add2, 1))):
            return [add2, add1, u]
    return [add1, u]


def _same_3d(u: OrtUnit) -> bool:
    if len(u.inputs) != 2 or any(_rank(t) != 3 for t in u.inputs):
        return False
    a, b = (t.shape for t in u.inputs if t is not None)
    return all(x == y and (isinstance(x, int) or i == 0)
               for i, (x, y) in enumerate(zip(a, b, strict=True)))


def _quick_gelu(v: UnitView, u: OrtUnit) -> list[OrtUnit] | None:
    """QuickGeluFusion (quick_gelu_fusion.cc @194144dfd419): x * Sigmoid(alpha * x) or
    x * Sigmoid(x) (SiLU), the Sigmoid (and the scaling Mul) read once."""
    pre: list[OrtUnit] = []
    x: TensorInfo | None
    if _is(u, "Mul") and any(_scalar(t) for t in u.inputs):
        sig = v.sole(u)
        x = next((t for t in u.inputs if not _scalar(t)), None)
        pre = [u]
    elif _is(u, "Sigmoid"):
        sig, x = u, nth_input(u, 0)
    else:
        return None
    if not _is(sig, "Sigmoid") or sig is None or x is None:
        return None
    mul = v.sole(sig)
    side = v.other(mul, sig.outputs[0]) if _is(mul, "Mul") and mul is not None else None
    if mul is None or side is None or side.name != x.name:
        return None
    return [*pre, sig, mul]


def _matmul_scale(v: UnitView, u: OrtUnit) -> list[OrtUnit] | None:
    """MatMulScaleFusion (matmul_scale_fusion.cc @02e42faeff23): Mul or Div (divisor) by a
    scalar constant on a MatMul's inputs and on its output (its only reader) become the
    FusedMatMul's alpha. An input scale read elsewhere too still runs, so it stays out of the
    group; the CPU EP takes fp32/fp64 MatMuls only."""
    if not _is(u, "MatMul", "FusedMatMul"):
        return None
    if v.ep == CPU_EP and any(t is not None and t.dtype not in ("fp32", "fp64")
                              for t in u.inputs):
        return None
    pre = [p for p in (v.parent(u, 0), v.parent(u, 1))
           if p is not None and _scale_of(p) is not None and v.sole(p) is u and
           _rank(_scale_of(p)) not in (None, 0)]
    nxt = v.sole(u)
    post = [nxt] if nxt is not None and _scale_of(nxt) is not None else []
    members = [*pre[:1], *[p for p in pre[1:] if p is not pre[0]], u, *post]
    return members if len(members) > 1 else None


def _scale_of(u: OrtUnit) -> TensorInfo | None:
    """The tensor a Mul or Div by a scalar constant scales, or None if ``u`` is no such scale."""
    if len(u.inputs) != 2:
        return None
    if u.op == "Div" and _scalar(u.inputs[1]):
        return u.inputs[0]
    if u.op == "Mul":
        return next((u.inputs[1 - i] for i in (0, 1) if _scalar(u.inputs[i])), None)
    return None


def _conv_add_act(v: UnitView, u: OrtUnit) -> list[OrtUnit] | None:
    """ConvAddActivationFusion (conv_add_act_fusion.cc @07d59c09d4b9, CPU EP, Level 3): a Conv
    with a bias, read only by an Add whose inputs are both 4-D of one shape (a residual), and
    the activation reading the Add if the Add has no other reader."""
    if not _is(u, "Conv") or len(u.inputs) < 3 or u.inputs[2] is None:
        return None
    add = (v.edges(u) or [None])[0] if len(v.edges(u)) == 1 else None
    if not _is(add, "Add") or add is None or len(add.inputs) != 2:
        return None
    a, b = add.inputs
    if _rank(a) != 4 or _rank(b) != 4 or a is None or b is None or a.shape != b.shape:
        return None
    act = v.sole(add)
    return [u, add, act] if _is(act, *CONV_ADD_ACTS) and act is not None else [u, add]


#: each transformer of :data:`.ort_rules.FUSIONS`, by name, with its pattern
MATCHERS: dict[str, Match] = {
    "ConvAddFusion": _conv_const_op("Add"), "ConvMulFusion": _conv_const_op("Mul"),
    "ConvBNFusion": _conv_bn, "MatMulAddFusion": _matmul_add, "GeluFusion": _gelu,
    "LayerNormFusion": _layer_norm, "GemmActivationFusion": _activation(GEMM_ACTS, "Gemm"),
    "ConvActivationFusion": _activation(CONV_ACTS, "Conv"),
    "SimplifiedLayerNormFusion": _simplified_layer_norm, "BiasGeluFusion": _bias_gelu,
    "SkipLayerNormFusion": _skip_layer_norm, "FastGeluFusion": _fast_gelu,
    "QuickGeluFusion": _quick_gelu, "MatMulScaleFusion": _matmul_scale,
    "ConvAddActivationFusion": _conv_add_act,
}
