"""INT8 on CPUs, decided per node by cost: legality (:func:`can_int8_on_cpu`) apart from
profitability (:func:`should_int8_on_cpu`). The plan (``decisions/precision/gemm.py``) and the
quantize choices (``decisions/quantization/choice.py``) ask this module; the backends
(``backends/torch/quantize.py``, ``backends/onnx/quantize.py``) apply what those decide.

1. Legal: a CPU with an int8 GEMM path (``hardware.cpus.INT8_PATHS``: AMX-INT8, AVX512-VNNI,
   AVX-VNNI, AVX2 u8s8, Arm SDOT) and a GEMM, GEMV or dense convolution node. No ISA flag
   rules INT8 out beyond having a path at all. Grouped and depthwise convolutions stay float
   (:data:`GROUPED_CONV_INT8_MEASURED`): the dot-product instructions sum over input
   channels, which a depthwise conv does not have, and its QLinearConv measured no faster.
2. Profitable: the INT8 cost (:mod:`graphopt.cost.cpu_int8_cost`: the int8 GEMM + quantizing
   the activations per call + casts + extra ops) is at least ``MIN_GAIN`` below the node's
   cost at its baseline (fp32, or bf16 where the target computes bf16 natively: INT8 competes
   with the fastest format the node would otherwise run at, and pays the casts a bf16 model
   needs around fp32-input kernels). Small GEMMs stay at the baseline: the quantization's
   memory pass and fixed cost eat what the int8 GEMM saves. ``MIN_GAIN`` = 10%: about the
   uncertainty of the roofline's efficiency factors.
3. The method: GEMMs are costed as dynamic INT8 (what both backends run without calibration
   data; static QDQ reads the activations once less, so a node that pays dynamically pays
   statically too). Convolutions are costed as static QDQ, the only INT8 conv that pays:
   :data:`CONV_INT8_MEASURED`.

[MEASURED] ``benchmarks/bench_cpu_int8.py`` on a 2-core AMD EPYC (Zen 4: AVX512-VNNI,
AVX512-BF16), ONNX Runtime 1.31 and torch 2.13, 1 thread (the second core was shared with other
jobs: 2-thread A/A controls drifted 0.7-1.8x), ResNet-50's 3x3 and 1x1 convs and bottlenecks at
56x56/64 to 7x7/512, batch 1 and 8 (RESULTS.md, "CPU INT8 by cost"): ORT's dynamic
``ConvInteger`` ran 0.20-0.37x the fp32 ``Conv``'s speed (2.7-5x SLOWER: no fused kernel, the
input is quantized and unpacked per call), static QDQ ``QLinearConv`` 1.7-4.0x FASTER
(predicted 3.4-4.0x; the 1x1 convs at 56x56 gain least, 1.7-1.9x). On depthwise convs
(ConvNeXt's 7x7, MobileNetV2's 3x3) QLinearConv ran 0.65-1.18x and ConvInteger 0.03-0.11x,
where the cost model, which knows no depthwise int8 kernel, predicted 0.8-2.4x: hence the
legality rule of case 1. GEMMs there: torch ``linear_dynamic`` and ORT dynamic INT8 3.0-4.8x
faster than fp32 from 32x512x512 up (predicted 3.4-4.0x), 0.30x (torch) and 0.93x (ORT) at
8x64x64 (predicted 0.51x: it stays fp32); against torch bf16, INT8 with its casts 1.5-4.6x
(predicted 1.5-2.0x). The issue's measurement on an AVX2-only EPYC (2 threads): ORT
``quantize_dynamic`` 1.77x (BERT-base) and 1.95x (Llama) faster than fp32, torch FBGEMM
dynamic 1.74x (BERT): INT8 pays without VNNI where the GEMMs are large.

[MEASURED] Without VNNI (issue 34, item 2): ``benchmarks/bench_cpu_int8.py --part conv
--threads 1`` on a 2-vCPU AMD EPYC with AVX2 + FMA only (ONNX Runtime 1.31, a machine shared
with other jobs, A/A 0.6-1.8x): static ``QLinearConv`` 1.7-2.5x faster than fp32 on ResNet-50's
3x3 convs, 1.1-1.3x on its 1x1 convs at 56x56 and 28x28 (batch 1) and 1.6-2.3x at 14x14 and
7x7 (predicted 1.9-2.0x: the AVX2 u8s8 path's 2x fp32 peak), bottlenecks 0.86-3.75x; depthwise
0.61-1.25x (predicted 0.8-1.5x), so the legality rule of case 1 holds there too; ConvInteger
0.13-0.38x. Whole models (``benchmarks/bench_conv_int8.py``, 2 threads, QDQ of the dense convs
as graphopt's pass writes them): ``examples/resnet_like.py`` 1.4-1.9x faster than ORT fp32 in
ORT (every conv a ``QLinearConv``), and OpenVINO runs the same QDQ file in INT8 (every conv).
"""

from __future__ import annotations

from dataclasses import dataclass

from graphopt.analysis.kernel_class import KernelClass
from graphopt.analysis.record import NodeAnalysis
from graphopt.cost.cpu_int8_cost import Int8Cost, Method, cpu_int8_cost
from graphopt.hardware.cpus import int8_path
from graphopt.hardware.profile import HardwareProfile
from graphopt.ir.legality import Legality

__all__ = ["CONV_INT8_MEASURED", "GROUPED_CONV_INT8_MEASURED", "MIN_GAIN", "Int8Verdict",
           "can_int8_on_cpu", "cpu_int8_method", "int8_pays_on_cpu", "should_int8_on_cpu"]

MIN_GAIN = 0.10  # case 2
#: why convolutions never get dynamic INT8 on CPUs, and static QDQ convs are costed [MEASURED]
CONV_INT8_MEASURED = ("dynamic INT8 convolutions (ONNX Runtime ConvInteger) measured 2.7-5x "
                      "slower than fp32 at ResNet-50 sizes (2.6-7.7x on AVX2 without VNNI), "
                      "static QDQ (QLinearConv) 1.7-4.0x faster (1.1-2.5x on AVX2) "
                      "(benchmarks/bench_cpu_int8.py)")
#: why grouped and depthwise convolutions stay float on CPUs [MEASURED]
GROUPED_CONV_INT8_MEASURED = ("a grouped/depthwise conv has few input channels per group for the "
                              "int8 dot products to sum over; measured: static QLinearConv "
                              "0.65-1.18x (0.61-1.25x on AVX2), dynamic ConvInteger 0.03-0.11x "
                              "the fp32 speed on depthwise convs (benchmarks/bench_cpu_int8.py)")
_CLASSES = frozenset({KernelClass.GEMM, KernelClass.GEMV, KernelClass.CONV})


def int8_pays_on_cpu(target: HardwareProfile) -> tuple[bool, str]:
    """Whether INT8 GEMMs can beat the target's baseline at all: it has an int8 path whose rate
    exceeds its fp32 (and native bf16) rate. Which nodes gain is :func:`should_int8_on_cpu`'s."""
    if target.is_gpu:
        return False, (f"{target.display_name} is a GPU: INT8 there runs on int8 tensor cores "
                       "(see node_precision), not on CPU dot-product instructions")
    path = int8_path(target.capabilities)
    if path is None:
        return False, (f"{target.display_name} has no int8 GEMM path (AMX-INT8, VNNI, AVX2 "
                       "u8s8 or Arm SDOT): int8 would run no faster than fp32")
    best = max(target.peak_flops.get(k, 0.0) for k in ("fp32", "bf16"))
    ratio = target.peak_flops.get("int8", 0.0) / max(best, 1.0)
    return ratio > 1.0, (f"{target.display_name} runs int8 GEMMs with {path.instructions} at "
                         f"{ratio:.1f}x its fastest float peak; per node, INT8 is chosen where "
                         "the cost of quantizing the activations leaves a gain")


def can_int8_on_cpu(a: NodeAnalysis, target: HardwareProfile) -> Legality:
    """Case 1: may INT8 run node ``a`` on CPU ``target``."""
    if target.is_gpu:
        return Legality.no(f"{target.display_name} is a GPU")
    if int8_path(target.capabilities) is None or "int8" not in target.peak_flops:
        return Legality.no(int8_pays_on_cpu(target)[1])
    if a.kernel_class not in _CLASSES:
        return Legality.no(f"{a.kernel_class.value}: no CPU INT8 kernel for it")
    if a.kernel_class is KernelClass.CONV and a.dims.get("groups", 1) > 1:
        return Legality.no(GROUPED_CONV_INT8_MEASURED)
    return Legality.OK


def cpu_int8_method(a: NodeAnalysis) -> Method:
    """Case 3: the INT8 method a node is costed (and, for convs, run) with."""
    return "static" if a.kernel_class is KernelClass.CONV else "dynamic"


@dataclass(frozen=True)
class Int8Verdict:
    """Case 2's answer for one node: INT8's cost against the baseline's, and the reason."""

    pays: bool
    cost: Int8Cost
    base: str
    base_s: float
    reason: str

    @property
    def gain(self) -> float:
        return 1 - self.cost.total_s / self.base_s if self.base_s > 0 else 0.0


def should_int8_on_cpu(a: NodeAnalysis, target: HardwareProfile, *, base: str, base_s: float,
                       weight_bytes: int, weight_bits: float, act_bits: float,
                       base_bits: float) -> Int8Verdict:
    """Case 2: INT8 for ``a`` against ``base`` (its baseline format, ``base_s`` seconds there,
    activations at ``base_bits``); the weights as traced are ``weight_bytes`` at
    ``weight_bits``, the activations at ``act_bits``. Legality first: :func:`can_int8_on_cpu`."""
    method = cpu_int8_method(a)
    cost = cpu_int8_cost(a, target, weight_bytes=weight_bytes, weight_bits=weight_bits,
                         act_bits=act_bits, carrier_bits=base_bits, method=method)
    gain = 1 - cost.total_s / base_s if base_s > 0 else 0.0
    said = f"INT8 ({cost.path}) {cost.describe()} vs {base} {base_s * 1e6:.2f} us"
    if gain >= MIN_GAIN:
        return Int8Verdict(True, cost, base, base_s, f"{said}: {gain:.0%} faster")
    saved = base_s - cost.gemm_s
    if cost.overhead_s >= saved:
        why = (f"quantizing the activations and its extra ops ({cost.overhead_s * 1e6:.2f} us) "
               f"eat what the int8 GEMM saves ({max(saved, 0.0) * 1e6:.2f} us)")
    else:
        why = f"{gain:.0%} faster, below the {MIN_GAIN:.0%} margin"
    return Int8Verdict(False, cost, base, base_s, f"{said}: {why}")
