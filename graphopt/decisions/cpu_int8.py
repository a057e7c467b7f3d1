"""INT8 on CPUs: when it pays (VNNI / AMX-INT8 only) and the torch path that applies it.

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

import copy
import logging
import warnings
from types import MappingProxyType
from typing import Any

from graphopt.errors import GraphoptError
from graphopt.hardware.profile import HardwareProfile
from graphopt.plan import Decision

__all__ = ["CONV_INT8_MEASURED", "apply_dynamic_int8", "int8_pays_on_cpu"]

logger = logging.getLogger(__name__)

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


def apply_dynamic_int8(module: Any, target: HardwareProfile) -> tuple[Any, Decision]:
    """Dynamic INT8 for the ``nn.Linear`` layers of a COPY of ``module``, where it pays.

    Uses ``torch.ao.quantization.quantize_dynamic`` (weights int8 per tensor, activations
    quantized per call). It is deprecated in favour of torchao (its DeprecationWarning announces
    removal "in 2.10"), yet works in torch 2.13; the warning is silenced here. Where
    :func:`int8_pays_on_cpu` is False the user's module is returned unchanged, with the reason.
    """
    import torch
    from torch import nn

    pays, why = int8_pays_on_cpu(target)
    n_linear = sum(isinstance(m, nn.Linear) for m in module.modules())
    if not pays or n_linear == 0:
        why = why if not pays else "the module has no nn.Linear layers"
        first = next(iter(module.parameters()), None)
        dtype = str(first.dtype).removeprefix("torch.") if first is not None else "float32"
        fmt = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(dtype, dtype)
        return module, Decision(f"dynamic INT8 not applied: {why}",
                                MappingProxyType({"format": fmt, "runs_on": "torch",
                                                  "layers": 0}), applied=False)
    quantize = getattr(getattr(torch, "ao", None), "quantization", None)
    quantize = getattr(quantize, "quantize_dynamic", None)
    if quantize is None:
        raise GraphoptError(
            f"torch {torch.__version__} has no torch.ao.quantization.quantize_dynamic",
            "install torchao and use torchao.quantization.quantize_(model, "
            "Int8DynamicActivationInt8WeightConfig()), or plan without the INT8 path")
    engine = torch.backends.quantized.engine
    if engine == "none" or engine not in torch.backends.quantized.supported_engines:
        raise GraphoptError(f"no quantized CPU engine in this torch build (engine {engine!r})",
                            "use a torch build with fbgemm/x86/onednn or qnnpack")
    qcopy = copy.deepcopy(module).eval()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", UserWarning)
            qmodel = quantize(qcopy, {nn.Linear}, dtype=torch.qint8)
    except (RuntimeError, NotImplementedError, AttributeError) as exc:
        raise GraphoptError(f"torch {torch.__version__} quantize_dynamic failed: {exc}",
                            "install torchao and use its quantize_ API, or plan without INT8"
                            ) from exc
    logger.info("dynamic INT8: %d Linear layers quantized for %s", n_linear, target.name)
    return qmodel, Decision(
        f"dynamic INT8 on {n_linear} nn.Linear layers (engine {engine}): {why}",
        MappingProxyType({"format": "int8", "runs_on": "torch", "layers": n_linear}))
