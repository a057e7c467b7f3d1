"""The canonical op vocabulary that both frontends map into.

Names are ONNX operator names (https://onnx.ai/onnx/operators/) with ONNX input order and
attribute names, so an ONNX model needs almost no translation and a torch graph is described in
the same terms. A few ops ONNX lacks (or that torch keeps whole) are added: ``Linear``, ``Silu``,
``Rsqrt``, ``Attention`` (ONNX opset 23 has one; ours is SDPA-shaped), ``RMSNormalization``,
``Histogram`` (torch ``histc``: attrs ``bins``, ``min``, ``max``), ``Glu`` (torch ``glu``: the
first half of ``axis`` times the sigmoid of the second) and ``Polar`` (torch ``polar(abs, angle)``,
a complex result).

Conventions the analysis relies on (a frontend must produce exactly these):

* ``Linear(X[..., K], W[N, K], B?[N])`` — torch ``nn.Linear``.
* ``Gemm(A, B, C?)`` attrs ``transA``, ``transB`` (0/1), ``alpha``, ``beta`` — ONNX Gemm and
  torch ``addmm(C, A, B)`` (re-ordered to A, B, C).
* ``MatMul(A, B)`` — numpy matmul semantics (``mm``, ``bmm``, ``matmul``).
* ``Conv(X[N, C, *spatial], W[Cout, Cin/group, *k], B?)`` attrs ``group``, ``strides``,
  ``pads`` (ONNX begin..., end...), ``dilations``, ``kernel_shape``.
* ``ConvTranspose(X, W[Cin, Cout/group, *k], B?)`` same attrs plus ``output_padding``.
* ``Attention(Q[B, H, Sq, D], K[B, H, Skv, D], V[B, H, Skv, Dv], mask?)`` attrs ``scale``
  (float or None = 1/sqrt(D)), ``is_causal`` — torch ``scaled_dot_product_attention``.
* ``Softmax``/``LogSoftmax`` attr ``axis``; ``LayerNormalization(X, scale?, bias?)`` and
  ``RMSNormalization(X, scale?)`` attrs ``axis`` (first normalized axis), ``epsilon``;
  ``BatchNormalization(X, scale, B, mean, var)`` attr ``training_mode``;
  ``GroupNormalization(X, scale, bias)`` attr ``num_groups``.
* ``Reduce*`` attrs ``axes`` (list, None = all) and ``keepdims``.
* ``Transpose`` attr ``perm``; ``Concat``/``Gather``/``Split`` attr ``axis``.
* ``alias=True`` on a data-movement or view op means the source runtime does it without a copy
  (torch ``view``, ``permute``, ``expand``, ``slice``): the analysis then classes it as a view.
* A scalar operand folded by torch (``x * 0.5``, ``x.pow(2)``) is ``attrs["scalar"]`` with
  ``attrs["scalar_position"]`` (0 or 1) so ``rsub``/``pow.Scalar`` stay unambiguous.
* ``MatMul`` may carry extra inputs after A and B (the ``baddbmm`` addend with
  ``bias_add=True``, ``_scaled_mm`` scales): dims come from inputs 0 and 1 only.
  ``grouped=True``: a mixture-of-experts grouped GEMM ``MatMul(A[S, K], B[G, K, N], offs[G])``,
  each row multiplied by one group's matrix (torch ``_grouped_mm``).
* ``Attention`` from torch is SDPA-shaped; ``layout="BSHD"`` marks flash/efficient variants
  whose Q/K/V are ``[B, S, H, D]``. ONNX's opset-23 ``Attention`` may be 3-D with
  ``q_num_heads``; ``com.microsoft::Attention`` takes packed input with ``num_heads``.
* Weights of torch ``MatMulNBits``/``DynamicQuantizeMatMul`` are ``[N, K]`` (ORT's are
  ``[K, N]``): read the ``K``/``N`` attrs.
* ``Einsum`` attr ``equation`` (ONNX and torch spell it alike): a GEMM when its operands share a
  summed index, else elementwise, a reduction or a view (:mod:`graphopt.analysis.einsum`).
* ``LSTM``/``GRU``/``RNN`` are ONNX's (``X``, ``W[dirs, G*H, I]``, ``R[dirs, G*H, H]``, ``B``...,
  attrs ``hidden_size``, ``direction``, ``layout``): the GEMM sequence of the recurrence
  (:mod:`graphopt.analysis.recurrent`).
* ``If``/``Loop``/``Scan`` from ONNX carry their bodies as graphs: ``attrs["bodies"]`` is a tuple
  of ``(attribute name, Graph)`` (``If``: then, else), ``attrs["trip_count"]`` the iterations
  when a constant or a static shape gives them (``If``: 1; None: unknown).
* Scatters (``ScatterElements``, ``ScatterND``) write ``attrs["updates"]`` elements when the
  frontend knows the count (else their updates input's); ``inplace=True`` with ``dst``: the op
  writes into ``dst`` (torch ``scatter_``), moving only the updated elements.
* Quantized ops keep their ONNX names (``MatMulInteger``, ``QLinearMatMul``, ``MatMulNBits``,
  ``QuantizeLinear``, ``DequantizeLinear``, ``ConvInteger``, ``QLinearConv``).

An op a frontend cannot map keeps its source name as ``op_type``; the analysis classes it
``other`` and the plan lists it.
"""

from __future__ import annotations

__all__ = [
    "ATTENTION_OPS",
    "BINARY_ELEMENTWISE",
    "CONTROL_FLOW_OPS",
    "CONV_OPS",
    "DATA_MOVEMENT",
    "EINSUM_OPS",
    "GEMM_OPS",
    "NORM_OPS",
    "POOL_OPS",
    "QUANT_GEMM_OPS",
    "REDUCE_OPS",
    "RNN_OPS",
    "ROPE_OPS",
    "SOFTMAX_OPS",
    "UNARY_ELEMENTWISE",
    "VIEW_OPS",
    "KNOWN_OPS",
]

GEMM_OPS = frozenset({"Linear", "Gemm", "MatMul"})
QUANT_GEMM_OPS = frozenset({"MatMulInteger", "QLinearMatMul", "MatMulNBits",
                            "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QGemm"})
CONV_OPS = frozenset({"Conv", "ConvTranspose", "ConvInteger", "QLinearConv"})
NORM_OPS = frozenset({"LayerNormalization", "RMSNormalization", "BatchNormalization",
                      "GroupNormalization", "InstanceNormalization", "SkipLayerNormalization",
                      "SkipSimplifiedLayerNormalization", "LpNormalization"})
UNARY_ELEMENTWISE = frozenset({
    "Relu", "Gelu", "FastGelu", "Sigmoid", "HardSigmoid", "Tanh", "Exp", "Log", "Sqrt", "Rsqrt",
    "Reciprocal", "Neg", "Abs", "Erf", "Sin", "Cos", "Silu", "HardSwish", "LeakyRelu", "Elu",
    "Selu", "Celu", "Softplus", "Softsign", "Mish", "Clip", "Cast", "Dropout", "Not", "Floor",
    "Ceil", "Round", "Sign", "IsNaN", "IsInf", "PRelu", "ThresholdedRelu", "QuantizeLinear",
    "DequantizeLinear", "DynamicQuantizeLinear", "Trilu", "Bernoulli", "CastLike", "Glu",
})
BINARY_ELEMENTWISE = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Mean", "Sum", "Where", "Equal", "Less",
    "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor", "Mod", "BitShift",
    "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BiasGelu", "BiasAdd", "Polar",
})
SOFTMAX_OPS = frozenset({"Softmax", "LogSoftmax"})
REDUCE_OPS = frozenset({
    "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
    "ReduceLogSumExp", "ReduceSumSquare", "ArgMax", "ArgMin", "CumSum", "TopK", "Var", "Std",
    "Histogram",
})
POOL_OPS = frozenset({"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool",
                      "LpPool", "AdaptiveAvgPool", "AdaptiveMaxPool"})
DATA_MOVEMENT = frozenset({
    "Transpose", "Concat", "Gather", "GatherElements", "GatherND", "ScatterND", "ScatterElements",
    "Pad", "Slice", "Split", "Tile", "Expand", "Copy", "Resize", "Upsample", "DepthToSpace",
    "SpaceToDepth", "Embedding", "IndexSelect", "NonZero", "OneHot", "Range", "ConstantOfShape",
    "Roll", "Flip",
})
VIEW_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Shape", "Size",
                      "Constant", "Alias"})
ATTENTION_OPS = frozenset({"Attention", "MultiHeadAttention", "GroupQueryAttention"})
ROPE_OPS = frozenset({"RotaryEmbedding"})
EINSUM_OPS = frozenset({"Einsum"})
RNN_OPS = frozenset({"LSTM", "GRU", "RNN"})
CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan"})

KNOWN_OPS = (GEMM_OPS | QUANT_GEMM_OPS | CONV_OPS | NORM_OPS | UNARY_ELEMENTWISE
             | BINARY_ELEMENTWISE | SOFTMAX_OPS | REDUCE_OPS | POOL_OPS | DATA_MOVEMENT | VIEW_OPS
             | ATTENTION_OPS | ROPE_OPS | EINSUM_OPS | RNN_OPS | CONTROL_FLOW_OPS)
