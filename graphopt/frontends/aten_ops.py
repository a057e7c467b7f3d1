"""ATen → canonical op table for the torch frontend.

Keyed by OpOverloadPacket (``"aten.linear"``); each entry returns ``(op_type, inputs, attrs)``
in the conventions of :mod:`graphopt.ir.ops`. An entry sees a :class:`Call`: arguments by schema
name (positional and keyword merged, defaults filled in) with fx values already replaced by
:class:`Ref`, so the table never touches torch.fx and reads line by line against the schemas.
Simple entries are ``_op(op_type, "schema input names", attr=A("schema arg"), attr=const)``.

Choices worth knowing:

* Scalar operands of elementwise ops go to ``attrs["scalar"]`` plus ``attrs["scalar_position"]``
  (its place among the operands, so ``rsub`` and ``pow.Scalar`` stay unambiguous).
* ``torch.gather`` is ``GatherElements`` (ONNX's name for that op); ``index_select``,
  ``embedding`` (weight first, like ONNX ``Gather(data, indices)``) and ``index.Tensor`` are
  ``Gather``; ``ne`` is ``Equal`` with ``negate=True``; ``sym_numel`` is ``Size``.
* Quantized GEMMs use the closest :data:`graphopt.ir.ops.QUANT_GEMM_OPS` name: weight-only int8/int4
  (``_weight_int8pack_mm``, ``_weight_int4pack_mm*``) are ``MatMulNBits`` (attrs ``bits``,
  ``block_size``, ``K``, ``N``); ``quantized::linear_dynamic`` is ``DynamicQuantizeMatMul``;
  ``quantized::linear`` (int8 in and out) is ``QGemm``; ``_int_mm`` is ``MatMulInteger``; fp8
  ``_scaled_mm`` is ``MatMul`` with ``scaled=True`` (the fp8 dtypes are on its tensors).
* ``_flash_attention_forward``/``_efficient_attention_forward`` take ``[B, S, H, D]``: their
  ``Attention`` carries ``layout="BSHD"``. ``baddbmm`` is ``MatMul(b1, b2, addend)``.
* Ops ONNX lacks keep a canonical name and say what they are in ``variant``: ``im2col``
  (F.unfold) is a ``Gather``, ``col2im`` a ``ScatterElements`` add, ``meshgrid`` an aliasing
  ``Expand``, ``_weight_norm`` an ``LpNormalization`` scaled by ``g``. ``fill_`` is
  ``ConstantOfShape`` (the kernel of ``full``) writing into ``attrs["dst"]``, as ``copy_`` does.
* Scatters (``scatter*``, ``index_copy*``, ``index_add*``, ``index_fill*``, ``masked_scatter*``,
  ``select_scatter``/``slice_scatter``...) are ``ScatterElements`` with ``updates``, the elements
  they write; the in-place ones carry ``inplace``/``dst``. ``repeat_interleave`` is a ``Tile``
  (``variant``); ``glu`` and ``polar`` are ``Glu`` and ``Polar``.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from graphopt.ir.graph import TensorInfo

__all__ = ["ATEN_OPS", "SKIP_OPS", "TORCH_DTYPES", "Call", "MapResult", "Ref", "plain"]

logger = logging.getLogger(__name__)

MapResult = tuple[str, list[str], dict[str, Any]]

# torch dtype -> canonical name (graphopt.ir.graph.DTYPE_BITS). Packed sub-byte dtypes are left out:
# their element count is not their value count, so sizes computed from them would mislead.
TORCH_DTYPES: dict[torch.dtype, str] = {
    torch.float64: "fp64", torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16",
    torch.int64: "int64", torch.int32: "int32", torch.int16: "int16", torch.int8: "int8",
    torch.uint8: "uint8", torch.bool: "bool", torch.complex64: "complex64",
    torch.complex128: "complex128", torch.qint8: "int8", torch.quint8: "uint8",
    torch.qint32: "int32",
}
for _name, _canon in (("float8_e4m3fn", "fp8_e4m3"), ("float8_e4m3fnuz", "fp8_e4m3"),
                      ("float8_e5m2", "fp8_e5m2"), ("float8_e5m2fnuz", "fp8_e5m2")):
    if hasattr(torch, _name):
        TORCH_DTYPES[getattr(torch, _name)] = _canon

# Ops that only assert or constrain shapes: they compute nothing, so they get no node.
SKIP_OPS = frozenset(f"aten.{n}" for n in (
    "_assert_scalar", "_assert_tensor_metadata", "sym_constrain_range", "_print",
    "sym_constrain_range_for_size", "_assert_async", "_functional_assert_async",
    "_functional_sym_constrain_range", "_functional_sym_constrain_range_for_size",
    "_make_dep_token"))

# rms_norm(eps=None) uses torch.finfo(input.dtype).eps.
_FINFO_EPS = {"fp64": 2.220446049250313e-16, "fp32": 1.1920928955078125e-07,
              "fp16": 0.0009765625, "bf16": 0.0078125}
_INT64_MAX = 2**63 - 1  # what torch writes for an open slice end


@dataclass(frozen=True, slots=True)
class Ref:
    """An fx value: tensor ``name``; ``scalar`` (an int or a symbol string) for SymInt values."""

    name: str
    scalar: int | float | str | None = None


def plain(v: Any) -> Any:
    """Make an argument JSON-friendly: dtypes get canonical names, symbolic values their symbol."""
    if isinstance(v, Ref):
        return v.scalar if v.scalar is not None else v.name
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, torch.dtype):
        return TORCH_DTYPES.get(v, str(v))
    if isinstance(v, (torch.device, torch.memory_format, torch.layout)):
        return str(v)
    return v


@dataclass(slots=True)
class Call:
    """One op call as a table entry sees it."""

    packet: str                      # "aten.linear"
    overload: str                    # "default", "Tensor", "dim", ...
    args: dict[str, Any]             # schema name -> value (Ref for fx values)
    tensors: dict[str, TensorInfo]   # the tensor table so far (holds every input)
    outputs: list[TensorInfo | None]

    def has(self, name: str) -> bool:
        return name in self.args

    def t(self, name: str) -> str:
        """Tensor name of an argument; '' when absent or not a tensor."""
        v = self.args.get(name)
        return v.name if isinstance(v, Ref) and v.scalar is None else ""

    def ts(self, name: str) -> list[str]:
        return [x.name if isinstance(x, Ref) else "" for x in self.args.get(name) or ()]

    def v(self, name: str, default: Any = None) -> Any:
        v = self.args.get(name)
        return default if v is None else plain(v)

    def shape(self, name: str = "self") -> tuple[int | str, ...] | None:
        info = self.tensors.get(self.t(name))
        return None if info is None else info.shape

    def dtype(self, name: str) -> str | None:
        info = self.tensors.get(self.t(name))
        return None if info is None else info.dtype

    def rank(self, name: str = "self") -> int | None:
        s = self.shape(name)
        return None if s is None else len(s)


MapFn = Callable[[Call], MapResult]
ATEN_OPS: dict[str, MapFn] = {}


@dataclass(frozen=True, slots=True)
class A:
    """An attr taken from schema argument ``name`` (``default`` when absent or None)."""

    name: str
    default: Any = None


def _reg(*names: str) -> Callable[[MapFn], MapFn]:
    """Register under ``aten.<name>``, or under the name itself when it has a namespace."""
    def deco(fn: MapFn) -> MapFn:
        for n in names:
            ATEN_OPS[n if "." in n else f"aten.{n}"] = fn
        return fn
    return deco


def _trim(names: list[str]) -> list[str]:
    """Drop trailing absent optional inputs."""
    while names and not names[-1]:
        names.pop()
    return names


def _op(op: str, inputs: str = "self", **attrs: Any) -> MapFn:
    """A table entry: tensor inputs by schema name, attrs constant or ``A(schema name)``."""
    names = inputs.split()
    return lambda c: (op, _trim([c.t(n) for n in names]), {
        k: c.v(a.name, a.default) if isinstance(a, A) else a for k, a in attrs.items()})


def _ints(v: Any, n: int) -> list[Any]:
    """Expand an int or a 1-element list to ``n`` entries (ATen broadcasts those)."""
    if v is None:
        return []
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return v * n if len(v) == 1 and n > 1 else v


def _axes(dim: Any) -> list[Any] | None:
    if dim is None or dim == []:
        return None
    return list(dim) if isinstance(dim, (list, tuple)) else [dim]


def _spatial(c: Call, weight: str | None = None) -> int:
    """Spatial rank: from the weight or input rank, else the digit in the op name."""
    r = (c.rank(weight) if weight else None) or c.rank("self") or c.rank("input")
    if r is not None:
        return max(r - 2, 1)
    m = re.search(r"(\d)d", c.packet)
    return int(m.group(1)) if m else 2


def _operands(c: Call, names: tuple[str, ...]) -> tuple[list[str], dict[str, Any]]:
    """Tensor operands become inputs; scalar operands become attrs (scalar, scalar_position)."""
    ins: list[str] = []
    scalars: list[tuple[int, Any]] = []
    for pos, nm in enumerate(names):
        val = c.args.get(nm)
        if isinstance(val, Ref) and val.scalar is None:
            ins.append(val.name)
        else:
            scalars.append((pos, plain(val)))
    attrs: dict[str, Any] = {}
    if scalars:
        attrs["scalar_position"], attrs["scalar"] = scalars[0]
        if len(scalars) > 1:
            attrs["scalars"] = scalars
    return ins, attrs


def _nary(op: str, names: tuple[str, ...] = ("self", "other"), **fixed: Any) -> MapFn:
    def fn(c: Call) -> MapResult:
        ins, attrs = _operands(c, names)
        if c.v("alpha", 1) != 1:
            attrs["alpha"] = c.v("alpha")
        if c.v("rounding_mode") is not None:
            attrs["rounding_mode"] = c.v("rounding_mode")
        return op, ins, {**fixed, **attrs}
    return fn


def _with(fn: MapFn, **extra: Any) -> MapFn:
    """``fn`` with extra attrs (in-place variants, views)."""
    def wrapped(c: Call) -> MapResult:
        op, ins, attrs = fn(c)
        return op, ins, {**attrs, **extra}
    return wrapped


# --- GEMMs and quantized GEMMs ------------------------------------------------------------------
_reg("linear")(_op("Linear", "input weight bias"))
_reg("addmm")(_op("Gemm", "mat1 mat2 self", transA=0, transB=0, alpha=A("alpha", 1),
                  beta=A("beta", 1)))
_reg("mm", "bmm")(_op("MatMul", "self mat2"))
_reg("matmul")(_op("MatMul", "self other"))
_reg("mv")(_op("MatMul", "self vec"))
_reg("dot")(_op("MatMul", "self tensor"))
# out = beta * self + alpha * (batch1 @ batch2): a MatMul reading the addend as a third input.
_reg("baddbmm", "addbmm")(_op("MatMul", "batch1 batch2 self", bias_add=True, alpha=A("alpha", 1),
                              beta=A("beta", 1)))
_reg("einsum")(lambda c: ("Einsum", c.ts("tensors"), {"equation": c.v("equation")}))
_reg("_int_mm")(_op("MatMulInteger", "self mat2"))
_reg("_scaled_mm")(_op("MatMul", "self mat2 scale_a scale_b bias", scaled=True,
                       out_dtype=A("out_dtype")))


@_reg("_grouped_mm", "transformers.grouped_mm_fallback")
def _grouped_mm(c: Call) -> MapResult:
    """A mixture-of-experts grouped GEMM: rows of ``A[S, K]`` between consecutive ``offs``
    use group ``g`` of ``B[G, K, N]`` (``grouped=True``; without offs a batched MatMul).
    transformers' CPU/compile fallback op has the same contract."""
    a, b = (c.t("self"), c.t("mat2")) if c.has("self") else (c.t("input"), c.t("weight"))
    return "MatMul", _trim([a, b, c.t("offs")]), {"grouped": bool(c.t("offs")),
                                                   "out_dtype": c.v("out_dtype")}


_reg("quantized.linear_dynamic")(_op("DynamicQuantizeMatMul", "X W_prepack",
                                     reduce_range=A("reduce_range")))
_reg("quantized.linear")(_op("QGemm", "X W_prepack", y_scale=A("Y_scale_i"),
                             y_zero_point=A("Y_zero_point_i")))


@_reg("_weight_int8pack_mm")
def _int8pack(c: Call) -> MapResult:
    n, k = c.shape("mat2") or (None, None)  # [N, K] int8, one scale per output channel
    return "MatMulNBits", [c.t("self"), c.t("mat2"), c.t("scales")], {
        "bits": 8, "N": n, "K": k, "block_size": k}


@_reg("_weight_int4pack_mm", "_weight_int4pack_mm_for_cpu",
      "_weight_int4pack_mm_with_scales_and_zeros")
def _int4pack(c: Call) -> MapResult:
    x, out = c.shape("self"), c.outputs[0] if c.outputs else None
    return "MatMulNBits", _trim([c.t("self"), c.t("mat2"), c.t("qScaleAndZeros") or c.t("qScale"),
                                 c.t("qZeros")]), {
        "bits": 4, "K": x[-1] if x else None, "N": out.dim(-1, 0) if out else None,
        "block_size": c.v("qGroupSize")}


def _q(op: str) -> MapFn:
    """(De)quantize: tensors are inputs, everything else (scale, zero point, dtype) attrs."""
    def fn(c: Call) -> MapResult:
        tensor = {k for k, v in c.args.items() if isinstance(v, Ref) and v.scalar is None}
        return op, [c.args[k].name for k in tensor], {
            k: plain(v) for k, v in c.args.items() if k not in tensor and v is not None}
    return fn


for _p in ("quantize_per_tensor", "quantize_per_channel"):
    _reg(_p, f"quantized_decomposed.{_p}")(_q("QuantizeLinear"))
for _p in ("dequantize_per_tensor", "dequantize_per_channel"):
    _reg(f"quantized_decomposed.{_p}")(_q("DequantizeLinear"))
_reg("dequantize")(_q("DequantizeLinear"))


# --- convolution and attention -----------------------------------------------------------------
@_reg("conv1d", "conv2d", "conv3d", "convolution", "_convolution",
      "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")
def _conv(c: Call) -> MapResult:
    w = c.shape("weight")
    n = _spatial(c, "weight")
    k = list(w[2:]) if w is not None else None
    dil = _ints(c.v("dilation", 1), n)
    pad = c.v("padding", 0)
    if pad == "valid":
        begin = end = [0] * n
    elif pad == "same":  # total d*(k-1) per dim, the odd unit on the end side (as torch does)
        total = [d * (kk - 1) if isinstance(kk, int) else 0
                 for d, kk in zip(dil, k or [1] * n, strict=False)]
        begin = [t // 2 for t in total]
        end = [t - t // 2 for t in total]
    else:
        begin = end = _ints(pad, n)
    transposed = c.packet.startswith("aten.conv_transpose") or bool(c.v("transposed", False))
    attrs: dict[str, Any] = {"group": c.v("groups", 1), "strides": _ints(c.v("stride", 1), n),
                             "pads": begin + end, "dilations": dil, "kernel_shape": k}
    if transposed:
        attrs["output_padding"] = _ints(c.v("output_padding", 0), n)
    return ("ConvTranspose" if transposed else "Conv"), _trim(
        [c.t("input"), c.t("weight"), c.t("bias")]), attrs


@_reg("scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
      "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
      "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_attention_math",
      "_scaled_dot_product_fused_attention_overrideable", "_flash_attention_forward",
      "_efficient_attention_forward")
def _attention(c: Call) -> MapResult:
    mask = c.t("attn_mask") or c.t("attn_bias") or c.t("bias")
    attrs: dict[str, Any] = {
        "scale": c.v("scale"), "dropout_p": c.v("dropout_p", 0.0),
        "is_causal": bool(c.v("is_causal", False)) or bool(c.v("custom_mask_type", 0))}
    if c.v("enable_gqa"):
        attrs["enable_gqa"] = True
    if c.packet in ("aten._flash_attention_forward", "aten._efficient_attention_forward"):
        attrs["layout"] = "BSHD"
    return "Attention", _trim([c.t("query"), c.t("key"), c.t("value"), mask]), attrs


# --- softmax and normalization -----------------------------------------------------------------
_reg("softmax", "_softmax", "_safe_softmax")(_op("Softmax", axis=A("dim")))
_reg("log_softmax", "_log_softmax")(_op("LogSoftmax", axis=A("dim")))
_reg("layer_norm", "native_layer_norm")(lambda c: (
    "LayerNormalization", _trim([c.t("input"), c.t("weight"), c.t("bias")]),
    {"axis": -len(c.v("normalized_shape")), "epsilon": c.v("eps", 1e-5)}))
_reg("rms_norm", "_fused_rms_norm")(lambda c: (
    "RMSNormalization", _trim([c.t("input"), c.t("weight")]),
    {"axis": -len(c.v("normalized_shape")),
     "epsilon": c.v("eps", _FINFO_EPS.get(c.dtype("input") or "fp32", _FINFO_EPS["fp32"]))}))
# running stats are '' for _native_batch_norm_legit.no_stats (trailing ones are trimmed)
_reg("batch_norm", "native_batch_norm", "_native_batch_norm_legit",
     "_native_batch_norm_legit_no_training", "_native_batch_norm_legit_functional",
     "cudnn_batch_norm", "miopen_batch_norm")(lambda c: (
        "BatchNormalization",
        _trim([c.t(n) for n in ("input", "weight", "bias", "running_mean", "running_var")]),
        {"epsilon": c.v("eps", c.v("epsilon", 1e-5)),
         "momentum": c.v("momentum", c.v("exponential_average_factor")),
         "training_mode": int(bool(c.v("training", False)))}))
_reg("group_norm")(_op("GroupNormalization", "input weight bias", num_groups=A("num_groups"),
                       epsilon=A("eps", 1e-5)))
_reg("native_group_norm")(_op("GroupNormalization", "input weight bias", num_groups=A("group"),
                              epsilon=A("eps", 1e-5)))
_reg("instance_norm")(_op("InstanceNormalization", "input weight bias", epsilon=A("eps", 1e-5)))


@_reg("_weight_norm", "_weight_norm_interface")
def _weight_norm(c: Call) -> MapResult:
    """``g * v / ||v||``, the 2-norm over every dim of ``v`` but ``dim``: an LpNormalization
    scaled by ``g`` (``variant="weight_norm"``; ``dim=-1`` normalizes the whole tensor)."""
    return "LpNormalization", _trim([c.t("v"), c.t("g")]), {
        "p": 2, "dim": c.v("dim", 0), "variant": "weight_norm"}


# --- elementwise; every entry is also registered as its in-place "op_" with inplace=True -----
_ELEMENTWISE: dict[str, MapFn] = {
    "add": _nary("Add"), "sub": _nary("Sub"), "mul": _nary("Mul"), "div": _nary("Div"),
    "multiply": _nary("Mul"), "subtract": _nary("Sub"), "divide": _nary("Div"),  # aliases
    "true_divide": _nary("Div"),
    "rsub": _nary("Sub", ("other", "self")), "pow": _nary("Pow", ("self", "exponent")),
    "maximum": _nary("Max"), "minimum": _nary("Min"), "fmax": _nary("Max"), "fmin": _nary("Min"),
    "eq": _nary("Equal"), "ne": _nary("Equal", negate=True), "lt": _nary("Less"),
    "le": _nary("LessOrEqual"), "gt": _nary("Greater"), "ge": _nary("GreaterOrEqual"),
    "logical_and": _nary("And"), "logical_or": _nary("Or"), "logical_xor": _nary("Xor"),
    "bitwise_and": _nary("BitwiseAnd"), "bitwise_or": _nary("BitwiseOr"),
    "remainder": _nary("Mod"), "fmod": _nary("Mod", fmod=1),
    "floor_divide": _nary("Div", rounding_mode="floor"),
    "where": _nary("Where", ("condition", "self", "other")),
    "masked_fill": _nary("Where", ("mask", "value", "self")),  # where mask: value, else self
    "prelu": _op("PRelu", "self weight"),
    "__and__": _nary("And"), "__or__": _nary("Or"), "__xor__": _nary("Xor"),
    "__lshift__": _nary("BitShift", direction="LEFT"),
    "__rshift__": _nary("BitShift", direction="RIGHT"),
    **{k: _op(v) for k, v in {
        "sqrt": "Sqrt", "rsqrt": "Rsqrt", "exp": "Exp", "log": "Log", "neg": "Neg", "abs": "Abs",
        "reciprocal": "Reciprocal", "relu": "Relu", "silu": "Silu", "sigmoid": "Sigmoid",
        "tanh": "Tanh", "hardswish": "HardSwish", "sin": "Sin", "cos": "Cos", "erf": "Erf",
        "floor": "Floor", "ceil": "Ceil", "round": "Round", "sign": "Sign", "isnan": "IsNaN",
        "isinf": "IsInf", "mish": "Mish", "selu": "Selu", "logical_not": "Not",
        "bitwise_not": "Not", "bernoulli": "Bernoulli"}.items()},
    **{k: _op(v, variant=k) for k, v in {
        "log1p": "Log", "log2": "Log", "log10": "Log", "expm1": "Exp", "exp2": "Exp"}.items()},
    "gelu": _op("Gelu", approximate=A("approximate", "none")),
    "hardsigmoid": _op("HardSigmoid", alpha=1 / 6, beta=0.5),  # relu6(x + 3) / 6
    "leaky_relu": _op("LeakyRelu", alpha=A("negative_slope", 0.01)),
    "elu": _op("Elu", alpha=A("alpha", 1), scale=A("scale", 1), input_scale=A("input_scale", 1)),
    "celu": _op("Celu", alpha=A("alpha", 1)),
    "softplus": _op("Softplus", beta=A("beta", 1), threshold=A("threshold", 20)),
    "hardtanh": _op("Clip", min=A("min_val", -1), max=A("max_val", 1)),
    "relu6": _op("Clip", min=0, max=6),
    "threshold": _op("ThresholdedRelu", alpha=A("threshold"), value=A("value")),
    "outer": _op("Mul", "self vec2", variant="outer"),  # a[:, None] * b[None, :], no reduction
    "diff": _op("Sub", "self prepend append", variant="diff", axis=A("dim", -1), n=A("n", 1)),
    "tril": _op("Trilu", upper=0, k=A("diagonal", 0)),
    "triu": _op("Trilu", upper=1, k=A("diagonal", 0)),
}


def _clamp(c: Call) -> MapResult:
    """Clip(x, min?, max?): tensor bounds are inputs, scalar bounds attrs."""
    ins, attrs = [c.t("self")], {}
    for bound in ("min", "max"):
        v = c.args.get(bound)
        ins.append(c.t(bound))
        if not ins[-1] and v is not None:
            attrs[bound] = plain(v)
    return "Clip", _trim(ins), attrs


_ELEMENTWISE.update(clamp=_clamp, clamp_min=_clamp, clamp_max=_clamp, clip=_clamp)
for _n, _fn in _ELEMENTWISE.items():
    ATEN_OPS[f"aten.{_n}"] = _fn
    ATEN_OPS[f"aten.{_n}_"] = _with(_fn, inplace=True)

_reg("glu")(_op("Glu", axis=A("dim", -1)))
_reg("polar")(_op("Polar", "abs angle"))
_reg("dropout", "native_dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout")(
    lambda c: ("Dropout", [c.t("input")], {"ratio": c.v("p"),
                                           "training_mode": int(bool(c.v("train")))}))


@_reg("_to_copy", "to", "type_as")
def _cast(c: Call) -> MapResult:
    """Cast when the dtype changes; else Copy (``_to_copy``, ``copy=True``) or a no-op alias."""
    to = c.dtype("other") if c.has("other") else c.v("dtype")
    if to is not None and to != c.dtype("self"):
        return "Cast", [c.t("self")], {"to": to}
    attrs = {"device": c.v("device")} if c.v("device") is not None else {}
    if c.packet == "aten._to_copy" or c.v("copy", False):
        return "Copy", [c.t("self")], attrs
    return "Identity", [c.t("self")], {**attrs, "alias": True}


# --- reductions ---------------------------------------------------------------------------------
def _reduce(op: str) -> MapFn:
    def fn(c: Call) -> MapResult:
        attrs: dict[str, Any] = {"axes": _axes(c.v("dim")), "keepdims": int(bool(c.v("keepdim")))}
        if c.v("dtype") is not None:
            attrs["dtype"] = c.v("dtype")
        if op in ("Var", "Std"):  # var.default/var.dim say unbiased, var.correction correction
            corr = c.v("correction")
            attrs["correction"] = corr if corr is not None else int(bool(c.v("unbiased", True)))
        return op, [c.t("self")], attrs
    return fn


for _op_type, _names in {"ReduceMean": ("mean",), "ReduceSum": ("sum",),
                         "ReduceMax": ("amax", "any"), "ReduceMin": ("amin", "all"),
                         "ReduceProd": ("prod",), "ReduceLogSumExp": ("logsumexp",),
                         "Var": ("var", "var_mean"), "Std": ("std", "std_mean")}.items():
    _reg(*_names)(_reduce(_op_type))
_reg("max")(lambda c: (_nary("Max") if c.overload == "other" else _reduce("ReduceMax"))(c))
_reg("min")(lambda c: (_nary("Min") if c.overload == "other" else _reduce("ReduceMin"))(c))
_reg("cumsum")(lambda c: ("CumSum", [c.t("self")], {"axis": c.v("dim"), "axes": [c.v("dim")]}))
_reg("topk")(_op("TopK", k=A("k"), axis=A("dim", -1), largest=A("largest", True)))


@_reg("sort")
def _sort(c: Call) -> MapResult:
    """ONNX has no Sort: a full-length TopK is one (``largest`` = descending)."""
    dim, shape = c.v("dim", -1), c.shape()
    k = shape[dim] if shape is not None and -len(shape) <= dim < len(shape) else None
    return "TopK", [c.t("self")], {"k": k, "axis": dim, "largest": bool(c.v("descending")),
                                   "sorted": True}


# torch.histc: counts into ``bins`` equal bins over [min, max] (the data's range if equal)
_reg("histc")(_op("Histogram", bins=A("bins", 100), min=A("min", 0), max=A("max", 0)))
_reg("argmax", "argmin")(lambda c: ("ArgMax" if c.packet.endswith("max") else "ArgMin",
                                    [c.t("self")], {"axis": c.v("dim"), "axes": _axes(c.v("dim")),
                                                    "keepdims": int(bool(c.v("keepdim")))}))
_reg("linalg_vector_norm", "norm")(lambda c: (
    {1: "ReduceL1", float("inf"): "ReduceMax"}.get(c.v("ord", c.v("p", 2)), "ReduceL2"),
    [c.t("self")], {"axes": _axes(c.v("dim")), "keepdims": int(bool(c.v("keepdim"))),
                    "ord": c.v("ord", c.v("p", 2))}))


# --- pooling ------------------------------------------------------------------------------------
def _pool(op: str) -> MapFn:
    def fn(c: Call) -> MapResult:
        n = _spatial(c)
        k = _ints(c.v("kernel_size"), n)
        attrs: dict[str, Any] = {"kernel_shape": k, "strides": _ints(c.v("stride"), n) or k,
                                 "pads": _ints(c.v("padding", 0), n) * 2,
                                 "ceil_mode": int(bool(c.v("ceil_mode")))}
        if c.has("dilation"):
            attrs["dilations"] = _ints(c.v("dilation", 1), n)
        if c.has("count_include_pad"):
            attrs["count_include_pad"] = int(bool(c.v("count_include_pad")))
        return op, [c.t("self")], attrs
    return fn


def _adaptive(glob: str, op: str) -> MapFn:
    """An adaptive pool to 1x1 is a global pool; any other size keeps its output_size."""
    def fn(c: Call) -> MapResult:
        size = c.v("output_size")
        if size is not None and all(s == 1 for s in size):
            return glob, [c.t("self")], {}
        return op, [c.t("self")], {"output_size": size}
    return fn


for _d in ("1d", "2d", "3d"):
    _reg(f"max_pool{_d}", f"max_pool{_d}_with_indices")(_pool("MaxPool"))
    _reg(f"avg_pool{_d}")(_pool("AveragePool"))
    _reg(f"adaptive_avg_pool{_d}", f"_adaptive_avg_pool{_d}")(
        _adaptive("GlobalAveragePool", "AdaptiveAvgPool"))
    _reg(f"adaptive_max_pool{_d}")(_adaptive("GlobalMaxPool", "AdaptiveMaxPool"))


# --- data movement ------------------------------------------------------------------------------
_reg("cat", "concat", "concatenate")(lambda c: ("Concat", c.ts("tensors"), {"axis": c.v("dim", 0)}))
_reg("stack")(lambda c: ("Concat", c.ts("tensors"), {"axis": c.v("dim", 0), "new_axis": 1}))
_reg("embedding")(_op("Gather", "weight indices", axis=0))
_reg("index_select")(_op("Gather", "self index", axis=A("dim")))
_reg("gather")(_op("GatherElements", "self index", axis=A("dim")))
# contiguous: a copy unless the tensor already is (the cost model assumes the copy)
_reg("clone", "copy", "contiguous")(_op("Copy"))


# fill_ writes every element of ``self`` and reads none: the kernel of full/zeros, in place
@_reg("fill", "fill_")
def _fill(c: Call) -> MapResult:
    attrs: dict[str, Any] = {"value": None if c.t("value") else c.v("value"), "shape": plain(
        c.outputs[0].shape) if c.outputs and c.outputs[0] else c.shape()}
    if c.packet == "aten.fill_":
        attrs.update(inplace=True, dst=c.t("self"))
    return "ConstantOfShape", _trim([c.t("value")]), attrs


_reg("copy_")(lambda c: ("Copy", [c.t("src") or c.t("other")], {"inplace": True,
                                                                 "dst": c.t("self")}))
_reg("repeat")(_op("Tile", repeats=A("repeats")))


@_reg("repeat_interleave")
def _repeat_interleave(c: Call) -> MapResult:
    """Each element (each slice along ``dim``; None: of the flattened input) repeated: a
    ``Tile`` of every element in place (``variant``). The ``Tensor`` overload takes only the
    repeat counts and writes the indices ``0, 0, 1, ...`` they spell."""
    attrs: dict[str, Any] = {"variant": "repeat_interleave", "axis": c.v("dim")}
    if c.overload == "Tensor":
        return "Tile", [c.t("repeats")], attrs
    ins, scalars = _operands(c, ("self", "repeats"))
    if "scalar" in scalars:
        attrs["repeats"] = scalars["scalar"]
    return "Tile", ins, attrs
_reg("roll")(_op("Roll", shifts=A("shifts"), dims=A("dims")))
_reg("flip")(_op("Flip", axes=A("dims")))
_reg("pixel_shuffle")(_op("DepthToSpace", blocksize=A("upscale_factor")))
_reg("pixel_unshuffle")(_op("SpaceToDepth", blocksize=A("downscale_factor")))
_reg("nonzero")(_op("NonZero"))
_reg("one_hot")(_op("OneHot", depth=A("num_classes")))
_reg("arange")(_op("Range", "", start=A("start", 0), end=A("end"), step=A("step", 1)))
_reg("full", "zeros", "ones", "empty", "new_full", "new_zeros", "new_ones", "new_empty",
     "full_like", "zeros_like", "ones_like", "empty_like", "scalar_tensor")(lambda c: (
        "ConstantOfShape", [], {"value": c.v("fill_value", c.v("s")), "shape": plain(
            c.outputs[0].shape) if c.outputs and c.outputs[0] else c.v("size")}))


def _indexed(c: Call) -> tuple[list[str], list[int]]:
    """Index tensors of ``x[i0, None, i2]`` (None entries are untouched dims) and their dims."""
    idx = c.args.get("indices") or []
    pos = [i for i, x in enumerate(idx) if isinstance(x, Ref)]
    return [idx[i].name for i in pos], pos


@_reg("im2col", "col2im")
def _im2col(c: Call) -> MapResult:
    """F.unfold: ``[N, C, H, W] -> [N, C*kh*kw, L]``, a gather of the kernel taps (torch's own
    decomposition is an index op); ``col2im`` (F.fold) sums the taps back: a scatter-add."""
    attrs = {k: c.v(k) for k in ("kernel_size", "dilation", "padding", "stride")}
    if c.packet == "aten.col2im":  # every tap of the input is added once
        return "ScatterElements", [c.t("self")], {**attrs, "variant": "col2im",
                                                  "output_size": c.v("output_size"),
                                                  "reduction": "add", "updates": _numel(c.shape())}
    return "Gather", [c.t("self")], {**attrs, "variant": "im2col"}


@_reg("index", "_unsafe_index")
def _index(c: Call) -> MapResult:
    names, pos = _indexed(c)
    return "Gather", [c.t("self"), *names], {"axis": pos[0] if pos else 0, "index_positions": pos}


@_reg("index_put", "index_put_", "_unsafe_index_put")
def _index_put(c: Call) -> MapResult:
    names, pos = _indexed(c)
    return "ScatterND", [c.t("self"), *names, c.t("values")], {
        "reduction": "add" if c.v("accumulate") else "none", "index_positions": pos}


def _numel(shape: tuple[int | str, ...] | None) -> int | None:
    """Element count of a static shape, else None."""
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    return math.prod(shape)  # type: ignore[arg-type]


def _in_place(c: Call, attrs: dict[str, Any]) -> dict[str, Any]:
    """``op_`` writes into ``self``: ``inplace`` and ``dst``, as ``fill_``/``copy_`` have."""
    return {**attrs, "inplace": True, "dst": c.t("self")} if c.packet.endswith("_") else attrs


@_reg("scatter", "scatter_add", "scatter_reduce", "index_add", "index_copy", "scatter_",
      "scatter_add_", "scatter_reduce_", "index_add_", "index_copy_")
def _scatter(c: Call) -> MapResult:
    """``scatter*`` write one update per element of ``index``; ``index_add``/``index_copy`` one
    per element of ``source`` (whole slices along ``dim``)."""
    upd = next((n for n in ("src", "source", "value") if c.has(n)), "src")
    ins, attrs = _operands(c, ("self", "index", upd))
    base = c.packet.rstrip("_")
    red = c.v("reduce") or ("add" if base in ("aten.scatter_add", "aten.index_add") else "none")
    updates = _numel(c.shape("index" if base.startswith("aten.scatter") else upd))
    return "ScatterElements", ins, _in_place(c, {**attrs, "axis": c.v("dim"), "reduction": red,
                                                 "updates": updates})


@_reg("index_fill", "index_fill_")
def _index_fill(c: Call) -> MapResult:
    """Fills the slices ``index`` picks along ``dim`` with ``value``."""
    ins, attrs = _operands(c, ("self", "index", "value"))
    shape, dim, picked = c.shape(), c.v("dim"), _numel(c.shape("index"))
    whole = _numel(shape)
    per_slice = whole // shape[dim] if whole and isinstance(dim, int) and shape else None
    return "ScatterElements", ins, _in_place(c, {
        **attrs, "axis": dim, "reduction": "none", "variant": "index_fill",
        "updates": per_slice * picked if per_slice is not None and picked is not None else None})


@_reg("select_scatter", "slice_scatter", "diagonal_scatter", "as_strided_scatter")
def _view_scatter(c: Call) -> MapResult:
    """``self`` with the view (a select, a slice, a diagonal) replaced by ``src``: what
    functionalization writes for ``x[:, 0] = y``."""
    attrs = {k: c.v(k) for k in ("dim", "index", "start", "end", "step", "offset", "dim1", "dim2")
             if c.has(k)}
    return "ScatterElements", [c.t("self"), c.t("src")], {
        **attrs, "reduction": "none", "variant": c.packet.removeprefix("aten."),
        "updates": _numel(c.shape("src"))}


@_reg("masked_scatter", "masked_scatter_")
def _masked_scatter(c: Call) -> MapResult:
    """Copies ``source``'s elements, in order, where ``mask`` is true: at most as many as
    either holds."""
    counts = [n for n in (_numel(c.shape()), _numel(c.shape("source"))) if n is not None]
    return "ScatterElements", [c.t("self"), c.t("mask"), c.t("source")], _in_place(c, {
        "reduction": "none", "variant": "masked_scatter",
        "updates": min(counts) if counts else None})


@_reg("pad", "constant_pad_nd", "reflection_pad1d", "reflection_pad2d", "reflection_pad3d",
      "replication_pad1d", "replication_pad2d", "replication_pad3d")
def _pad(c: Call) -> MapResult:
    """torch lists (begin, end) pairs from the last dim backwards; ONNX all begins, all ends."""
    p = c.v("pad", c.v("padding")) or []
    r = c.rank() or len(p) // 2
    begin, end = [0] * r, [0] * r
    for i in range(len(p) // 2):
        begin[r - 1 - i], end[r - 1 - i] = p[2 * i], p[2 * i + 1]
    mode = c.v("mode") or ("reflect" if "reflection" in c.packet
                           else "edge" if "replication" in c.packet else "constant")
    mode = {"replicate": "edge", "circular": "wrap"}.get(mode, mode)
    return "Pad", [c.t("self")], {"pads": begin + end, "mode": mode, "value": c.v("value", 0)}


@_reg("split", "split_with_sizes", "unsafe_split", "unsafe_split_with_sizes", "chunk", "unbind",
      "tensor_split")
def _split(c: Call) -> MapResult:
    """Split outputs are views of the input in torch (alias=True)."""
    attrs: dict[str, Any] = {"axis": c.v("dim", 0), "alias": True}
    size = c.v("split_size", c.v("split_sizes"))
    if size is not None:
        attrs["split" if isinstance(size, list) else "split_size"] = size
    if c.has("chunks") or c.has("sections"):
        attrs["num_outputs"] = c.v("chunks", c.v("sections"))
    if c.packet == "aten.unbind":
        attrs["squeeze"] = 1
    return "Split", [c.t("self")], attrs


@_reg("upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "upsample_linear1d",
      "upsample_bilinear2d", "upsample_bicubic2d", "upsample_trilinear3d",
      "_upsample_nearest_exact1d", "_upsample_nearest_exact2d", "_upsample_nearest_exact3d",
      "_upsample_bilinear2d_aa", "_upsample_bicubic2d_aa")
def _resize(c: Call) -> MapResult:
    mode = "nearest" if "nearest" in c.packet else "cubic" if "bicubic" in c.packet else "linear"
    scales = c.v("scale_factors") or [s for k, s in c.args.items()
                                      if k.startswith("scales") and s is not None] or None
    return "Resize", [c.t("input") or c.t("self")], {
        "mode": mode, "output_size": c.v("output_size"), "scales": scales,
        "align_corners": int(bool(c.v("align_corners")))}


# --- views: torch does these without a copy, so they carry alias=True --------------------------
def _view(op: str, inputs: str = "self", **attrs: Any) -> MapFn:
    return _op(op, inputs, **attrs, alias=True)


def _perm(c: Call, a: Any, b: Any) -> MapResult:
    """Transpose of dims a and b as a full permutation (needs the input rank)."""
    r = c.rank()
    if r is None:
        return "Transpose", [c.t("self")], {"perm": None, "dims": [a, b], "alias": True}
    perm = list(range(r))
    if r:
        perm[a % r], perm[b % r] = perm[b % r], perm[a % r]
    return "Transpose", [c.t("self")], {"perm": perm, "alias": True}


def _reverse_perm(c: Call) -> MapResult:
    """numpy_T reverses all dims; mT/mH/adjoint swap the last two."""
    r = c.rank()
    if c.packet == "aten.numpy_T" or r is None:
        return "Transpose", [c.t("self")], {
            "perm": None if r is None else list(range(r))[::-1], "alias": True}
    return _perm(c, -1, -2)


@_reg("view", "_unsafe_view", "reshape", "_reshape_alias", "view_copy")
def _reshape(c: Call) -> MapResult:
    if c.overload == "dtype":  # view(dtype) reinterprets bits
        return "Alias", [c.t("self")], {"dtype": c.v("dtype"), "alias": True}
    return "Reshape", [c.t("self")], {"shape": c.v("size", c.v("shape")), "alias": True}


_reg("reshape_as", "view_as")(lambda c: ("Reshape", [c.t("self")], {
    "shape": list(c.shape("other")) if c.shape("other") is not None else None, "alias": True}))


@_reg("meshgrid")
def _meshgrid(c: Call) -> MapResult:
    """Each output is a 1-D input viewed and expanded to the grid: views, no copy."""
    return "Expand", c.ts("tensors"), {"variant": "meshgrid", "indexing": c.v("indexing", "ij"),
                                       "alias": True}


_reg("unflatten")(_view("Reshape", dim=A("dim"), sizes=A("sizes")))
_reg("flatten")(_view("Flatten", axis=A("start_dim", 0), start_dim=A("start_dim", 0),
                      end_dim=A("end_dim", -1)))
_reg("squeeze", "squeeze_copy")(lambda c: ("Squeeze", [c.t("self")],
                                           {"axes": _axes(c.v("dim")), "alias": True}))
_reg("unsqueeze", "unsqueeze_copy")(lambda c: ("Unsqueeze", [c.t("self")],
                                               {"axes": [c.v("dim")], "alias": True}))
_reg("permute", "permute_copy")(_view("Transpose", perm=A("dims")))
_reg("transpose", "swapaxes", "swapdims", "transpose_copy")(
    lambda c: _perm(c, c.v("dim0", c.v("axis0")), c.v("dim1", c.v("axis1"))))
_reg("t", "t_copy")(lambda c: _perm(c, 0, -1))  # t() of a 1-D tensor: the identity perm
_reg("numpy_T", "mT", "mH", "adjoint")(_reverse_perm)
_reg("expand", "expand_copy", "broadcast_to")(_view("Expand", shape=A("size")))
_reg("slice", "slice_copy")(lambda c: ("Slice", [c.t("self")], {
    "axes": [c.v("dim", 0)], "starts": [c.v("start", 0)], "ends": [c.v("end", _INT64_MAX)],
    "steps": [c.v("step", 1)], "alias": True}))


@_reg("select", "select_copy", "narrow", "narrow_copy")
def _select(c: Call) -> MapResult:
    """select(dim, i) is Slice [i, i+1) plus squeeze; narrow(dim, s, n) is Slice [s, s+n)."""
    s = c.v("index", c.v("start"))
    n = c.v("length", 1)
    end = (_INT64_MAX if s == -1 and not c.has("length") else s + n) \
        if isinstance(s, int) and isinstance(n, int) else None
    attrs = {"axes": [c.v("dim")], "starts": [s], "ends": [end], "steps": [1], "alias": True}
    if c.has("index"):
        attrs["squeeze"] = 1
    return "Slice", [c.t("self")], attrs


_reg("alias", "detach", "detach_", "lift_fresh_copy", "lift_fresh", "lift", "_conj",
     "resolve_conj", "resolve_neg")(_view("Identity"))
_reg("as_strided", "unfold", "diagonal", "view_as_real", "view_as_complex")(_view("Alias"))
_reg("sym_size", "sym_stride", "sym_storage_offset")(_view("Shape", dim=A("dim")))
_reg("sym_numel")(_view("Size"))
