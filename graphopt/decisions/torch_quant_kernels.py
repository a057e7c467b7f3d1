"""Which shapes and dtypes torch's low-bit Linear kernels take (issue 22, item 1): the legality
half of putting the plan's format into the torch artifact. The backend
(``backends/torch/quant_kernels.py``) packs and runs; a node these rules refuse keeps its float
format, with the reason.

The kernels, as torch 2.13 ships them:

1. FP8 e4m3 (``torch._scaled_mm``): float8_e4m3fn weights with one scale per output row,
   activations quantized per token (row) on every call, fp32 accumulation. Any M, K, N on the
   CPU build; cuBLASLt on sm_89+ needs K and N multiples of 16 (its fp8 GEMM alignment), so
   the rule asks for that everywhere: an artifact checked here must also run there.
2. INT8 weight-only (``torch._weight_int8pack_mm``): int8 weights, one scale per output row,
   activations in the model's float dtype. [MEASURED] on this CPU build (AVX512-BF16 host,
   torch 2.13.0+cpu): bf16 activations with K not a multiple of 32 crash the process with a
   segmentation fault (K = 248, 250, 264; K = 32..1024 in steps of 32 run); fp32 and fp16 ran
   every K tried. A crash cannot be caught, so bf16 needs K % 32 == 0.
3. INT4 weight-only, group-wise (``torch._weight_int4pack_mm_for_cpu`` over
   ``torch._convert_weight_to_int4pack_for_cpu``; CUDA's tinygemm takes the same groups): 4-bit
   weights with a scale and a zero per group of ``group`` input channels. [MEASURED] errors
   from torch: "expect N to be dividable by 16", "expect qGroupSize to be 32, 64, 128 or 256";
   K must split into whole groups.

The probe that found these: ``python benchmarks/bench_torch_quant_kernels.py --probe`` runs
each shape in a child process, so a crash is a result, not the end of the run.
"""

from __future__ import annotations

__all__ = ["INT4_GROUPS", "TORCH_QUANT_FORMATS", "kernel_refuses"]

#: the weight formats graphopt's torch backend can run, by the plan's format key
TORCH_QUANT_FORMATS = ("fp8_e4m3", "int8_weight_only", "int4_weight_only")
#: group sizes the int4 kernels take (case 3)
INT4_GROUPS = (32, 64, 128, 256)
_FLOATS = ("fp32", "bf16", "fp16")


def kernel_refuses(fmt: str, k: int, n: int, act_dtype: str, group: int | None = None
                   ) -> str | None:
    """Why torch's kernel for ``fmt`` cannot run a Linear with ``k`` inputs and ``n`` outputs on
    ``act_dtype`` activations (``group``: the int4 group size), else None."""
    if fmt not in TORCH_QUANT_FORMATS:
        return f"{fmt}: no torch kernel (torch runs {', '.join(TORCH_QUANT_FORMATS)})"
    if act_dtype not in _FLOATS:
        return f"{act_dtype} activations: the kernels take {', '.join(_FLOATS)}"
    if fmt == "fp8_e4m3":
        if k % 16 or n % 16:
            return (f"K={k}, N={n}: FP8 GEMMs (cuBLASLt, sm_89+) need K and N multiples of 16 "
                    "(case 1)")
        return None
    if fmt == "int8_weight_only":
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
    return None
