"""Tiny-C convolutions on tensor cores: each filter tap's channels fill whole K steps.

An implicit-GEMM convolution (cuDNN's IMPLICIT_PRECOMP_GEMM, CUTLASS's conv2d fprop) does not
build the im2col matrix: its K loop walks the filter taps (r, s) and, for each tap, reads that
tap's ``C_in / groups`` input channels as the K slab of one or more main-loop steps. A tap whose
channels do not fill a step is padded (predicated off) to a whole step, so the MMA work is

    K_eff = taps x round_up(C_in / groups, granule)      against      K = taps x C_in / groups

and the tensor cores run at ``K / K_eff`` of their GEMM rate. For 3 input channels and a 7x7
filter that is 147 useful of 1568 computed K elements on Volta: the first-layer conv that runs
at ~7% of the tensor-core rate in DeepBench (V100 8.1 and T4 3.2 TFLOP/s).

The granule (bytes of one channel slab, so 32 fp16 or 64 int8 channels per step):

1. Volta and Turing (cc < 8.0): the CTA's K step, 64 bytes: 32 fp16 channels
   (``ThreadblockShape`` K = 32 of CUTLASS's ``DefaultGemmConfiguration`` for ``Sm70`` and
   ``Sm75`` tensor ops, 64 for int8: NVIDIA/cutlass ``include/cutlass/gemm/device/
   default_gemm_configuration.h`` at 044405ce10e21d44b65ccd40c4fc2bec68789dad). cuDNN 7 has no
   few-channel kernels there.
2. Ampere and later: one 16-byte vector (8 fp16 channels). Their first-layer kernels read tiny
   C as one vector per tap and fold the taps into K (CUTLASS's ``IteratorAlgorithm::
   kFewChannels`` / ``kFixedChannels``, ``include/cutlass/conv/threadblock/
   conv2d_fprop_activation_tile_access_iterator_{few,fixed}_channels.h``), and cuDNN 8 pads
   channels to a vector itself.

A misaligned ``C_in`` is thereby charged as the work of its padding, not as the narrow-load
penalty of a misaligned GEMM (``roofline.UNALIGNED_TC_EFFICIENCY``): the conv libraries pad
channels themselves (NVIDIA "Convolutional Layers User's Guide": cuDNN 7.6.3 and later pad
tensor-core convolutions automatically).
"""

from __future__ import annotations

import math

from graphopt.analysis.kernel_class import KernelClass
from graphopt.analysis.record import NodeAnalysis
from graphopt.hardware.profile import HardwareProfile

__all__ = ["granule_bytes", "tap_efficiency"]

_VOLTA_TURING_STEP_BYTES = 64  # case 1: 32 fp16 channels per CTA K step (CUTLASS Sm70/Sm75)
_VECTOR_BYTES = 16  # case 2: one 16-byte access per tap


def granule_bytes(profile: HardwareProfile) -> int:
    """Bytes of input channels one filter tap occupies at least in the K loop (cases 1-2)."""
    cc = profile.compute_capability or (8, 0)
    return _VOLTA_TURING_STEP_BYTES if cc < (8, 0) else _VECTOR_BYTES


def tap_efficiency(a: NodeAnalysis, profile: HardwareProfile, elem_bits: int
                   ) -> tuple[float, str]:
    """(useful / computed K of conv ``a`` on tensor cores, why); 1.0 for other nodes."""
    if a.kernel_class is not KernelClass.CONV or not profile.is_gpu:
        return 1.0, ""
    d = a.dims
    per_group = max(1, d.get("C_in", 1) // max(1, d.get("groups", 1)))
    granule = max(1, granule_bytes(profile) * 8 // elem_bits)
    padded = math.ceil(per_group / granule) * granule
    if padded == per_group:
        return 1.0, ""
    eff = per_group / padded
    return eff, (f"{per_group} input channels per filter tap fill {per_group} of {padded} "
                 f"K elements of each implicit-GEMM step: {eff:.2f} of the tensor-core rate")
