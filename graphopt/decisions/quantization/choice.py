"""The quantize decisions of both backends: which method a node gets, where a method does not pay
or loses accuracy, and the INT8 scheme per target.

Why a module of its own (issue 20, item 3): ``decisions/`` answers "should we" from the plan and
the target; a backend answers only "can I apply this here" and makes the edits.
``backends/onnx/quantize.py`` and ``backends/torch/quantize.py`` ask this module which nodes to
quantize and how, and keep only the legality checks (a constant 2-D weight, the dtypes ONNX
Runtime's quantizers take, a kernel that exists).

1. :func:`auto_quantize_blocked`: an explicit ``precision`` is a numerics contract, so
   ``quantize="auto"`` adds no quantization on either backend (INT8 only when asked for by name).
2. :func:`auto_choice`: ``quantize="auto"``, one node the plan put at ``fmt``. INT8 on a CPU
   (the plan chose it by cost, ``decisions/quantization/cpu_int8.py``, on every int8 ISA path):
   GEMMs as static QDQ when calibration data is given, else dynamic (the method the plan costed, and
   the one torch runs: the same nodes on both backends); convs as static QDQ only (the plan
   costed them so), so without calibration data they stay float and say why. INT8 on a GPU as
   static S8S8 QDQ (calibration needed); FP8 as QDQ (calibration needed); 4-bit formats as
   weight-only MatMulNBits.
3. :func:`method_blocked`: where a method is never worth it or cannot keep its numerics, even
   when requested by name: dynamic INT8 convs (measured 2.7-5x slower, ``CONV_INT8_MEASURED``),
   FP8 without FP8 tensor cores. On the torch backend (``backend="torch"``: graphopt's torch
   module, its modes ``fp8``, ``int8_dynamic``, ``int4``, ``int8_weight_only`` over torch's own
   kernels, :mod:`graphopt.decisions.quantization.torch_kernels`) also: dynamic INT8 on a GPU
   without int8 tensor cores (``torch._int_mm`` is a cuBLASLt int8 GEMM: without IMMA it has no rate
   above fp16's), and INT4 on a GPU without bf16 (tinygemm takes bf16 activations only and is
   built for sm_80+). The ONNX backend's answers are unchanged (ONNX Runtime's MatMulNBits
   and integer kernels have their own rules): it asks with the default ``backend="onnx"``.
4. :func:`int8_scheme` / :func:`method_description`: U8S8 with ``reduce_range`` on a CPU whose
   int8 path saturates (AVX2 u8s8: VPMADDUBSW's int16 pair sums) or that has none, S8S8
   symmetric on GPUs (TensorRT's convention) and for FP8; the words the reports use for each
   method.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphopt.decisions.quantization.cpu_int8 import CONV_INT8_MEASURED
from graphopt.hardware.cpus import int8_path
from graphopt.hardware.profile import HardwareProfile
from graphopt.ir.options import Options

__all__ = ["Int8Scheme", "auto_choice", "auto_quantize_blocked", "int8_scheme",
           "method_blocked", "method_description"]

_NO_FP8 = "has no FP8 tensor cores (FP8 needs Ada, Hopper or Blackwell: cc 8.9+)"
_FOUR_BIT = ("nvfp4", "int4", "fp4")
_BACKENDS = ("onnx", "torch")


def auto_quantize_blocked(options: Options) -> str | None:
    """Case 1: why ``quantize="auto"`` quantizes nothing under these options, else None.

    An explicit precision is a numerics contract: lower formats only when asked for by name.
    """
    if options.quantize == "auto" and options.precision != "auto":
        return (f"precision={options.precision} was requested explicitly; pass quantize='int8' "
                "to add INT8")
    return None


def auto_choice(op_type: str, fmt: str, plan_why: str, target: HardwareProfile,
                has_calibration: bool) -> tuple[str | None, str]:
    """Case 2: the ONNX Runtime method ("int8_static", "int8_dynamic", "fp8", "int4") for a
    ``op_type`` node (Conv, MatMul, Gemm) the plan put at ``fmt`` for ``plan_why``; (None, why)
    where none runs it."""
    plan = f"plan: {fmt} ({plan_why})"
    if fmt == "int8" and not target.is_gpu:
        if has_calibration:
            return "int8_static", plan
        if op_type == "Conv":
            return None, ("INT8 convs run as static QDQ (QLinearConv), which needs activation "
                          f"scales: pass calibration data; never dynamic: {CONV_INT8_MEASURED}")
        return "int8_dynamic", plan
    if fmt == "int8":
        return ("int8_static", plan) if has_calibration else (
            None, "INT8 on a GPU runs as static QDQ (TensorRT explicit quantization): pass "
                  "calibration data")
    if fmt in ("fp8_e4m3", "fp8"):
        return ("fp8", plan) if has_calibration else (
            None, "FP8 QDQ needs activation scales: pass calibration data")
    if fmt in _FOUR_BIT or fmt.startswith(("q4", "q3", "q2")):
        return "int4", f"{plan}; ONNX Runtime runs 4-bit weights as MatMulNBits"
    return None, f"the plan keeps {fmt}: {plan_why}"


def method_blocked(mode: str, op_type: str, target: HardwareProfile,
                   backend: str = "onnx") -> str | None:
    """Case 3: why ``mode`` should not run a ``op_type`` node on ``target`` (profitability or
    numerics, whoever asked), else None; ``backend``: "onnx" (ONNX Runtime's quantizers) or
    "torch" (graphopt's torch module)."""
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}, got {backend!r}")
    if mode == "int8_dynamic" and op_type == "Conv":
        return f"never dynamic INT8 convs: {CONV_INT8_MEASURED}"
    if mode == "fp8" and not (target.is_gpu and target.has("fp8")):
        return f"{target.display_name} {_NO_FP8}"
    if backend == "torch" and target.is_gpu:
        if mode == "int8_dynamic" and not target.has("int8_tensor"):
            return (f"{target.display_name} has no int8 tensor cores (Turing and later, cc "
                    "7.2/7.5+): torch._int_mm's int8 GEMM would not beat fp16")
        if mode == "int4" and not target.has("bf16"):
            return (f"{target.display_name} has no bf16: torch's CUDA int4 kernel (tinygemm) "
                    "takes bf16 activations only and is built for sm_80+ (Ampere and later)")
    return None


@dataclass(frozen=True)
class Int8Scheme:
    """How a QDQ/dynamic quantizer maps values to 8 bits on a target (case 4).

    ``reduce_range``: 7-bit values, on CPUs whose int8 path sums u8 x s8 pairs in saturating
    int16 (AVX2 u8s8: VPMADDUBSW) or that have no int8 path.
    ``symmetric``: signed activations with zero point 0 (S8S8): GPUs (TensorRT) and FP8.
    """

    reduce_range: bool
    symmetric: bool


def int8_scheme(target: HardwareProfile, mode: str) -> Int8Scheme:
    """Case 4: the scheme of ``mode`` ("int8_dynamic", "int8_static", "fp8") on ``target``."""
    if mode not in ("int8_dynamic", "int8_static", "fp8"):
        raise ValueError(f"no 8-bit scheme for quantize mode {mode!r}")
    if mode == "fp8":
        return Int8Scheme(reduce_range=False, symmetric=True)
    return Int8Scheme(reduce_range=_saturates(target),
                      symmetric=mode == "int8_static" and target.is_gpu)


def _saturates(target: HardwareProfile) -> bool:
    path = None if target.is_gpu else int8_path(target.capabilities)
    return not target.is_gpu and (path is None or path.saturates)


def method_description(mode: str, target: HardwareProfile, int4_block: int) -> str:
    """Case 4: the words a report uses for ``mode`` on ``target`` (``int4_block``: the weights
    per 4-bit block the backend's kernel uses)."""
    if mode == "int4":
        return f"4-bit weight-only MatMulNBits (symmetric, blocks of {int4_block})"
    if mode == "fp8":
        return "static QDQ float8e4m3fn (per tensor, calibrated)"
    reduced = ""
    if int8_scheme(target, mode).reduce_range:
        path = int8_path(target.capabilities)
        reduced = (f", reduce_range: {path.instructions} sums pairs in saturating int16"
                   if path is not None else ", reduce_range: no int8 dot-product instruction")
    if mode == "int8_dynamic":
        return f"dynamic INT8 (int8 per-channel weights, uint8 activations per call{reduced})"
    if target.is_gpu:
        return "static QDQ S8S8 symmetric (TensorRT convention)"
    return f"static QDQ U8S8 (per-channel int8 weights, calibrated uint8 activations{reduced})"
