"""Kernel classes, dims and work on hand-built IR graphs (frontend-independent)."""

from __future__ import annotations

from graphopt.analysis import KernelClass, annotate
from tests.irbuild import G


def test_linear_gemm_dims_flops_bytes():
    g = G()
    x = g.input("x", (4, 16, 64))
    w, b = g.param("w", (128, 64)), g.param("b", (128,))
    y = g.op("Linear", [x, w, b], (4, 16, 128), name="fc")
    a = annotate(g.build([y]))["fc"]
    assert a.kernel_class is KernelClass.GEMM
    assert dict(a.dims) == {"M": 64, "N": 128, "K": 64, "batch": 1}
    assert a.flops == 2 * 64 * 128 * 64 + 64 * 128
    assert a.bytes_read == 4 * (4 * 16 * 64 + 128 * 64 + 128)
    assert a.bytes_written == 4 * 4 * 16 * 128
    assert a.param_count == 128 * 64 + 128
    assert a.arithmetic_intensity == a.flops / (a.bytes_read + a.bytes_written)


def test_matmul_with_weight_folds_batch_and_gemv():
    g = G()
    x = g.input("x", (2, 8, 32))
    w = g.param("w", (32, 48))
    y = g.op("MatMul", [x, w], (2, 8, 48), name="mm")
    v = g.input("v", (1, 32))
    z = g.op("MatMul", [v, w], (1, 48), name="mv")
    an = annotate(g.build([y, z]))
    assert dict(an["mm"].dims) == {"M": 16, "N": 48, "K": 32, "batch": 1}
    assert an["mv"].kernel_class is KernelClass.GEMV


def test_batched_matmul_and_gemm_transb():
    g = G()
    a = g.input("a", (3, 5, 7, 9))
    b = g.input("b", (3, 5, 9, 11))
    y = g.op("MatMul", [a, b], (3, 5, 7, 11), name="bmm")
    c = g.input("c", (6, 10))
    w = g.param("w", (12, 10))
    z = g.op("Gemm", [c, w], (6, 12), name="gemm", transB=1)
    an = annotate(g.build([y, z]))
    assert dict(an["bmm"].dims) == {"M": 7, "N": 11, "K": 9, "batch": 15}
    assert an["bmm"].flops == 2 * 7 * 11 * 9 * 15
    assert dict(an["gemm"].dims) == {"M": 6, "N": 12, "K": 10, "batch": 1}


def test_grouped_conv_implicit_gemm_dims():
    g = G()
    x = g.input("x", (2, 32, 16, 16))
    w = g.param("w", (64, 8, 3, 3))  # groups=4: Cin/groups = 8
    y = g.op("Conv", [x, w], (2, 64, 8, 8), name="conv", group=4, strides=[2, 2])
    a = annotate(g.build([y]))["conv"]
    assert a.kernel_class is KernelClass.CONV
    assert a.dims["M"] == 2 * 8 * 8 and a.dims["N"] == 64 and a.dims["K"] == 8 * 9
    assert a.dims["groups"] == 4
    assert a.flops == 2 * (2 * 64) * 64 * 72


def test_decomposed_attention_head_dim_72():
    g = G()
    q = g.input("q", (2, 4, 10, 72))
    kt = g.input("kt", (2, 4, 72, 12))
    v = g.input("v", (2, 4, 12, 72))
    s = g.op("MatMul", [q, kt], (2, 4, 10, 12), name="qk")
    scale = g.param("scale", (), kind="constant")
    s2 = g.op("Div", [s, scale], (2, 4, 10, 12), name="scale")
    mask = g.input("mask", (1, 1, 10, 12))
    s3 = g.op("Add", [s2, mask], (2, 4, 10, 12), name="mask")
    p = g.op("Softmax", [s3], (2, 4, 10, 12), name="softmax", axis=-1)
    o = g.op("MatMul", [p, v], (2, 4, 10, 72), name="pv")
    an = annotate(g.build([o]))
    want = {"batch": 2, "heads": 4, "seq_q": 10, "seq_kv": 12, "head_dim": 72}
    for n in ("qk", "scale", "mask", "softmax", "pv"):
        assert an[n].kernel_class is KernelClass.ATTENTION, n
        assert dict(an[n].dims) == want
        assert an[n].pattern == "attention:0"


def test_softmax_alone_is_softmax_not_attention():
    g = G()
    x = g.input("x", (4, 100))
    w = g.param("w", (100, 10))
    y = g.op("MatMul", [x, w], (4, 10), name="logits")
    p = g.op("Softmax", [y], (4, 10), name="sm", axis=-1)
    an = annotate(g.build([p]))
    assert an["sm"].kernel_class is KernelClass.SOFTMAX
    assert an["logits"].kernel_class is KernelClass.GEMM
    assert dict(an["sm"].dims) == {"numel": 40, "rows": 4, "cols": 10}


def test_decomposed_rmsnorm_and_layernorm():
    g = G()
    x = g.input("x", (2, 8, 64))
    p = g.op("Pow", [x], (2, 8, 64), name="pow", scalar=2.0)
    m = g.op("ReduceMean", [p], (2, 8, 1), name="mean", axes=[-1], keepdims=1)
    e = g.op("Add", [m], (2, 8, 1), name="eps", scalar=1e-6)
    r = g.op("Rsqrt", [e], (2, 8, 1), name="rsqrt")
    n = g.op("Mul", [x, r], (2, 8, 64), name="norm")
    w = g.param("w", (64,))
    y = g.op("Mul", [w, n], (2, 8, 64), name="weight")
    # layer norm written out: x - mean, pow, mean, add eps, sqrt, div
    m0 = g.op("ReduceMean", [y], (2, 8, 1), name="ln_mean0", axes=[-1], keepdims=1)
    c = g.op("Sub", [y, m0], (2, 8, 64), name="ln_sub")
    c2 = g.op("Pow", [c], (2, 8, 64), name="ln_pow", scalar=2.0)
    var = g.op("ReduceMean", [c2], (2, 8, 1), name="ln_var", axes=[-1], keepdims=1)
    ve = g.op("Add", [var], (2, 8, 1), name="ln_eps", scalar=1e-5)
    sd = g.op("Sqrt", [ve], (2, 8, 1), name="ln_sqrt")
    out = g.op("Div", [c, sd], (2, 8, 64), name="ln_div")
    an = annotate(g.build([out]))
    for name in ("pow", "mean", "eps", "rsqrt", "norm", "weight"):
        assert an[name].kernel_class is KernelClass.RMSNORM, name
        assert an[name].pattern == "rmsnorm:0"
    assert dict(an["mean"].dims) == {"numel": 1024, "rows": 16, "cols": 64}
    for name in ("ln_mean0", "ln_sub", "ln_pow", "ln_var", "ln_eps", "ln_sqrt", "ln_div"):
        assert an[name].kernel_class is KernelClass.NORM, name


def test_pow_mean_without_rsqrt_is_not_rmsnorm():
    g = G()
    x = g.input("x", (2, 64))
    p = g.op("Pow", [x], (2, 64), name="pow", scalar=2.0)
    m = g.op("ReduceMean", [p], (2, 1), name="mean", axes=[-1], keepdims=1)
    an = annotate(g.build([m]))
    assert an["pow"].kernel_class is KernelClass.ELEMENTWISE
    assert an["mean"].kernel_class is KernelClass.REDUCTION


def test_rope_silu_swiglu():
    g = G()
    x = g.input("x", (1, 4, 8, 16))
    cos, sin = g.input("cos", (8, 16)), g.input("sin", (8, 16))
    s1 = g.op("Slice", [x], (1, 4, 8, 8), name="s1")
    s2 = g.op("Slice", [x], (1, 4, 8, 8), name="s2")
    ng = g.op("Neg", [s2], (1, 4, 8, 8), name="neg")
    cat = g.op("Concat", [ng, s1], (1, 4, 8, 16), name="cat", axis=-1)
    ms = g.op("Mul", [cat, sin], (1, 4, 8, 16), name="msin")
    mc = g.op("Mul", [x, cos], (1, 4, 8, 16), name="mcos")
    r = g.op("Add", [mc, ms], (1, 4, 8, 16), name="rope_add")
    a = g.input("a", (4, 32))
    b = g.input("b", (4, 32))
    sg = g.op("Sigmoid", [a], (4, 32), name="sig")
    si = g.op("Mul", [a, sg], (4, 32), name="silu_mul")
    gl = g.op("Mul", [si, b], (4, 32), name="glu")
    c = g.input("c", (4, 32))
    sg2 = g.op("Sigmoid", [c], (4, 32), name="sig2")
    si2 = g.op("Mul", [sg2, c], (4, 32), name="silu2")
    an = annotate(g.build([r, gl, si2]))
    for n in ("s1", "s2", "neg", "cat", "msin", "mcos", "rope_add"):
        assert an[n].kernel_class is KernelClass.ROPE, n
    assert an["rope_add"].dims["head_dim"] == 16
    for n in ("sig", "silu_mul", "glu"):
        assert an[n].kernel_class is KernelClass.SILU and an[n].pattern == "swiglu:0", n
    assert an["silu2"].pattern == "silu:0" and an["sig2"].kernel_class is KernelClass.SILU


def test_sigmoid_times_other_is_not_silu():
    g = G()
    a, b = g.input("a", (4, 8)), g.input("b", (4, 8))
    s = g.op("Sigmoid", [a], (4, 8), name="sig")
    m = g.op("Mul", [b, s], (4, 8), name="gate")
    an = annotate(g.build([m]))
    assert an["gate"].kernel_class is KernelClass.ELEMENTWISE
    assert an["sig"].kernel_class is KernelClass.ELEMENTWISE


def test_quantized_and_qdq_gemm():
    g = G()
    x = g.input("x", (1, 64))
    wq = g.param("wq", (64, 32), dtype="int8")
    wd = g.op("DequantizeLinear", [wq], (64, 32), name="dq")
    y = g.op("MatMul", [x, wd], (1, 32), name="qmm")
    xb = g.input("xb", (16, 64))
    z = g.op("MatMul", [xb, wd], (16, 32), name="qmm2")
    ww = g.param("w4", (32, 2, 32), dtype="uint8")
    u = g.op("MatMulNBits", [xb, ww], (16, 32), name="nbits", N=32, K=64, bits=4)
    an = annotate(g.build([y, z, u]))
    assert an["qmm2"].kernel_class is KernelClass.QUANT_GEMM
    assert an["nbits"].kernel_class is KernelClass.QUANT_GEMM
    assert an["nbits"].dtype == "int4"
    assert dict(an["nbits"].dims) == {"M": 16, "N": 32, "K": 64, "batch": 1}


def test_quant_dot_for_matrix_vector():
    g = G()
    x = g.input("x", (1, 64))
    wq = g.param("wq", (64, 32), dtype="int8")
    y = g.op("MatMulInteger", [x, wq], (1, 32), dtype="int32", name="mmi")
    assert annotate(g.build([y]))["mmi"].kernel_class is KernelClass.QUANT_DOT


def test_views_data_movement_reductions_other():
    g = G()
    x = g.input("x", (4, 8, 16))
    r = g.op("Reshape", [x], (32, 16), name="reshape")
    t = g.op("Transpose", [r], (16, 32), name="transpose", perm=[1, 0])
    tv = g.op("Transpose", [r], (16, 32), name="view_t", perm=[1, 0], alias=True)
    s = g.op("ReduceSum", [t], (16,), name="sum", axes=[1], keepdims=0)
    emb = g.param("emb", (1000, 16))
    ids = g.input("ids", (4, 8), dtype="int64")
    ga = g.op("Gather", [emb, ids], (4, 8, 16), name="gather")
    u = g.op("my.domain::Foo", [x], (4, 8, 16), name="custom")
    an = annotate(g.build([s, tv, ga, u]))
    assert an["reshape"].kernel_class is KernelClass.VIEW and an["reshape"].bytes_total == 0
    assert an["transpose"].kernel_class is KernelClass.DATA_MOVEMENT
    assert an["view_t"].kernel_class is KernelClass.VIEW
    assert an["sum"].kernel_class is KernelClass.REDUCTION
    # a gather reads the rows it gathers, not the whole embedding table
    assert an["gather"].bytes_read == 4 * 8 * 16 * 4 + 4 * 8 * 8
    assert an["custom"].kernel_class is KernelClass.OTHER
    assert "unsupported_op" in an["custom"].flags


def test_dynamic_and_zero_size_are_flagged_not_fatal():
    g = G()
    x = g.input("x", ("batch", 64))
    w = g.param("w", (32, 64))
    y = g.op("Linear", [x, w], ("batch", 32), name="fc")
    z = g.input("z", (0, 64))
    e = g.op("Relu", [z], (0, 64), name="empty")
    u = g.op("Relu", [x], None, name="unknown")
    an = annotate(g.build([y, e, u]))
    assert "dynamic_shape" in an["fc"].flags and an["fc"].dims["M"] == 1
    assert "zero_size" in an["empty"].flags and an["empty"].flops == 0
    assert "unknown_shape" in an["unknown"].flags
