"""A node's roofline at another precision: its weights and activations re-sized.

The per-node precision rules (:mod:`graphopt.decisions.precision.gemm` cases 1-4 and
:mod:`graphopt.decisions.precision.gpu_formats` case 3) compare a GEMM's time at the carrier with
its time at a low-precision format, and the LLM plan (:mod:`graphopt.api.llm_formats`) costs its
weight GEMMs at the format they run at; both cost through this module, so a format costs the same in
the precision decision and in the LLM section.

1. A node's weights are its rank >= 2 params and constants: the matrices a low-precision format
   quantizes (a bias or a norm's scale stays as it is). Their bytes are counted as traced. A
   weight GEMM is a GEMM-like node other than attention with weights: the nodes the precision
   rules may quantize, and those the LLM plan costs at a format.
2. At a precision: the weight bytes re-sized from their traced width ``weight_bits`` to
   ``bits_per_weight`` (the format's bits per weight, its scales included), the other bytes
   read and the bytes written (activations) from the node's dtype to ``act_bits``, and the
   roofline taken at ``dtype``, the dtype the GEMM computes in (its peak).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace

from graphopt.analysis.kernel_class import GEMM_LIKE, KernelClass
from graphopt.analysis.record import NodeAnalysis
from graphopt.cost.roofline import NodeCost, estimate
from graphopt.hardware.profile import HardwareProfile
from graphopt.ir.graph import DTYPE_BITS, TensorInfo
from graphopt.ir.plan import NodePlan

__all__ = ["cost_at_format", "is_weight_gemm", "node_weights", "weight_tensors"]


def weight_tensors(inputs: Iterable[TensorInfo | None]) -> list[TensorInfo]:
    """A node's weight matrices among its ``inputs`` (case 1)."""
    return [t for t in inputs
            if t is not None and t.kind in ("param", "constant") and len(t.shape or ()) >= 2]


def node_weights(node: NodePlan | NodeAnalysis
                 ) -> tuple[NodeAnalysis, int, str | None, str | None]:
    """(analysis, weight bytes as traced, weight dtype, op_type) of a plan node (case 1), or
    of a bare analysis (its ``param_count`` at its dtype; no op_type); no weight: 0 bytes."""
    if isinstance(node, NodePlan):
        ws = weight_tensors(node.inputs)
        dtype = ws[0].dtype if ws else None
        return node.analysis, sum(t.nbytes for t in ws), dtype, node.op_type
    a = node
    return a, math.ceil(a.param_count * DTYPE_BITS.get(a.dtype or "fp32", 32) / 8), a.dtype, None


def is_weight_gemm(node: NodePlan) -> bool:
    """Whether ``node`` is a weight GEMM (case 1)."""
    kc = node.analysis.kernel_class
    return kc in GEMM_LIKE and kc is not KernelClass.ATTENTION and node_weights(node)[1] > 0


def cost_at_format(a: NodeAnalysis, target: HardwareProfile, weight_bytes: int,
                   weight_bits: float, *, bits_per_weight: float, act_bits: float, dtype: str
                   ) -> NodeCost:
    """Case 2: ``a``'s roofline on ``target`` with its ``weight_bytes`` of weights (traced at
    ``weight_bits``) at ``bits_per_weight``, its activations at ``act_bits``, computing at
    ``dtype``."""
    act_read = max(0, a.bytes_read - weight_bytes)
    act_scale = act_bits / DTYPE_BITS.get(a.dtype or "fp32", 32)
    scaled = replace(a, bytes_read=math.ceil(act_read * act_scale
                                             + weight_bytes * (bits_per_weight / weight_bits)),
                     bytes_written=math.ceil(a.bytes_written * act_scale), dtype=dtype)
    return estimate(scaled, target, dtype)
