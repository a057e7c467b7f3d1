"""ONNX Runtime's fusions as a table: which transformers a session's optimizer runs, at which
level, for which execution providers (EPs), from which op, and where each fact was read.

Why a table apart from the matcher (:mod:`.ort_match`): the EP lists and levels change with
ORT's ``graph_transformer_utils.cc``, the patterns with each ``*_fusion.cc``; each is checked
against its own source. The EP lists come from ``onnxruntime/core/optimizer/
graph_transformer_utils.cc`` at commit 001290de2e0ce8429d461156843f7ce9b19e7a5d
(microsoft/onnxruntime).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CONV_ACTS", "CONV_ADD_ACTS", "CPU_ACL_CUDA_DML_ROCM", "CPU_CUDA_DML_ROCM",
           "CPU_CUDA_ROCM", "CPU_EP", "CPU_ONLY", "CPU_ROCM_ACL_ARMNN_JS_WEBGPU", "CUDA_EP",
           "FUSIONS", "GEMM_ACTS", "MAX_STEPS", "NOT_FOLDED", "ROCM_EP", "Fusion"]

CPU_EP = "CPUExecutionProvider"
CUDA_EP = "CUDAExecutionProvider"
ROCM_EP = "ROCMExecutionProvider"
_ACL, _ARMNN, _DML = "ACLExecutionProvider", "ArmNNExecutionProvider", "DmlExecutionProvider"
_JS, _WEBGPU = "JsExecutionProvider", "WebGpuExecutionProvider"

_UTILS = "graph_transformer_utils.cc@001290de2e0c"
# the EP sets graph_transformer_utils.cc names (Level 2 and 3); Level 1 runs on every EP
_ALL_EPS = None
CPU_ONLY = frozenset({CPU_EP})
CPU_CUDA_ROCM = frozenset({CPU_EP, CUDA_EP, ROCM_EP})
CPU_CUDA_DML_ROCM = CPU_CUDA_ROCM | {_DML}
CPU_ACL_CUDA_DML_ROCM = CPU_CUDA_DML_ROCM | {_ACL}
CPU_ROCM_ACL_ARMNN_JS_WEBGPU = frozenset({CPU_EP, ROCM_EP, _ACL, _ARMNN, _JS, _WEBGPU})


# GemmActivationFusion (gemm_activation_fusion.cc @03c7d0a034b3): Gemm + one of these
GEMM_ACTS = ("Elu", "HardSigmoid", "LeakyRelu", "Relu", "Selu", "Sigmoid", "Softplus",
             "Softsign", "Tanh", "ThresholdedRelu", "ScaledTanh", "ParametricSoftplus")
# ConvActivationFusion (conv_activation_fusion.cc @06414ba6e4c5), non-CUDA branch
CONV_ACTS = ("Relu", "Sigmoid", "Tanh", "LeakyRelu", "Clip")
# ConvAddActivationFusion (conv_add_act_fusion.cc @07d59c09d4b9)
CONV_ADD_ACTS = ("Relu", "Sigmoid", "Tanh", "LeakyRelu", "Clip", "HardSigmoid")


@dataclass(frozen=True)
class Fusion:
    """One ORT transformer: its name, the op it makes, its level, its EPs (None: every EP),
    where its EP list was read, and the ops its match starts from (any other unit is skipped
    without a look)."""

    name: str
    fused_op: str
    level: int
    eps: frozenset[str] | None
    source: str
    starts: frozenset[str]


def _from(*ops: str) -> frozenset[str]:
    return frozenset(ops)


_L1 = "Level 1, no EP filter (" + _UTILS + ")"
# In the order GenerateTransformers registers them; the rule-based Level-1 rewrites
# (GenerateRewriteRules) run first.
FUSIONS: tuple[Fusion, ...] = (
    Fusion("ConvAddFusion", "Conv", 1, _ALL_EPS, _L1, _from("Conv")),
    Fusion("ConvMulFusion", "Conv", 1, _ALL_EPS, _L1, _from("Conv")),
    Fusion("ConvBNFusion", "Conv", 1, _ALL_EPS, _L1, _from("Conv")),
    Fusion("MatMulAddFusion", "Gemm", 1, _ALL_EPS, _L1, _from("MatMul")),
    # GeluFusion and LayerNormFusion run at Level 1 only to ONNX's own ops (opset 20 / 17),
    # and at Level 2 to the contrib ops for these EPs
    Fusion("GeluFusion", "Gelu", 2, CPU_ACL_CUDA_DML_ROCM, _UTILS, _from("Div")),
    Fusion("LayerNormFusion", "LayerNormalization", 2, CPU_ACL_CUDA_DML_ROCM, _UTILS,
           _from("ReduceMean")),
    Fusion("GemmActivationFusion", "FusedGemm", 2, CPU_ONLY, _UTILS, _from("Gemm")),
    Fusion("ConvActivationFusion", "FusedConv", 2, CPU_ROCM_ACL_ARMNN_JS_WEBGPU, _UTILS,
           _from("Conv")),
    Fusion("SimplifiedLayerNormFusion", "SimplifiedLayerNormalization", 2, CPU_CUDA_ROCM,
           _UTILS, _from("Pow")),
    Fusion("BiasGeluFusion", "BiasGelu", 2, CPU_ACL_CUDA_DML_ROCM, _UTILS, _from("Add")),
    Fusion("SkipLayerNormFusion", "SkipLayerNormalization", 2, CPU_ACL_CUDA_DML_ROCM, _UTILS,
           _from("LayerNormalization")),
    Fusion("FastGeluFusion", "FastGelu", 2, CPU_CUDA_DML_ROCM, _UTILS, _from("Pow", "Mul")),
    Fusion("QuickGeluFusion", "QuickGelu", 2, CPU_ACL_CUDA_DML_ROCM, _UTILS,
           _from("Mul", "Sigmoid")),
    Fusion("MatMulScaleFusion", "FusedMatMul", 2, CPU_ACL_CUDA_DML_ROCM, _UTILS,
           _from("MatMul", "FusedMatMul")),
    Fusion("ConvAddActivationFusion", "FusedConv", 3, CPU_ONLY, _UTILS, _from("Conv")),
)

# ConstantFolding (constant_folding.cc) leaves these: they must run every time
NOT_FOLDED = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
                        "Multinomial", "Bernoulli", "QuantizeLinear", "DequantizeLinear"})

# SessionOptions::max_num_graph_transformation_steps: ORT's default rounds per level
MAX_STEPS = 10
