"""What an INT8 GEMM or convolution costs on a CPU, as the kernels that run it do the work.

torch's ``quantized::linear_dynamic`` (FBGEMM / oneDNN) and ONNX Runtime's dynamic INT8
(DynamicQuantizeLinear + MatMulInteger) or static QDQ (QLinearMatMul, QLinearConv) all do the
same three pieces of work per call, each costed on the target here:

    t_int8 = t_gemm + t_quantize + t_casts + t_fixed

1. ``t_gemm``: the integer GEMM at the CPU's int8 rate (:func:`graphopt.cost.roofline.estimate`
   at ``"int8"``: the profile's measured ``matrix:int8`` when ``graphopt calibrate`` measured
   one, else the peak of its int8 path (``hardware.cpus.INT8_PATHS``: AMX-INT8, VNNI, AVX2
   u8s8) times the CPU matrix efficiency). It reads int8 weights and uint8 activations and
   writes the dequantized fp32 output once: the epilogue rescales the int32 accumulators by
   ``s_x * s_w`` and adds the bias in registers.
2. ``t_quantize``: the activations are quantized on every call, a memory-bound pass at the
   profile's bandwidth: ``dynamic`` reads the fp32 activations twice (their range, then the
   rounding) and writes uint8; ``static`` (the scale was calibrated) reads them once, and its
   uint8 output is dequantized by a DequantizeLinear of its own (read 1, write 4 bytes per
   value): in ONNX Runtime's QDQ graph a ``QLinearConv`` requantizes its output, and the
   float op after it (a ReLU, an Add: graphopt quantizes the convs only) reads it back.
3. ``t_casts``: where the baseline keeps activations in 16 bits (a bf16 model), the INT8
   kernels still take and give fp32: the input is widened (read 2, write 4 bytes per value)
   and the output narrowed (read 4, write 2).
4. ``t_fixed``: the GEMM's own fixed cost plus one runtime op's fixed cost
   (``launch_overhead_s``, measured when calibrated) per extra pass: two for the dynamic
   quantization (range, rounding), two for the static (quantize, dequantize), one per cast.
5. Convolutions only, ``t_gemm`` over ``depth = K / (K + CONV_DEPTH_K0)``, ``K`` = input
   channels per group x kernel area, the dot products' length. [MEASURED] On both int8 paths
   the int8/fp32 speed-up of a conv falls with K where the roofline's does not:
   ``benchmarks/bench_cpu_int8.py --part conv`` (ONNX Runtime 1.31, QLinearConv against fp32
   Conv, ResNet-50's convs, batch 1 and 8): on an AVX2-only AMD EPYC (1 thread) 1.13-1.14x at
   K=64 (1x1 64->256 at 56x56), 1.25-2.06x at K=128, 1.62-1.69x at K=256, 1.7-2.5x at K>=512,
   against a 1.9-2.0x roofline; on Zen 4 (AVX512-VNNI) the K=64 convs gained least too
   (1.7-1.9x against 3.4-4.0x). ``K0 = 48`` fits the AVX2 row (K=64: 0.57 of the roofline's
   speed-up, K=128: 0.73, K=256: 0.84, K=576: 0.92). Mobile networks' pointwise convs
   (K = 16-96 input channels) are where it decides: whole PP-OCR models with every dense conv
   static INT8 ran 0.64-1.06x ORT fp32's speed (``benchmarks/bench_conv_int8.py``).

A calibrated ``matrix:int8`` times ``linear_dynamic`` on 1024 x 1024 operands, its own
activation quantization included (about 3% of that call): charged again in ``t_quantize``, on
the safe side.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Literal

from graphopt.analysis.kernel_class import KernelClass
from graphopt.analysis.record import NodeAnalysis
from graphopt.cost.calibrated import measured_bandwidth, measured_matrix_rate
from graphopt.cost.roofline import efficiency, estimate
from graphopt.hardware.cpus import int8_path
from graphopt.hardware.profile import HardwareProfile

__all__ = ["CONV_DEPTH_K0", "Int8Cost", "Method", "conv_depth", "cpu_int8_cost", "int8_rate"]

Method = Literal["dynamic", "static"]

#: full passes over the fp32 activations the quantization makes (module docstring, case 2)
_QUANT_READS = {"dynamic": 2, "static": 1}
#: runtime ops the quantization adds (case 4): static = QuantizeLinear + DequantizeLinear
_QUANT_OPS = {"dynamic": 2, "static": 2}
#: case 5: the dot-product length at which an int8 conv reaches half its roofline speed-up
#: [MEASURED] (module docstring)
CONV_DEPTH_K0 = 48


@dataclass(frozen=True)
class Int8Cost:
    """A CPU INT8 node's predicted time and its parts (seconds), with the rate used."""

    total_s: float
    gemm_s: float
    quantize_s: float
    casts_s: float
    fixed_s: float  # the extra fixed cost only; the GEMM's own is in gemm_s
    rate: float  # int8 OP/s the GEMM was costed at
    rate_source: str
    path: str
    method: Method
    depth: float = 1.0  # case 5: the share of the int8 rate a conv of this depth reaches

    @property
    def overhead_s(self) -> float:
        """What the int8 GEMM pays beyond its own work: quantizing, casting, extra ops."""
        return self.quantize_s + self.casts_s + self.fixed_s

    def describe(self) -> str:
        casts = f" + casts {self.casts_s * 1e6:.2f}" if self.casts_s else ""
        depth = (f" x {self.depth:.2f} for its depth (measured: int8 convs gain less at small "
                 "K)") if self.depth < 1 else ""
        return (f"{self.total_s * 1e6:.2f} us = GEMM {self.gemm_s * 1e6:.2f} (at "
                f"{self.rate / 1e9:.0f} GOP/s, {self.rate_source}{depth}) + quantizing activations "
                f"{self.quantize_s * 1e6:.2f} ({self.method}){casts} + extra ops "
                f"{self.fixed_s * 1e6:.2f}")

    def to_dict(self) -> dict[str, Any]:
        return {"total_s": self.total_s, "gemm_s": self.gemm_s, "quantize_s": self.quantize_s,
                "casts_s": self.casts_s, "fixed_s": self.fixed_s, "rate": self.rate,
                "rate_source": self.rate_source, "path": self.path, "method": self.method,
                "depth": self.depth}


def int8_rate(a: NodeAnalysis, target: HardwareProfile) -> tuple[float, str]:
    """(achievable int8 OP/s, where it comes from) for ``a`` on CPU ``target``."""
    measured = measured_matrix_rate(a, target, "int8")
    if measured is not None:
        return measured, "measured by graphopt calibrate"
    path = int8_path(target.capabilities)
    eff = efficiency("cpu", "matrix")
    name = path.instructions if path is not None else "no int8 path"
    return target.peak_flops.get("int8", 0.0) * eff, \
        f"{name}: peak {target.peak_flops.get('int8', 0.0) / 1e9:.0f} x {eff:.2f}"


def conv_depth(a: NodeAnalysis) -> float:
    """Case 5: the share of its roofline speed-up an int8 conv of this depth reaches (1 for
    other kernels)."""
    if a.kernel_class is not KernelClass.CONV:
        return 1.0
    k = max(int(a.dims.get("K", 0) or 0), 1)
    return k / (k + CONV_DEPTH_K0)


def cpu_int8_cost(a: NodeAnalysis, target: HardwareProfile, *, weight_bytes: int,
                  weight_bits: float, act_bits: float, carrier_bits: float,
                  method: Method = "dynamic") -> Int8Cost:
    """Cases 1-4 for node ``a`` as traced (weights ``weight_bytes`` at ``weight_bits``,
    activations at ``act_bits``), whose baseline runs activations at ``carrier_bits``."""
    act_in = max(0, a.bytes_read - weight_bytes)  # activations (and bias) as traced
    a32, c32 = act_in * 32 / act_bits, a.bytes_written * 32 / act_bits
    int8 = replace(a, bytes_read=math.ceil(act_in * 8 / act_bits
                                           + weight_bytes * 8 / weight_bits),
                   bytes_written=math.ceil(c32), dtype="int8")
    rate, source = int8_rate(a, target)
    depth = conv_depth(a)
    gemm = estimate(int8, target, "int8").est_time_s / depth
    bw = measured_bandwidth(target) or target.bandwidth_bytes_per_s * efficiency("cpu", "memory")
    quantize = (_QUANT_READS[method] * a32 + a32 / 4) / bw
    if method == "static":  # the output's DequantizeLinear (case 2)
        quantize += (c32 / 4 + c32) / bw
    ops = _QUANT_OPS[method]
    casts = 0.0
    if carrier_bits < 32:
        narrow = carrier_bits / 32
        casts = (a32 * narrow + a32 + c32 + c32 * narrow) / bw
        ops += 2
    fixed = ops * target.launch_overhead_s
    path = int8_path(target.capabilities)
    return Int8Cost(gemm + quantize + casts + fixed, gemm, quantize, casts, fixed, rate, source,
                    path.name if path is not None else "none", method, depth)
