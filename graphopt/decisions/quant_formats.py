"""Weight formats graphopt can recommend: size, quality rank, and which hardware runs them natively.

Bits per weight (bpw) include every block scale, so ``params x bpw / 8`` is the stored size:

  * NVFP4: 4-bit E2M1 values + one FP8 E4M3 scale per 16 values (8/16 = 0.5 bit) + one FP32
    scale per tensor (negligible) = 4.5 bpw [NV-FP4].
  * GGUF K-quants, from the block structs of llama.cpp's ``ggml-common.h``: ``block_q6_K`` holds
    256 weights in 210 bytes = 6.5625 bpw; ``block_q8_0`` 32 int8 + one fp16 scale = 34 bytes
    per 32 = 8.5 bpw. The ``_M`` mixes put some tensors (``attn_v``, ``ffn_down``, ``output``)
    at a higher type; llama.cpp's quantize README measures Q4_K_M at 4.84 and Q5_K_M at 5.68 bpw
    on Llama 2 7B (4.80 / 5.65 on 70B) [GGUF].
  * FP8 E4M3 with a per-tensor scale and INT8 with per-output-channel scales: 8 bpw (one fp32
    scale per row of K >= 1024 weights adds < 0.03 bit, ignored). The same for 8-bit
    weight-only (``int8_weight_only``: int8 weights, one scale per output row, float
    activations; torch's ``_weight_int8pack_mm``) [TORCH-Q].
  * INT4 weight-only, group-wise (``int4``): 4-bit weights plus one bf16 scale and one bf16 zero
    per group of ``g`` input channels = 4 + 32 / g bpw, 4.25 at g = 128 (tinygemm's, AWQ's and
    GPTQ's usual group; the plan may pick 32-256, :func:`int4_bits_per_weight`) [TORCH-Q].

``quality_rank`` orders formats from best (0) to lossiest. It is a documented judgement built from
two published effects: (1) bits: llama.cpp's perplexity deltas on LLaMA 7B are Q8_0 +0.0004,
Q6_K +0.0044, Q5_K_M +0.0142, Q4_K_M +0.0535 [GGUF-PPL]; (2) formats that also quantize
ACTIVATIONS (FP8, INT8 and NVFP4 GEMMs are W8A8 / W4A4) lose more than weight-only formats of
similar size, because activations carry outlier features that a shared scale cannot cover; integer
W8A8 suffers most (LLM.int8() [DETTMERS]), FP8 keeps an exponent per value. Hence FP8 ranks above
Q6_K while INT8 ranks below it, 8-bit weight-only (per-row scales) ranks between Q8_0 (a
scale per 32 weights) and FP8, INT4 weight-only (g128, round-to-nearest) below Q4_K_M (more
bits, K-quant mixes), and NVFP4 (W4A4) ranks last. bf16 ranks above fp16 at the same
size only because it keeps fp32's exponent range (no overflow above 65504) [IEEE].

Native execution (``requires``) is a set of capability flags of which the target needs ONE:
  * FP8: fp8 tensor cores, cc 8.9+ (Ada, Hopper, Blackwell) [TE-MATRIX].
  * NVFP4: fp4 tensor cores, Blackwell (cc 10.x; 12.x has them too, Transformer Engine lists
    NVFP4 there as partial) [TE-MATRIX, NV-FP4].
  * INT8: int8 tensor cores (Turing+, Xavier) or a CPU int8 dot-product instruction: VNNI
    (AVX512-VNNI / AVX-VNNI) or AMX-INT8 [INTEL-OPT]. Plain AVX2 has no single-instruction int8
    dot product (see :func:`graphopt.decisions.quantization.cpu_int8.int8_pays_on_cpu`).
  * GGUF K-quants are weight-only: llama.cpp dequantizes blocks inside its matmul kernels on any
    GPU or CPU, so they run everywhere but save memory and bandwidth, not arithmetic [GGUF].
  * INT4 weight-only runs in torch on every CPU (``_weight_int4pack_mm_for_cpu``) and on GPUs
    with bf16 (tinygemm, ``_weight_int4pack_mm``: bf16 activations only, built for sm_80+);
    8-bit weight-only on every CPU and GPU (``_weight_int8pack_mm`` has a CPU and a CUDA
    kernel). Both save weight bytes, not arithmetic: the matmul runs at the activations'
    dtype [TORCH-Q].

Sources:
  [NV-FP4]    NVIDIA technical blog "Introducing NVFP4 for efficient and accurate low-precision
              inference" and Blackwell architecture docs: E2M1 values, E4M3 scale per 16 values,
              FP32 per-tensor scale.
  [GGUF]      ggml-org/llama.cpp: ggml/src/ggml-common.h block structs; tools/quantize/README.md
              bits-per-weight tables.
  [GGUF-PPL]  llama.cpp ``llama-quantize --help`` type list ("+0.0535 ppl @ 7B" etc.).
  [DETTMERS]  Dettmers et al., "LLM.int8(): 8-bit Matrix Multiplication for Transformers at Scale"
              (2022): emergent outlier features break per-tensor int8 above ~6.7B parameters.
  [TE-MATRIX] NVIDIA Transformer Engine "Datatype and hardware support matrix".
  [INTEL-OPT] Intel 64 and IA-32 Architectures Optimization Reference Manual (VNNI VPDPBUSD).
  [IEEE]      IEEE 754 binary16; bfloat16 = fp32's 8-bit exponent with 8 significant bits.
  [TORCH-Q]   torch 2.13's ``native_functions.yaml`` (``_weight_int4pack_mm``,
              ``_weight_int8pack_mm``) and ``aten/src/ATen/native/cuda/int4mm.cu``; the kernels'
              rules are :mod:`graphopt.decisions.quantization.torch_kernels`.
"""

from __future__ import annotations

import difflib
import logging
from dataclasses import dataclass
from typing import Literal

from graphopt.errors import GraphoptError
from graphopt.hardware.profile import HardwareProfile

__all__ = [
    "FORMAT_DTYPE",
    "FORMATS",
    "QuantFormat",
    "get_format",
    "int4_bits_per_weight",
    "runs_natively",
]

#: a precision or quantization format -> the cost model's dtype for it (GGUF mixes costed at
#: the integer width their GEMMs run in). torch's weight-only formats compute at the dtype
#: their GPU kernel runs, where the plan picks them (``gpu_formats`` case 7): tinygemm
#: (INT4) in bf16, the only activations it takes; the CUDA 8-bit weight-only kernel in fp32 on
#: the CUDA cores (it converts the activations, ``quantization.torch_kernels`` case 2)
FORMAT_DTYPE = {"fp32": "fp32", "tf32": "tf32", "bf16": "bf16", "fp16": "fp16",
                "fp8_e4m3": "fp8_e4m3", "fp8": "fp8_e4m3", "int8": "int8", "nvfp4": "fp4",
                "q4_k_m": "int4", "q5_k_m": "int8", "q6_k": "int8", "q8_0": "int8",
                "int4": "bf16", "int8_weight_only": "fp32"}

logger = logging.getLogger(__name__)

Family = Literal["float", "fp8", "int8", "nvfp4", "gguf", "int_weight_only"]


@dataclass(frozen=True, slots=True)
class QuantFormat:
    """One weight format. ``peak`` is the roofline peak key its GEMMs run at when native."""

    key: str
    display: str
    bits_per_weight: float
    quality_rank: int
    family: Family
    peak: str | None  # None: weight-only, the matmul runs at the activation dtype
    gpu_requires: frozenset[str]  # any one of these capabilities makes it native on a GPU
    cpu_requires: frozenset[str]  # ... on a CPU
    activations_quantized: bool
    source: str

    @property
    def weight_only(self) -> bool:
        return self.peak is None


_ANY = frozenset({"*"})  # marker: native everywhere
_NONE: frozenset[str] = frozenset()

_TABLE: tuple[QuantFormat, ...] = (
    QuantFormat("fp32", "FP32", 32.0, 0, "float", "fp32", _ANY, _ANY, False, "IEEE 754 binary32"),
    # bf16 tensor cores from Ampere [generations.py "bf16"]; CPUs with AVX512-BF16/AMX/Arm BF16.
    QuantFormat("bf16", "BF16", 16.0, 1, "float", "bf16", frozenset({"bf16"}),
                frozenset({"avx512_bf16", "amx_bf16", "bf16"}), False, "[IEEE]"),
    # fp16 tensor cores from Volta; CPUs with AVX512-FP16 or Arm FP16 arithmetic.
    QuantFormat("fp16", "FP16", 16.0, 2, "float", "fp16", frozenset({"tensor_cores"}),
                frozenset({"avx512_fp16", "asimdhp"}), False, "[IEEE]"),
    QuantFormat("q8_0", "Q8_0", 8.5, 3, "gguf", None, _ANY, _ANY, False,
                "[GGUF] block_q8_0: 32 x int8 + fp16 scale = 34 B / 32 weights"),
    QuantFormat("int8_weight_only", "INT8 (weight-only)", 8.0, 4, "int_weight_only", None, _ANY,
                _ANY, False, "[TORCH-Q] _weight_int8pack_mm: int8 + a scale per output row"),
    QuantFormat("fp8_e4m3", "FP8 (E4M3)", 8.0, 5, "fp8", "fp8", frozenset({"fp8"}), _NONE, True,
                "[TE-MATRIX] FP8 per-tensor scaling, cc >= 8.9"),
    QuantFormat("q6_k", "Q6_K", 6.5625, 6, "gguf", None, _ANY, _ANY, False,
                "[GGUF] block_q6_K: 210 B / 256 weights"),
    QuantFormat("int8", "INT8", 8.0, 7, "int8", "int8", frozenset({"int8_tensor"}),
                frozenset({"avx512_vnni", "avx_vnni", "amx_int8"}), True,
                "[INTEL-OPT] VNNI/AMX-INT8; int8 tensor cores (Turing+)"),
    QuantFormat("q5_k_m", "Q5_K_M", 5.68, 8, "gguf", None, _ANY, _ANY, False,
                "[GGUF] quantize README: 5.68 bpw on Llama 2 7B"),
    QuantFormat("q4_k_m", "Q4_K_M", 4.84, 9, "gguf", None, _ANY, _ANY, False,
                "[GGUF] quantize README: 4.84 bpw on Llama 2 7B"),
    # tinygemm takes bf16 activations only and is built for sm_80+: the bf16 capability
    QuantFormat("int4", "INT4 (weight-only, g128)", 4.25, 10, "int_weight_only", None,
                frozenset({"bf16"}), _ANY, False,
                "[TORCH-Q] _weight_int4pack_mm: 4-bit + bf16 scale and zero per 128 weights"),
    QuantFormat("nvfp4", "NVFP4", 4.5, 11, "nvfp4", "fp4", frozenset({"fp4"}), _NONE, True,
                "[NV-FP4] E2M1 + E4M3 scale per 16 values + fp32 per tensor"),
)

#: every known format by key, best quality first
FORMATS: dict[str, QuantFormat] = {f.key: f for f in _TABLE}

_ALIASES: dict[str, str] = {
    "float32": "fp32", "f32": "fp32", "float": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16", "half": "fp16", "f16": "fp16",
    "fp8": "fp8_e4m3", "e4m3": "fp8_e4m3", "float8_e4m3fn": "fp8_e4m3", "fp8e4m3": "fp8_e4m3",
    "q8": "q8_0", "q6": "q6_k", "q5_k": "q5_k_m", "q4_k": "q4_k_m",
    "fp4": "nvfp4", "nv_fp4": "nvfp4",
    "qint8": "int8", "i8": "int8",
    "int4_weight_only": "int4", "w4a16": "int4", "int8_wo": "int8_weight_only",
    "w8a16": "int8_weight_only",
}


def get_format(name: str) -> QuantFormat:
    """The format for a name or alias (case-insensitive); unknown names raise with the fix."""
    key = name.strip().lower().replace("-", "_").replace(" ", "")
    key = key.replace("(e4m3)", "_e4m3") if key.endswith("(e4m3)") else key
    key = _ALIASES.get(key, key)
    if key in FORMATS:
        return FORMATS[key]
    known = [*FORMATS, *_ALIASES]
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise GraphoptError(f"unknown weight format {name!r}",
                        f"{hint}use one of: {', '.join(FORMATS)}")


def int4_bits_per_weight(group: int, scale_bits: int = 16) -> float:
    """Stored bits per weight of ``int4`` at group size ``group``: 4 + a scale and a zero per
    group, each ``scale_bits`` wide (the activations' dtype: bf16 on GPUs, fp32 in an fp32
    module)."""
    if group <= 0:
        raise ValueError(f"group must be positive, got {group}")
    return 4 + 2 * scale_bits / group


def runs_natively(fmt: QuantFormat, target: HardwareProfile) -> tuple[bool, str]:
    """Whether ``target`` executes ``fmt`` in hardware (not emulated), and why."""
    requires = fmt.gpu_requires if target.is_gpu else fmt.cpu_requires
    where = target.display_name
    if requires == _ANY:
        if fmt.family == "int_weight_only":
            return True, (f"{fmt.display} is weight-only: torch's kernel dequantizes it inside "
                          f"the matmul on {where}")
        if fmt.weight_only:
            return True, (f"{fmt.display} is weight-only: llama.cpp dequantizes it inside its "
                          f"matmul kernels on any GPU or CPU")
        return True, f"{fmt.display} runs on every target"
    have = sorted(requires & target.capabilities)
    if have and fmt.family == "int_weight_only":  # the capability is the kernel's activations
        return True, (f"{fmt.display} is weight-only: torch's kernel dequantizes it inside the "
                      f"matmul, with {', '.join(have)} activations {where} computes in")
    if have:
        return True, f"{fmt.display} runs on {where}'s {', '.join(have)} units"
    need = ", ".join(sorted(requires)) or "a GPU"
    return False, f"{fmt.display} needs one of [{need}], which {where} lacks"
