"""ONNX padding pass: where it fires, where it must not, the numbers.

Padding is exact (zeros in, zeros out), so padded models are compared with the original in fp32
at 1e-5 of the output range; ``compute_dtype`` only picks the multiple (fp16 -> 8).
Every rewritten model passes ``onnx.checker.check_model(full_check=True)``. The quantization
passes are in test_onnx_quantize.py; the shared helpers are in tests/onnx_rewrite_models.py.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from graphopt.backends.onnx.padding import pad_channels
from tests.onnx_rewrite_models import (
    checked,
    context,
    init,
    inits_of,
    model,
    ops,
    producer,
    rel_err,
    run,
    tc_guide,
)

PAD_RTOL = 1e-5  # fp32, exact rewrite: only the GEMM's summation order may differ
_RNG = np.random.default_rng(0)


def test_padding_tc_guide_always_pads_to_multiples_of_8() -> None:
    m = tc_guide()
    before = m.SerializeToString()
    src, ctx = context(m, dtype="fp16", pad="always")
    out = checked(pad_channels(src, ctx))
    assert m.SerializeToString() == before  # functional: the input model is untouched
    dims = inits_of(out)
    w = {n.name: dims[n.input[1]] for n in out.graph.node if n.op_type in ("Conv", "Gemm",
                                                                           "MatMul")}
    assert w == {"conv1": (72, 8, 3, 3), "conv2": (136, 72, 3, 3), "fc": (256, 136),
                 "mm": (136, 256)}
    assert {"c1w", "c2w", "fw", "mw", "mb"}.isdisjoint(dims)  # replaced, not kept twice
    assert producer(out, "y").op_type == "Slice" and producer(out, "y2").op_type == "Slice"
    assert ops(out)[0] == "Pad"  # the 3-channel input is padded per call
    assert ctx.notes["padding"]["padded_nodes"] == ["conv1", "conv2", "fc", "mm"]
    d = ctx.decisions["conv2"]["padding"]
    assert d.applied and d.detail.new == {"C_in": 72, "C_out": 136} and d.detail.multiple == 8
    assert ctx.decisions["add"]["padding_carry"].applied  # the bias Add is padded ahead of time
    x = {"x": _RNG.standard_normal((2, 3, 16, 16)).astype(np.float32)}
    assert rel_err(run(m, x), run(out, x)) < PAD_RTOL


def test_padding_auto_follows_the_cost_model_and_never_fires_where_useless() -> None:
    # 64x64 images: conv2 is compute-bound (on 16x16 split tiles leave it launch-bound)
    src, ctx = context(tc_guide(64), dtype="fp16", pad="auto")
    out = checked(pad_channels(src, ctx))
    d = ctx.decisions["conv2"]["padding"]
    assert d.applied and d.detail.predicted_gain >= 1.1  # Inductor's pad_mm margin
    assert any(not ctx.decisions[n]["padding"].applied for n in ("conv1", "fc", "mm"))
    x = {"x": _RNG.standard_normal((1, 3, 64, 64)).astype(np.float32)}
    assert rel_err(run(tc_guide(64), x), run(out, x)) < PAD_RTOL
    for target, opts, why in (("a100", {"pad": "never"}, "pad='never'"),
                              ("epyc-7763", {"pad": "auto"}, "no tensor-core alignment")):
        src, ctx = context(tc_guide(), target, dtype="fp16", **opts)
        assert pad_channels(src, ctx) is None
        assert why in ctx.decisions["conv2"]["padding"].reason
        assert not ctx.decisions["conv2"]["padding"].applied


def test_padding_is_sliced_before_a_channel_reduction_after_sigmoid() -> None:
    """Sigmoid(0) = 0.5: the padding turns dirty; ReduceMean over channels must not see it,
    while ReduceMean over H, W is channel-local and carries it."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Sigmoid", ["c"], ["s"], name="sig"),
             helper.make_node("ReduceMean", ["s"], ["chan"], name="mean_c", axes=[1]),
             helper.make_node("ReduceMean", ["s"], ["hw"], name="mean_hw", axes=[2, 3]),
             helper.make_node("Flatten", ["hw"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "fw"], ["y"], name="fc", transB=1)]
    m = model(nodes, {"x": [2, 16, 6, 6]}, {"chan": [2, 1, 6, 6], "y": [2, 10]},
              [init("w", 67, 16, 1, 1), init("fw", 10, 67)])
    src, ctx = context(m, dtype="fp16", pad="always")
    out = checked(pad_channels(src, ctx))
    assert not ctx.decisions["sig"]["padding_carry"].detail.clean
    assert "reduces over the padded channel axis" in ctx.decisions["mean_c"][
        "padding_slice"].reason
    assert producer(out, "s").op_type == "Slice"  # the real sigmoid output, for mean_c
    mean_c = next(n for n in out.graph.node if n.name == "mean_c")
    assert mean_c.input[0] == "s"
    assert ctx.decisions["mean_hw"]["padding_carry"].applied
    x = {"x": _RNG.standard_normal((2, 16, 6, 6)).astype(np.float32)}
    assert rel_err(run(m, x), run(out, x)) < PAD_RTOL


def test_padding_carries_bn_concat_depthwise_and_rewrites_reshape() -> None:
    """BN params padded (scale 0, var 1); Concat places maps at offsets (13 -> 16 each, real
    channels at 0..12 and 16..28); the depthwise conv runs on 32 channels; the next conv
    absorbs the scattered map; a graph output of the scattered map is a Gather; a Reshape
    naming the channel count explicitly is rewritten, one that splits it is cut."""
    nodes = [helper.make_node("Conv", ["x", "wa"], ["a"], name="conv_a"),
             helper.make_node("BatchNormalization", ["a", "g", "b", "mu", "var"], ["bn"],
                              name="bn"),
             helper.make_node("Relu", ["bn"], ["ra"], name="relu"),
             helper.make_node("Conv", ["x", "wb"], ["bb"], name="conv_b"),
             helper.make_node("Concat", ["ra", "bb"], ["cat"], name="cat", axis=1),
             helper.make_node("Conv", ["cat", "wd"], ["dw"], name="dw", group=26,
                              pads=[1] * 4),
             helper.make_node("Conv", ["dw", "wc"], ["c"], name="conv_c"),
             helper.make_node("Transpose", ["c"], ["t"], name="nhwc", perm=[0, 2, 3, 1]),
             helper.make_node("Reshape", ["t", "shape"], ["rows"], name="rows"),
             helper.make_node("MatMul", ["rows", "mw"], ["y"], name="mm"),
             helper.make_node("Reshape", ["t", "split"], ["parts"], name="split")]
    shape = numpy_helper.from_array(np.array([-1, 20], dtype=np.int64), "shape")
    split = numpy_helper.from_array(np.array([2, 4, 4, 4, 5], dtype=np.int64), "split")
    bn = [numpy_helper.from_array(v.astype(np.float32), n) for n, v in (
        ("g", _RNG.uniform(0.5, 1.5, 13)), ("b", _RNG.uniform(-0.2, 0.2, 13)),
        ("mu", _RNG.uniform(-0.5, 0.5, 13)), ("var", _RNG.uniform(0.5, 2.0, 13)))]
    m = model(nodes, {"x": [2, 8, 4, 4]}, {"cat": [2, 26, 4, 4], "y": [32, 12],
                                           "parts": [2, 4, 4, 4, 5]},
              [init("wa", 13, 8, 1, 1), init("wb", 13, 8, 1, 1), init("wd", 26, 1, 3, 3),
               init("wc", 20, 26, 1, 1), init("mw", 20, 12), shape, split, *bn])
    src, ctx = context(m, dtype="fp16", pad="always")
    out = checked(pad_channels(src, ctx))
    dims = inits_of(out)
    node = {n.name: n for n in out.graph.node}
    assert dims[node["dw"].input[1]] == (32, 1, 3, 3)
    assert next(a.i for a in node["dw"].attribute if a.name == "group") == 32
    assert dims[node["conv_c"].input[1]] == (24, 32, 1, 1)
    assert dims[node["bn"].input[4]] == (16,)
    assert producer(out, "cat").op_type == "Gather"
    assert "splits the padded channel axis" in ctx.decisions["split"]["padding_slice"].reason
    assert numpy_helper.to_array(next(t for t in out.graph.initializer
                                      if t.name == node["rows"].input[1])).tolist() == [-1, 24]
    assert dims[node["mm"].input[1]] == (24, 16)
    x = {"x": _RNG.standard_normal((2, 8, 4, 4)).astype(np.float32)}
    assert rel_err(run(m, x), run(out, x)) < PAD_RTOL


def test_padding_slices_for_subgraph_reads_and_leaves_aligned_gemms_alone() -> None:
    """A tensor read inside an If branch (outer scope, in no node's inputs) is sliced back
    under its own name; a GEMM whose K and N are already multiples of 8 is not touched."""
    branch = {k: helper.make_graph([helper.make_node(op, ["r"], [k])], k, [], [
        helper.make_tensor_value_info(k, T.FLOAT, [4, 67])]) for k, op in (("o1", "Relu"),
                                                                           ("o2", "Neg"))}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2"),
             helper.make_node("MatMul", ["x", "w3"], ["y3"], name="aligned"),
             helper.make_node("If", ["cond"], ["z"], name="if", then_branch=branch["o1"],
                              else_branch=branch["o2"])]
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", T.FLOAT, [4, 64]),
                                       helper.make_tensor_value_info("cond", T.BOOL, [])],
                          [helper.make_tensor_value_info(n, T.FLOAT, s) for n, s in (
                              ("y", [4, 10]), ("y3", [4, 32]), ("z", [4, 67]))],
                          [init("w", 64, 67), init("w2", 67, 10), init("w3", 64, 32)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    src, ctx = context(m, dtype="fp16", pad="always")
    out = checked(pad_channels(src, ctx))
    assert producer(out, "r").op_type == "Slice"
    assert ctx.decisions["relu"]["padding_carry"].applied
    assert "already multiples of 8" in ctx.decisions["aligned"]["padding"].reason
    assert inits_of(out)["w3"] == (64, 32)
    for cond in (True, False):
        x = {"x": _RNG.standard_normal((4, 64)).astype(np.float32), "cond": np.array(cond)}
        assert rel_err(run(m, x), run(out, x)) < PAD_RTOL


@pytest.mark.parametrize("name", ["odd_residual_cnn", "odd_mlp", "transformer_hd72"])
def test_padding_exported_zoo_models_keep_their_outputs(name: str, tmp_path) -> None:
    torch = pytest.importorskip("torch")
    from tests.zoo import zoo

    net, inputs = zoo()[name]
    path = tmp_path / f"{name}.onnx"
    torch.onnx.export(net, inputs, str(path), dynamo=False, opset_version=17,
                      input_names=["x"], dynamic_axes={"x": {0: "batch"}})
    m = onnx.load(str(path))
    src, ctx = context(m, dtype="fp16", pad="always")
    out = checked(pad_channels(src, ctx))
    assert ctx.notes["padding"]["padded_nodes"]
    x = {"x": inputs[0].numpy()}
    assert rel_err(run(m, x), run(out, x)) < PAD_RTOL


def test_padding_conv_transpose_and_a_grouped_conv_read_padded_channels_exactly() -> None:
    """ConvTranspose ([C_in, C_out/g, k] weight) pads both sides; a grouped conv after it
    takes its input padded per call with a Gather (each group's block rounded up)."""
    nodes = [helper.make_node("Conv", ["x", "w1"], ["h"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("ConvTranspose", ["h", "wt", "bt"], ["u"], name="up",
                              strides=[2, 2]),
             helper.make_node("Conv", ["u", "wg"], ["y"], name="grouped", group=2,
                              pads=[1, 1, 1, 1])]
    m = model(nodes, {"x": [2, 3, 8, 8]}, {"y": [2, 18, 16, 16]},
              [init("w1", 13, 3, 3, 3), init("wt", 13, 10, 2, 2), init("bt", 10),
               init("wg", 18, 5, 3, 3)])
    src, ctx = context(m, dtype="fp16", pad="always")
    out = checked(pad_channels(src, ctx))
    assert inits_of(out)[producer(out, "u_padded").input[1]] == (16, 16, 2, 2)
    assert ctx.decisions["up"]["padding"].detail.new == {"C_in": 16, "C_out": 16}
    assert "Gather" in ops(out)  # the grouped conv's input: 5 -> 8 per group, per call
    x = {"x": _RNG.standard_normal((2, 3, 8, 8)).astype(np.float32)}
    assert rel_err(run(m, x), run(out, x)) < PAD_RTOL


def test_padding_leaves_a_conv_transpose_alone_where_nothing_pays() -> None:
    nodes = [helper.make_node("ConvTranspose", ["x", "wt"], ["y"], name="up", strides=[2, 2])]
    m = model(nodes, {"x": [1, 13, 4, 4]}, {"y": [1, 10, 8, 8]}, [init("wt", 13, 10, 2, 2)])
    src, ctx = context(m, dtype="fp16")  # pad="auto": a tiny, launch-bound node
    assert pad_channels(src, ctx) is None
    assert not ctx.decisions["up"]["padding"].applied
