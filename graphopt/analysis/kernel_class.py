"""The kernel taxonomy: what kind of kernel a node becomes, which decides how it is costed."""

from __future__ import annotations

from enum import Enum

__all__ = ["GEMM_LIKE", "KernelClass"]


class KernelClass(str, Enum):
    """Kernel classes: the first ten are autoopt's taxonomy, the rest what real graphs need."""

    GEMM = "gemm"
    GEMV = "gemv"  # matrix-vector: M == 1 or N == 1 (decode-time Linear)
    ATTENTION = "attention"  # fused SDPA or the decomposed matmul -> softmax -> matmul chain
    RMSNORM = "rmsnorm"
    SOFTMAX = "softmax"
    ROPE = "rope"
    SILU = "silu"  # x * sigmoid(x) and SwiGLU
    ELEMENTWISE = "elementwise"
    QUANT_GEMM = "quant_gemm"
    QUANT_DOT = "quant_dot"  # quantized matrix-vector product
    CONV = "conv"
    NORM = "norm"  # layer / batch / group / instance norm
    REDUCTION = "reduction"  # reductions and pooling
    DATA_MOVEMENT = "data_movement"  # transpose, concat, gather, pad, copy
    VIEW = "view"  # free: reshapes and aliases, no kernel
    CONTROL_FLOW = "control_flow"  # ONNX If/Loop/Scan: the kernels of a body it runs
    OTHER = "other"

    def __str__(self) -> str:
        return self.value


#: classes whose cost is dominated by a matrix-multiply unit (tensor cores, AMX, FMA GEMM kernels)
GEMM_LIKE = frozenset({KernelClass.GEMM, KernelClass.GEMV, KernelClass.CONV, KernelClass.ATTENTION,
                       KernelClass.QUANT_GEMM, KernelClass.QUANT_DOT})
