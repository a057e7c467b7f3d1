"""Which shapes and dtypes torch's low-bit Linear kernels take (issue 22, item 1): the legality
half of putting the plan's format into the torch artifact. The backend
(``backends/torch/quant_kernels.py``) packs and runs; a node these rules refuse keeps its float
format, with the reason. :mod:`graphopt.decisions.precision.gemm` asks :func:`kernel_refuses`
before it plans a format as ``runs_on="torch"``.

The kernels, as torch 2.13 ships them (its dispatch table,
``torchgen/packaged/ATen/native/native_functions.yaml``, lists a CPU and a CUDA kernel for each
op below). The CPU rules always apply: an artifact planned for a GPU is built and checked on
the CPU here, with the real CPU kernels, so it must run there too. ``device="cuda"`` adds the
CUDA kernels' own rules.

1. FP8 e4m3 (``torch._scaled_mm``): float8_e4m3fn weights with one scale per output row,
   activations quantized per token (row) on every call, fp32 accumulation. Any M, K, N on the
   CPU build; on CUDA (sm_89+) ``_scaled_mm_out_cuda`` (``aten/src/ATen/native/cuda/Blas.cpp``)
   checks "Expected trailing dimension of mat1 to be divisible by 16" and "mat2 shape ... must
   be divisible by 16": K and N multiples of 16, asked everywhere so that an artifact checked
   here also runs there. CUDA dtypes: with row-wise scales the result is bf16 or fp16 ("Only
   bf16 and fp16 high precision output types are supported for row-wise scaling", same file;
   fp32 only through cuBLAS >= 12.9 on sm_90); ``graphopt::fp8_linear`` writes bf16 on every
   device and casts to the activations' dtype, so every float activation dtype is taken.
2. INT8 weight-only (``torch._weight_int8pack_mm``): int8 weights, one scale per output row,
   activations in the model's float dtype. [MEASURED] on this CPU build (AVX512-BF16 host,
   torch 2.13.0+cpu): bf16 activations with K not a multiple of 32 crash the process with a
   segmentation fault (K = 248, 250, 264; K = 32..1024 in steps of 32 run); fp32 and fp16 ran
   every K tried. A crash cannot be caught, so bf16 needs K % 32 == 0. CUDA has a kernel
   (``_weight_int8pack_mm_cuda`` in the dispatch table; ``aten/src/ATen/native/cuda/int8mm.cu``
   in pytorch's source) with no shape rule beyond matching K: it converts the activations to
   fp32 and computes one output per thread on the CUDA cores (no tensor cores, no tiling), so
   it saves weight bytes only.
3. INT4 weight-only, group-wise (``torch._weight_int4pack_mm_for_cpu`` over
   ``torch._convert_weight_to_int4pack_for_cpu``): 4-bit weights with a scale and a zero per
   group of ``group`` input channels. [MEASURED] errors from torch: "expect N to be dividable
   by 16", "expect qGroupSize to be 32, 64, 128 or 256"; K must split into whole groups. CUDA
   (tinygemm, ``_weight_int4pack_mm_cuda`` / ``_convert_weight_to_int4pack_cuda`` in
   ``aten/src/ATen/native/cuda/int4mm.cu``): ``TORCH_CHECK(A.dtype() == at::kBFloat16)``, so
   bf16 activations only; the packing checks K % (innerKTiles * 16) with innerKTiles in
   {2, 4, 8} (so K % 32 at least) and tiles N by 8; the kernel is compiled for sm_80+ only
   ("_weight_int4pack_mm_cuda is not available for build" below), which the target's bf16
   capability stands for (:func:`graphopt.decisions.quantization.choice.method_blocked`).
4. Dynamic INT8, W8A8 (``torch._int_mm``): int8 weights with a scale per output row,
   activations quantized per token on every call, int32 accumulation. [MEASURED] the CPU
   kernel (torch 2.13.0+cpu) ran every shape tried, exact against an int64 matmul: (M, K, N) =
   (1, 8, 8), (3, 17, 33), (1, 250, 250), (17, 256, 128), (1, 4096, 4096). CUDA
   (``_int_mm_out_cuda`` in ``aten/src/ATen/native/cuda/Blas.cpp``, cuBLASLt int8 GEMM):
   "self.size(1) needs to be greater than 0 and a multiple of 8" and the same for
   ``mat2.size(1)``: K and N multiples of 8; it also wants M > 16 ("self.size(0) needs to be
   greater than 16"), which the op pads inside (``graphopt::int8_dynamic_linear``), so M is no
   node rule.

The probe that found the measured rules: ``python benchmarks/bench_torch_quant_kernels.py
--probe`` runs each shape in a child process, so a crash is a result, not the end of the run.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["INT4_GROUPS", "KERNEL_OPS", "MODE_FORMAT", "TORCH_KERNELS", "int4_group",
           "kernel_refuses", "torch_kernel_for"]

#: the low-bit Linear kernels graphopt's torch backend runs, by kernel key
TORCH_KERNELS = ("fp8_e4m3", "int8_dynamic", "int8_weight_only", "int4_weight_only")
#: kernel key -> the custom op graphopt's torch module runs and the torch op under it (for the
#: plan's reasons; ``backends/torch/quant_ops.py`` registers the ops)
KERNEL_OPS: Mapping[str, str] = MappingProxyType({
    "fp8_e4m3": "graphopt::fp8_linear over torch._scaled_mm",
    "int8_dynamic": "graphopt::int8_dynamic_linear over torch._int_mm",
    "int8_weight_only": "graphopt::int8_weight_only_linear over torch._weight_int8pack_mm",
    "int4_weight_only": "graphopt::int4_linear over torch._weight_int4pack_mm (tinygemm on CUDA)",
})
#: ``quantize=`` option -> the plan's format it applies
MODE_FORMAT: Mapping[str, str] = MappingProxyType({
    "fp8": "fp8_e4m3", "int8_dynamic": "int8", "int4": "int4",
    "int8_weight_only": "int8_weight_only"})
#: the plan's format -> kernel key. INT8 on a GPU runs as dynamic W8A8; a CPU plan's INT8
#: Linear runs through ``quantized::linear_dynamic`` (``backends/torch/quantize.py``) instead
_FORMAT_KERNEL = {"fp8_e4m3": "fp8_e4m3", "fp8": "fp8_e4m3", "int8": "int8_dynamic",
                  "int4": "int4_weight_only", "int8_weight_only": "int8_weight_only"}
#: group sizes the int4 kernels take (case 3), and the default: 128 is tinygemm's, AWQ's and
#: GPTQ's usual group
INT4_GROUPS = (32, 64, 128, 256)
_INT4_DEFAULT = 128
_FLOATS = ("fp32", "bf16", "fp16")
_DEVICES = ("cpu", "cuda")


def torch_kernel_for(fmt: str) -> str | None:
    """The kernel key that runs the plan's format ``fmt`` in torch; None where torch has none
    (NVFP4, the GGUF formats) or the format is a float."""
    return _FORMAT_KERNEL.get(fmt)


def int4_group(k: int, preferred: int = _INT4_DEFAULT) -> int | None:
    """The int4 group size for a Linear with ``k`` inputs: ``preferred`` where K splits into it,
    else the largest group the kernels take that does; None where none does (case 3)."""
    order = [preferred] if preferred in INT4_GROUPS else []
    order += sorted((g for g in INT4_GROUPS if g != preferred), reverse=True)
    return next((g for g in order if k > 0 and k % g == 0), None)


def kernel_refuses(kernel: str, k: int, n: int, act_dtype: str, group: int | None = None,
                   device: str = "cpu") -> str | None:
    """Why torch's ``kernel`` cannot run a Linear with ``k`` inputs and ``n`` outputs on
    ``act_dtype`` activations (``group``: the int4 group size) on ``device`` ("cpu": the CPU
    kernels' rules; "cuda": those and the CUDA kernels'), else None."""
    if device not in _DEVICES:
        raise ValueError(f"device must be one of {_DEVICES}, got {device!r}")
    if kernel not in TORCH_KERNELS:
        return f"{kernel}: no torch kernel (torch runs {', '.join(TORCH_KERNELS)})"
    if act_dtype not in _FLOATS:
        return f"{act_dtype} activations: the kernels take {', '.join(_FLOATS)}"
    cuda = device == "cuda"
    if kernel == "fp8_e4m3":
        if k % 16 or n % 16:
            return (f"K={k}, N={n}: FP8 GEMMs (cuBLASLt, sm_89+) need K and N multiples of 16 "
                    "(case 1)")
        return None
    if kernel == "int8_dynamic":
        if cuda and (k % 8 or n % 8):
            return (f"K={k}, N={n}: torch._int_mm on CUDA (cuBLASLt int8) needs K and N "
                    "multiples of 8 (case 4)")
        return None
    if kernel == "int8_weight_only":
        if act_dtype == "bf16" and k % 32:
            return (f"K={k}: the CPU int8 weight-only kernel crashes on bf16 activations unless "
                    "K is a multiple of 32 (measured, case 2)")
        return None
    if group not in INT4_GROUPS:
        return f"group size {group}: the int4 kernels take {', '.join(map(str, INT4_GROUPS))}"
    if k % group:
        return f"K={k} does not split into groups of {group} (case 3)"
    if n % 16:
        return f"N={n}: the int4 weight packing needs N divisible by 16 (case 3)"
    if cuda and act_dtype != "bf16":
        return f"{act_dtype} activations: tinygemm (CUDA int4) takes bf16 only (case 3)"
    # CUDA's K % 32 and N % 8 follow from K % group (group >= 32) and N % 16 above
    return None
