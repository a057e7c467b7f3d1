"""INT8 on CPUs: when it pays (VNNI / AMX-INT8 only). The plan (``decisions/gemm_precision.py``)
and the quantize choices (``decisions/quantize_choice.py``) ask this module; the backends
(``backends/torch/quantize.py``, ``backends/onnx/quantize.py``) apply what those decide.

Facts this module rests on (the sources are those of :mod:`graphopt.hardware.cpus`):
  * VNNI ``VPDPBUSD`` does 4 int8 multiply-adds per 32-bit lane in one instruction, 4x the fp32
    FMA rate; AMX-INT8 tiles do 2048 OPs/cycle/core [INTEL-OPT, INTEL-AMX].
  * Without VNNI, AVX2 needs ``VPMADDUBSW`` + ``VPMADDWD`` whose int16 intermediate saturates
    (ONNX Runtime quantization docs: U8S8 on AVX2/AVX-512 without VNNI may saturate, use
    ``reduce_range``); ~2x fp32 on paper, which quantizing the activations on every call eats.
  * [MEASURED] on the development host (a Xeon with AVX512-VNNI, 2 shared cores): torch dynamic
    INT8 ``nn.Linear`` ran 1.4x faster than fp32 at 512x512 (batch 8) and 3-5x at 1024-4096
    wide; ONNX Runtime dynamic INT8 was no faster than fp32 for small MLP/transformer models and
    2.2-2.5x SLOWER for CNNs (``ConvInteger``). So INT8 is proposed for Linear/MatMul nodes
    only, and only when the cost model still sees a gain after the activation-quantization pass.
"""

from __future__ import annotations

from graphopt.hardware.profile import HardwareProfile

__all__ = ["CONV_INT8_MEASURED", "int8_pays_on_cpu"]

_VNNI = ("amx_int8", "avx512_vnni", "avx_vnni")
#: why convolutions never get dynamic INT8 on CPUs [MEASURED]
CONV_INT8_MEASURED = ("dynamic INT8 convolutions were measured 2.2-2.5x slower than fp32 "
                      "(ONNX Runtime ConvInteger)")


def int8_pays_on_cpu(target: HardwareProfile) -> tuple[bool, str]:
    """Whether INT8 GEMMs beat fp32 on a CPU: only with VNNI or AMX-INT8 (module docstring)."""
    if target.is_gpu:
        return False, (f"{target.display_name} is a GPU: INT8 there runs on int8 tensor cores "
                       "(see node_precision), not on CPU dot-product instructions")
    have = [f for f in _VNNI if target.has(f)]
    if have:
        return True, (f"{target.display_name} has {', '.join(have)}: int8 dot products in one "
                      "instruction (VNNI: 4x the fp32 FMA rate; AMX-INT8: 2048 OPs/cycle/core)")
    return False, (f"{target.display_name} has no VNNI/AMX-INT8: AVX2 int8 GEMMs need "
                   "VPMADDUBSW+VPMADDWD (int16 saturation, ~2x fp32 on paper) and dynamic "
                   "quantization of the activations eats that; even on a VNNI host ONNX Runtime "
                   "dynamic INT8 was measured no faster than fp32 for small MLPs/transformers "
                   "and 2.2-2.5x slower for CNNs")

