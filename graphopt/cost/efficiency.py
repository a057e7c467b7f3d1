"""Achievable fraction of the dense tensor-core peak, per GPU family and dtype, with its source.

A datasheet peak is a clock x units product nobody reaches: the best large GEMM a library runs
sustains a fraction of it, and that fraction differs by generation (power caps, clocks under
load, how well the kernels hide their loads) and by dtype (FP8 kernels on Hopper lose more to
their scaling and conversion work than BF16 ones). Each entry below is a *measured* best large
GEMM divided by the same datasheet peak graphopt's hardware table holds, so the roofline's
``peak x fraction`` is what that library was seen to reach. Shape losses (tiles, waves, split-K,
alignment, tiny-C convs) are charged on top by the roofline; these fractions are for a shape that
has none.

Lookup (:func:`matrix_efficiency`): for a convolution, the family's ``"conv"`` entry where one
was measured (cuDNN's implicit-GEMM convs reach less than cuBLAS's GEMMs on the same GPU); else
the family's entry for the peak key, else its ``"*"`` entry (its best-sourced 16-bit number),
else ``DEFAULT`` (no published measurement found for that family: the old single fraction).

Sources:
  [MAMF] stas00/ml-engineering ``compute/accelerator/README.md``
         at 744d01e18b79512572f64a6bbd8b5f4a725203a7,
         "Maximum Achievable Matmul FLOPS comparison table" (mamf-finder.py, the best shape of a
         search; mean of 100 iterations): BF16 A100 SXM 271.2 / 312 = 86.9%, H100 SXM 794.5 /
         989 = 80.3%, B200 SXM 1745 / 2250 = 77.6%; FP8 (e4m3) H100 SXM 1402.6 / 1979 = 70.9%,
         H200 SXM 1453.4 / 1979 = 73.4%, B200 3432.5 / 4500 = 76.3%.
  [DB]   baidu-research/DeepBench at da81ba7820739e2e506dc27f382d15be5479f98f,
         ``results/train/DeepBench_NV_V100.xlsx`` and ``..._NV_T4.xlsx``, sheet "Results - FP16
         ip, Mixed math" (cuBLAS, CUDA 10.1): the fastest GEMM of each sheet, V100 4096x7000x4096
         112.3 TFLOP/s (row 24) of 125 = 89.8%; T4 4096x7000x4096 (A transposed) 46.5 TFLOP/s
         (row 44) of 65 = 71.6% (the T4's 70 W cap lowers its clock under tensor-core load).
         Convolutions, same files (cuDNN 7.6.2 IMPLICIT_PRECOMP_GEMM, NCHW): the fastest forward
         of each sheet, 256->512 channels 28x28 3x3 batch 16 (row 202), V100 95.5 TFLOP/s =
         76.4%, T4 40.0 TFLOP/s = 61.5%.
  [LC]   gau-nernst/learn-cuda ``02b_matmul_sm80/README.md``
         at 1454f8b71499a68eacdbf44c08e36a7003d8ab99,
         "Varying problem shapes": cuBLAS BF16 on an RTX 5090 power-limited to 400 W, best
         173.5 TFLOP/s (4096^3) of 209.5 = 82.8%.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphopt.errors import GraphoptError
from graphopt.hardware.generations import family_for
from graphopt.hardware.profile import HardwareProfile

__all__ = ["DEFAULT", "MATRIX_EFFICIENCY", "Entry", "matrix_efficiency"]


@dataclass(frozen=True, slots=True)
class Entry:
    """One achievable fraction of the dense peak and the measurement it comes from."""

    fraction: float
    source: str


#: the fraction a family without a published measurement gets (the model's old single value)
DEFAULT = Entry(0.75, "no published measurement for this family: graphopt's generic 0.75")

#: GPU family (``generations.family_for``) -> peak key (``"*"``: any key not listed) -> entry
MATRIX_EFFICIENCY: dict[str, dict[str, Entry]] = {
    "volta": {"*": Entry(0.898, "[DB] V100 cuBLAS fp16 4096x7000x4096: 112.3 of 125 TFLOP/s"),
              "conv": Entry(0.764, "[DB] V100 cuDNN fp16 conv 256->512 28x28 3x3: 95.5 of 125 "
                                   "TFLOP/s")},
    "turing": {"fp16": Entry(0.716, "[DB] T4 cuBLAS fp16 4096x7000x4096 (A^T): 46.5 of 65 "
                                    "TFLOP/s, 70 W clock cap"),
               "conv": Entry(0.615, "[DB] T4 cuDNN fp16 conv 256->512 28x28 3x3: 40.0 of 65 "
                                    "TFLOP/s")},
    "ampere": {"*": Entry(0.869, "[MAMF] A100 SXM BF16 271.2 of 312 TFLOP/s")},
    "hopper": {"*": Entry(0.803, "[MAMF] H100 SXM BF16 794.5 of 989 TFLOP/s"),
               "fp8": Entry(0.72, "[MAMF] FP8 H100 SXM 1402.6 (70.9%) and H200 1453.4 (73.4%) "
                                  "of 1979 TFLOP/s: their mean")},
    "blackwell_datacenter": {"*": Entry(0.776, "[MAMF] B200 SXM BF16 1745 of 2250 TFLOP/s"),
                             "fp8": Entry(0.763, "[MAMF] B200 SXM FP8 3432.5 of 4500 TFLOP/s")},
    "blackwell_consumer": {"*": Entry(0.828, "[LC] RTX 5090 @ 400 W cuBLAS BF16 4096^3: 173.5 "
                                             "of 209.5 TFLOP/s")},
}


def matrix_efficiency(profile: HardwareProfile, key: str, *, conv: bool = False) -> Entry:
    """Achievable fraction of ``profile``'s dense ``key`` tensor-core peak, and its source;
    ``conv``: for a convolution (its own entry where the family has one)."""
    cc = profile.compute_capability
    if not profile.is_gpu or cc is None:
        return DEFAULT
    try:
        family = family_for(cc)
    except GraphoptError:  # a cc the generation table does not know: no measurement either
        return DEFAULT
    table = MATRIX_EFFICIENCY.get(family, {})
    return (table.get("conv") if conv else None) or table.get(key) or table.get("*") or DEFAULT
