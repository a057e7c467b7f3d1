"""Small ONNX models with the sub-graphs ONNX Runtime's optimizer fuses (test_ort_fusion.py),
and what ORT really fused in each: run on the CPU EP, its optimized graph saved and read back.

``ort_fused`` maps each node of ORT's optimized graph back to the original nodes it replaced: the
original nodes whose outputs ORT no longer has, reached backwards from the node's outputs. Nodes
ORT's ConstantFolding computed (only constants in, or a Shape) are not fusions and are left out,
and so are free reshapes (ORT merges a Reshape with the one MatMulAddFusion puts in front of a
Gemm: no kernel goes away).
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from tests.onnx_rewrite_models import init, model

N = helper.make_node
_VIEWS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten"})


def c(name: str, value: float | np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=np.float32), name)


def ort_fused(m: onnx.ModelProto, level: str = "ORT_ENABLE_ALL",
              disabled: tuple[str, ...] = ("NchwcTransformer",)
              ) -> tuple[set[frozenset[str]], list[str]]:
    """(the sets of original nodes ORT fused into one node, the optimized graph's op types).

    x86's NchwcTransformer is off by default: it rewrites convs into a blocked layout whose
    tensors no longer map back by name (graphopt does not model it; see ort_fusion)."""
    with tempfile.TemporaryDirectory() as d:
        so = ort.SessionOptions()
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
        so.optimized_model_filepath = os.path.join(d, "optimized.onnx")
        so.log_severity_level = 3
        ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"],
                             disabled_optimizers=list(disabled))
        opt = onnx.load(so.optimized_model_filepath)
    g = m.graph
    const = {t.name for t in g.initializer}
    for n in g.node:
        if n.op_type in ("Constant", "Shape") or (n.input and all(not t or t in const
                                                                  for t in n.input)):
            const.update(n.output)
    alive = {t for n in opt.graph.node for t in (*n.input, *n.output)} | \
        {i.name for i in opt.graph.input}
    producer = {o: n for n in g.node for o in n.output}
    fused = set()
    for n in opt.graph.node:
        members: set[str] = set()
        stack = [producer[o] for o in n.output if o in producer and o not in const]
        while stack:
            p = stack.pop()
            if p.name in members:
                continue
            members.add(p.name)
            stack += [producer[t] for t in p.input
                      if t and t not in alive and t in producer and t not in const]
        ops = {x.name: x.op_type for x in g.node}
        kernels = frozenset(x for x in members if ops[x] not in _VIEWS)
        if len(kernels) > 1:
            fused.add(kernels)
    return fused, [n.op_type for n in opt.graph.node]


def mm_add_relu() -> onnx.ModelProto:
    """MatMulAddFusion (all EPs), then GemmActivationFusion (CPU EP only)."""
    return model([N("MatMul", ["x", "w"], ["mm"], name="mm"),
                  N("Add", ["mm", "b"], ["a"], name="add"), N("Relu", ["a"], ["y"], name="relu")],
                 {"x": [8, 16]}, {"y": [8, 32]}, [init("w", 16, 32), init("b", 32)])


def conv_relu() -> onnx.ModelProto:
    """ConvActivationFusion: CPU, not CUDA."""
    return model([N("Conv", ["x", "w", "b"], ["cv"], name="conv", pads=[1, 1, 1, 1]),
                  N("Relu", ["cv"], ["y"], name="relu")],
                 {"x": [1, 4, 8, 8]}, {"y": [1, 8, 8, 8]}, [init("w", 8, 4, 3, 3), init("b", 8)])


def conv_add_relu(conv_read_twice: bool = False) -> onnx.ModelProto:
    """ConvAddActivationFusion (Level 3, CPU EP): a residual Add and its Relu into the Conv;
    not when something else reads the Conv's output."""
    nodes = [N("Conv", ["x", "w", "b"], ["cv"], name="conv", pads=[1, 1, 1, 1]),
             N("Add", ["cv", "r"], ["a"], name="add"), N("Relu", ["a"], ["y"], name="relu")]
    outs = {"y": [1, 8, 8, 8]}
    if conv_read_twice:
        nodes.append(N("Sigmoid", ["cv"], ["z"], name="sig"))
        outs["z"] = [1, 8, 8, 8]
    return model(nodes, {"x": [1, 4, 8, 8], "r": [1, 8, 8, 8]}, outs,
                 [init("w", 8, 4, 3, 3), init("b", 8)])


def conv_bn_mul() -> onnx.ModelProto:
    """ConvBNFusion then ConvMulFusion (Level 1): both fold into the Conv's weights."""
    return model([N("Conv", ["x", "w", "b"], ["cv"], name="conv", pads=[1, 1, 1, 1]),
                  N("BatchNormalization", ["cv", "s", "bb", "mu", "var"], ["bn"], name="bn"),
                  N("Mul", ["bn", "cm"], ["y"], name="cmul")],
                 {"x": [1, 4, 8, 8]}, {"y": [1, 8, 8, 8]},
                 [init("w", 8, 4, 3, 3), init("b", 8), init("s", 8), init("bb", 8),
                  init("mu", 8), c("var", np.ones(8)), init("cm", 8, 1, 1)])


def conv_add_const() -> onnx.ModelProto:
    """ConvAddFusion (Level 1): a per-channel constant [1,C,1,1] added to the Conv's output,
    here a graph output, folds into its bias."""
    return model([N("Conv", ["x", "w", "b"], ["cv"], name="conv", pads=[1, 1, 1, 1]),
                  N("Add", ["cv", "ca"], ["y"], name="cadd")],
                 {"x": [1, 4, 8, 8]}, {"y": [1, 8, 8, 8]},
                 [init("w", 8, 4, 3, 3), init("b", 8), init("ca", 1, 8, 1, 1)])


def erf_gelu(rows: tuple[int | str, ...] = (8,)) -> onnx.ModelProto:
    """GeluFusion after a MatMul+Add: on a static input MatMulAddFusion takes the Add first (a
    Gemm), so BiasGeluFusion finds no Add left; with a dynamic batch the Add stays for
    BiasGeluFusion."""
    nodes = [N("MatMul", ["x", "w"], ["mm"], name="mm"),
             N("Add", ["mm", "b"], ["ab"], name="bias"),
             N("Div", ["ab", "sq2"], ["d"], name="div"), N("Erf", ["d"], ["e"], name="erf"),
             N("Add", ["e", "one"], ["e1"], name="add1"),
             N("Mul", ["ab", "e1"], ["m"], name="mul"), N("Mul", ["m", "half"], ["y"], name="half")]
    return model(nodes, {"x": [*rows, 16]}, {"y": [*rows, 32]},  # type: ignore[list-item]
                 [init("w", 16, 32), init("b", 32), c("sq2", 2 ** 0.5), c("one", 1.0),
                  c("half", 0.5)])


def layer_norm(residual_read_twice: bool = False) -> onnx.ModelProto:
    """LayerNormFusion, then SkipLayerNormFusion takes the residual Add in front of it; not when
    the residual sum is read again."""
    nodes = [N("Add", ["x", "r"], ["s"], name="res"),
             N("ReduceMean", ["s"], ["mu"], name="rm1", axes=[-1]),
             N("Sub", ["s", "mu"], ["dx"], name="sub"), N("Pow", ["dx", "two"], ["p"], name="pow"),
             N("ReduceMean", ["p"], ["var"], name="rm2", axes=[-1]),
             N("Add", ["var", "eps"], ["ve"], name="addeps"),
             N("Sqrt", ["ve"], ["sd"], name="sqrt"), N("Div", ["dx", "sd"], ["nx"], name="div"),
             N("Mul", ["nx", "g"], ["gx"], name="gamma"),
             N("Add", ["gx", "be"], ["y"], name="beta")]
    outs = {"y": [2, 4, 16]}
    if residual_read_twice:
        outs["s"] = [2, 4, 16]
    return model(nodes, {"x": [2, 4, 16], "r": [2, 4, 16]}, outs,
                 [c("two", 2.0), c("eps", 1e-5), init("g", 16), init("be", 16)])


def rms_norm(reciprocal: bool = False) -> onnx.ModelProto:
    """SimplifiedLayerNormFusion (RMSNorm); ORT leaves the Sqrt -> Reciprocal spelling."""
    nodes = [N("Pow", ["x", "two"], ["p"], name="pow"),
             N("ReduceMean", ["p"], ["var"], name="rm", axes=[-1]),
             N("Add", ["var", "eps"], ["ve"], name="addeps"),
             N("Sqrt", ["ve"], ["sd"], name="sqrt")]
    if reciprocal:
        nodes += [N("Reciprocal", ["sd"], ["inv"], name="recip"),
                  N("Mul", ["x", "inv"], ["nx"], name="norm")]
    else:
        nodes += [N("Div", ["x", "sd"], ["nx"], name="norm")]
    nodes += [N("Mul", ["nx", "g"], ["y"], name="gamma")]
    return model(nodes, {"x": [2, 4, 16]}, {"y": [2, 4, 16]},
                 [c("two", 2.0), c("eps", 1e-6), init("g", 16)])


def silu(alpha: bool = False) -> onnx.ModelProto:
    """QuickGeluFusion: x * sigmoid(x) (SiLU) or x * sigmoid(1.702 x)."""
    nodes, s = [], "x"
    if alpha:
        nodes, s = [N("Mul", ["x", "al"], ["ax"], name="alpha")], "ax"
    nodes += [N("Sigmoid", [s], ["sg"], name="sig"), N("Mul", ["x", "sg"], ["y"], name="mul")]
    return model(nodes, {"x": [2, 16]}, {"y": [2, 16]}, [c("al", 1.702)] if alpha else [])


def scaled_scores(scaled_q: bool = False, q_read_twice: bool = False) -> onnx.ModelProto:
    """MatMulScaleFusion: attention scores divided by sqrt(d), and q times a scalar in front;
    a scaled q read elsewhere too still runs (ORT keeps that Mul)."""
    nodes = [N("MatMul", ["qs" if scaled_q else "q", "k"], ["s"], name="qk"),
             N("Div", ["s", "sc"], ["y"], name="scale")]
    outs = {"y": [2, 4, 8, 8]}
    if scaled_q:
        nodes.insert(0, N("Mul", ["q", "qc"], ["qs"], name="qscale"))
    if q_read_twice:
        nodes.append(N("Neg", ["qs"], ["z"], name="neg"))
        outs["z"] = [2, 4, 8, 16]
    return model(nodes, {"q": [2, 4, 8, 16], "k": [2, 4, 16, 8]}, outs,
                 [c("sc", 4.0), c("qc", 0.5)])


def tanh_gelu(pow_form: bool = True, last_is_output: bool = False) -> onnx.ModelProto:
    """FastGeluFusion, both of ORT's spellings; not when the last Mul is a graph output."""
    if pow_form:
        head = [N("Pow", ["x", "three"], ["x3"], name="cube"),
                N("Mul", ["x3", "k"], ["kx3"], name="k"),
                N("Add", ["x", "kx3"], ["inner"], name="inner"),
                N("Mul", ["inner", "s2p"], ["t0"], name="s2p")]
    else:
        head = [N("Mul", ["x", "k"], ["a"], name="k"), N("Mul", ["a", "x"], ["b"], name="kx2"),
                N("Add", ["b", "one"], ["c1"], name="add0"),
                N("Mul", ["x", "s2p"], ["sx"], name="s2px"),
                N("Mul", ["c1", "sx"], ["t0"], name="s2p")]
    out = "y" if last_is_output else "g"
    nodes = head + [N("Tanh", ["t0"], ["t"], name="tanh"),
                    N("Add", ["t", "one"], ["t1"], name="add1"),
                    N("Mul", ["x", "half"], ["xh"], name="half"),
                    N("Mul", ["xh", "t1"], [out], name="gelu")]
    if not last_is_output:
        nodes.append(N("Neg", ["g"], ["y"], name="neg"))
    return model(nodes, {"x": [2, 16]}, {"y": [2, 16]},
                 [c("three", 3.0), c("k", 0.044715), c("s2p", (2 / np.pi) ** 0.5),
                  c("one", 1.0), c("half", 0.5)])
