"""The quantization family: the model's weight format (:mod:`.recommend`, by size, fit and
preference), the per-node quantize method both backends apply (:mod:`.choice`), INT8 on CPUs by
cost (:mod:`.cpu_int8`) and which shapes torch's low-bit kernels take (:mod:`.torch_kernels`).
Each module numbers its own cases. Entry: :func:`recommend_quant`. The format table itself,
shared with the precision and memory families, is :mod:`graphopt.decisions.quant_formats`.
"""

from __future__ import annotations

from graphopt.decisions.quantization.cpu_int8 import can_int8_on_cpu, int8_pays_on_cpu
from graphopt.decisions.quantization.recommend import QuantizationPlan, recommend_quant

__all__ = ["QuantizationPlan", "can_int8_on_cpu", "int8_pays_on_cpu", "recommend_quant"]
