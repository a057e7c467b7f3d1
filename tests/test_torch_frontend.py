"""Torch frontend on hand-built models: the op mapping, getitem resolution, the make_fx fallback,
kwargs/dtypes/dynamic dims, inlined no_grad/autocast blocks, the aten table, quantized Linear.

Models left unchanged and bad inputs are in test_torch_frontend_errors.py; transformers models
and conversion speed in test_torch_frontend_scale.py; shared helpers in
tests/torch_frontend_models.py."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

from graphopt.frontends.aten_ops import ATEN_OPS, Call, Ref
from graphopt.frontends.torch_frontend import trace_torch
from graphopt.ir.graph import TensorInfo
from tests.torch_frontend_models import (
    CNN,
    MLP,
    DataDependent,
    ManualAttention,
    check_wellformed,
    only,
    ops,
)


class SDPABlock(nn.Module):
    def __init__(self, d: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.qkv, self.heads = nn.Linear(d, 3 * d), heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)


class RMSNorm(nn.Module):
    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Rotary(nn.Module):
    def __init__(self, s: int = 16, d: int = 32) -> None:
        super().__init__()
        ang = torch.outer(torch.arange(s).float(), torch.rand(d // 2)).repeat(1, 2)
        self.register_buffer("cos", ang.cos())
        self.register_buffer("sin", ang.sin())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return x * self.cos + torch.cat((-x2, x1), dim=-1) * self.sin


class SwiGLU(nn.Module):
    def __init__(self, d: int = 32, h: int = 64) -> None:
        super().__init__()
        self.gate, self.up = nn.Linear(d, h, bias=False), nn.Linear(d, h, bias=False)
        self.down = nn.Linear(h, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


def test_mlp_linear_weight_is_input_1_with_shape_n_k() -> None:
    g = trace_torch(MLP().eval(), torch.randn(4, 16))
    check_wellformed(g)
    assert ops(g) == Counter({"Linear": 2, "Gelu": 1})
    fc1, fc2 = [n for n in g.nodes if n.op_type == "Linear"]
    assert g.tensors[fc1.inputs[1]].shape == (32, 16) and g.tensors[fc1.inputs[1]].kind == "param"
    assert g.tensors[fc1.inputs[2]].shape == (32,)
    assert len(fc2.inputs) == 2  # no bias: the absent trailing input is dropped
    assert fc1.source_op == "aten.linear.default"
    assert g.inputs == ["x"] and g.tensors["x"] == TensorInfo("x", (4, 16), "fp32", "input")
    assert g.tensors[g.outputs[0]].shape == (4, 8)
    assert g.name == "MLP" and g.source == "torch" and g.warnings == []
    assert isinstance(g.source_model, torch.export.ExportedProgram)


def test_cnn_grouped_conv_batchnorm_pools() -> None:
    g = trace_torch(CNN().eval(), torch.randn(2, 4, 16, 16))
    check_wellformed(g)
    conv = only(g, "Conv")
    assert conv.attrs == {"group": 2, "strides": [2, 2], "pads": [1, 1, 1, 1],
                          "dilations": [1, 1], "kernel_shape": [3, 3]}
    assert g.tensors[conv.inputs[1]].shape == (8, 2, 3, 3)
    bn = only(g, "BatchNormalization")
    assert [g.tensors[t].kind for t in bn.inputs[1:]] == ["param"] * 4
    assert bn.attrs["training_mode"] == 0 and bn.attrs["epsilon"] == 1e-5
    assert only(g, "MaxPool").attrs["kernel_shape"] == [2, 2]
    assert only(g, "MaxPool").attrs["strides"] == [2, 2]  # stride defaults to the kernel
    assert "GlobalAveragePool" in ops(g) and only(g, "Flatten").attrs["alias"] is True
    assert g.tensors[g.outputs[0]].shape == (2, 8)


def test_transposed_conv() -> None:
    m = nn.ConvTranspose2d(8, 4, 4, stride=2, padding=1, output_padding=1).eval()
    g = trace_torch(m, torch.randn(1, 8, 5, 5))
    ct = only(g, "ConvTranspose")
    assert g.tensors[ct.inputs[1]].shape == (8, 4, 4, 4)  # [Cin, Cout/group, k, k]
    assert ct.attrs["output_padding"] == [1, 1] and ct.attrs["pads"] == [1, 1, 1, 1]
    assert g.tensors[ct.outputs[0]].shape == (1, 4, 11, 11)


def test_manual_attention_block() -> None:
    q, k, v = (torch.randn(2, 4, 8, 16) for _ in range(3))
    mask = torch.ones(8, 8, dtype=torch.bool).triu(1)
    g = trace_torch(ManualAttention(), (q, k, v, mask))
    check_wellformed(g)
    assert ops(g)["MatMul"] == 2 and only(g, "Div").attrs["scalar"] == 8.0
    assert only(g, "Softmax").attrs == {"axis": -1}
    where = only(g, "Where")
    assert where.inputs == ["mask", where.inputs[1]] and where.attrs["scalar_position"] == 1
    assert only(g, "Transpose").attrs == {"perm": [0, 1, 3, 2], "alias": True}
    assert g.tensors["mask"].dtype == "bool"


def test_sdpa_block_and_unbind_outputs() -> None:
    g = trace_torch(SDPABlock().eval(), torch.randn(2, 8, 64))
    check_wellformed(g)
    att = only(g, "Attention")
    assert att.attrs["is_causal"] is True and att.attrs["scale"] is None
    assert [g.tensors[t].shape for t in att.inputs] == [(2, 4, 8, 16)] * 3
    split = only(g, "Split")
    assert split.outputs == att.inputs and split.attrs["squeeze"] == 1  # unbind: q, k, v


def test_rmsnorm_rotary_swiglu() -> None:
    g = trace_torch(RMSNorm().eval(), torch.randn(2, 16, 32))
    assert only(g, "Pow").attrs["scalar"] == 2
    assert only(g, "ReduceMean").attrs == {"axes": [-1], "keepdims": 1}
    assert "Rsqrt" in ops(g) and ops(g)["Mul"] == 2

    g = trace_torch(Rotary().eval(), torch.randn(2, 16, 32))
    check_wellformed(g)
    assert ops(g)["Slice"] == 2 and "Neg" in ops(g) and only(g, "Concat").attrs["axis"] == -1
    assert {g.tensors[t].kind for n in g.nodes for t in n.inputs if "cos" in t} == {"param"}
    sl = [n for n in g.nodes if n.op_type == "Slice"]
    assert sl[0].attrs["ends"] == [16] and sl[1].attrs["starts"] == [16]

    g = trace_torch(SwiGLU().eval(), torch.randn(2, 16, 32))
    assert ops(g) == Counter({"Linear": 3, "Silu": 1, "Mul": 1})


def test_getitem_resolution_and_unread_outputs() -> None:
    class M(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            a, _, c = torch.split(x, 4, dim=1)
            return a + c, x.max(dim=-1).values

    g = trace_torch(M(), torch.randn(2, 12))
    check_wellformed(g)
    split, red = only(g, "Split"), only(g, "ReduceMax")
    assert split.outputs[1] == "" and all(split.outputs[i] for i in (0, 2))
    assert g.tensors[split.outputs[2]].shape == (2, 4)
    assert red.outputs[1] == "" and red.attrs == {"axes": [-1], "keepdims": 0}
    assert only(g, "Add").inputs == [split.outputs[0], split.outputs[2]]
    assert g.outputs == [only(g, "Add").outputs[0], red.outputs[0]]


def test_fallback_on_data_dependent_control_flow() -> None:
    m = DataDependent().eval()
    g = trace_torch(m, torch.ones(4, 8))
    check_wellformed(g)
    assert any("make_fx" in w and "specialized" in w for w in g.warnings)
    assert isinstance(g.source_model, fx.GraphModule)
    assert "Gemm" in ops(g) and "BatchNormalization" in ops(g)
    gemm = only(g, "Gemm")  # addmm(bias, x, t(W)) re-ordered to Gemm(A, B, C)
    assert g.tensors[gemm.inputs[2]].kind == "param" and gemm.inputs[2] == "p_fc_bias"
    assert g.inputs == ["x"] and g.tensors["p_fc_weight"].shape == (8, 8)
    bn = only(g, "BatchNormalization")  # native_batch_norm: 3 outputs, only the first read
    assert bn.outputs[1:] == ["", ""] and bn.inputs[3] == "b_bn_running_mean"


def test_kwargs_dtypes_dynamic_dims_and_unmapped_ops() -> None:
    g = trace_torch(MLP().eval(), {"x": torch.randn(3, 16)})
    assert g.inputs == ["x"]
    g = trace_torch(MLP().to(torch.bfloat16).eval(), torch.randn(3, 16, dtype=torch.bfloat16))
    assert {t.dtype for t in g.tensors.values()} == {"bf16"}
    batch = torch.export.Dim("batch")
    g = trace_torch(MLP().eval(), torch.randn(3, 16), dynamic_shapes={"x": {0: batch}})
    assert g.tensors["x"].shape == ("batch", 16)
    assert g.tensors[g.outputs[0]].shape == ("batch", 8)

    class Flat(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.view(x.shape[0], -1)

    g = trace_torch(Flat(), torch.randn(4, 3, 5), dynamic_shapes=({0: batch},))
    assert only(g, "Reshape").attrs["shape"] == ["batch", -1] and "Shape" in ops(g)

    class Odd(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.special.i0(x).cumprod(0)

    g = trace_torch(Odd().eval(), torch.randn(4))
    assert [n.op_type for n in g.nodes] == ["aten.special_i0.default", "aten.cumprod.default"]
    assert g.nodes[1].inputs == [g.nodes[0].outputs[0]] and g.nodes[1].attrs == {"dim": 0}
    assert any("no canonical op" in w for w in g.warnings)


def test_no_grad_and_autocast_blocks_are_inlined() -> None:
    class M(nn.Module):  # export wraps these blocks in higher-order ops with subgraphs
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("freq", torch.rand(8))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                a = torch.outer(x, self.freq)
                c, s = a.cos(), a.sin()
            with torch.autocast("cpu", enabled=False):
                e = c * 2
            return c + s + e

    g = trace_torch(M().eval(), torch.randn(4))
    check_wellformed(g)
    assert ops(g) == Counter({"Mul": 2, "Cos": 1, "Sin": 1, "Add": 2})  # outer is a Mul
    cos = only(g, "Cos")
    assert cos.name.startswith("wrap_with_set_grad_enabled.")
    assert g.producer[cos.inputs[0]].attrs == {"variant": "outer"}
    assert g.tensors[cos.inputs[0]].shape == (4, 8) and g.tensors[g.outputs[0]].shape == (4, 8)


def test_table_entries_produce_known_ops() -> None:
    """The table speaks the ops.py vocabulary (Einsum/BitShift aside), and quantized GEMMs map."""
    t = {"x": TensorInfo("x", (4, 64), "bf16"), "w": TensorInfo("w", (32, 32), "int32"),
         "sz": TensorInfo("sz", (2, 32, 2), "bf16")}
    out = [TensorInfo("y", (4, 32), "bf16")]
    args = {"self": Ref("x"), "mat2": Ref("w"), "qGroupSize": 32, "qScaleAndZeros": Ref("sz")}
    op, ins, attrs = ATEN_OPS["aten._weight_int4pack_mm"](Call("aten._weight_int4pack_mm",
                                                               "default", args, t, out))
    assert (op, ins) == ("MatMulNBits", ["x", "w", "sz"])
    assert attrs == {"bits": 4, "K": 64, "N": 32, "block_size": 32}
    conv = ATEN_OPS["aten.conv2d"](Call("aten.conv2d", "padding", {
        "input": Ref("i"), "weight": Ref("k"), "padding": "same", "dilation": [1, 1],
        "stride": [1, 1], "groups": 1}, {"k": TensorInfo("k", (8, 4, 4, 4), "fp32")}, []))
    assert conv[2]["pads"] == [1, 1, 2, 2]  # even kernel: the odd unit of padding at the end
    assert {"aten.add_", "aten.relu_", "aten.scaled_dot_product_attention"} <= ATEN_OPS.keys()


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
def test_dynamic_quantized_linear_packed_weight() -> None:
    m = nn.Sequential(nn.Linear(64, 32), nn.ReLU()).eval()
    qm = torch.ao.quantization.quantize_dynamic(m, {nn.Linear}, dtype=torch.qint8)
    g = trace_torch(qm, torch.randn(4, 64))  # export cannot fakify packed params: make_fx
    q = only(g, "DynamicQuantizeMatMul")
    w = g.tensors[q.inputs[1]]
    assert (w.shape, w.dtype, w.kind) == ((32, 64), "int8", "param")
