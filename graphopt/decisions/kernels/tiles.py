"""What the hardware lets a kernel use: MMA tile menus, CPU register blocks and TMA rules.

The legality half of a kernel configuration (``kernels.config`` holds the choice among these):
each MMA instruction family with the tile shapes and K steps its instruction accepts, the
register-blocked CPU micro-kernels, the PTX instruction a tile issues, and whether
``cuTensorMapEncodeTiled`` can describe an operand. Every entry cites its source.

Sources:
  [PTX-WGMMA] PTX ISA, ``wgmma.mma_async`` (sm_90a): shapes m64nNkK, N = 8..256 in steps of 8,
              K = 16 (.f16/.bf16), 8 (.tf32), 32 (.e4m3/.e5m2/.s8/.u8).
  [PTX-TC05]  PTX ISA, ``tcgen05.mma`` (sm_100a): cta_group::1 M = 64/128, cta_group::2 (CTA
              pair) M = 128/256; N a multiple of 16 up to 256 (we use this conservative subset);
              K = 32 bytes (16 f16/bf16, 8 tf32, 32 f8/i8, 64 for block-scaled mxf4nvf4).
  [PTX-MMA]   PTX ISA, ``mma.sync``: m8n8k4 (sm_70), m16n8k8 f16 (sm_75), m16n8k16 f16/bf16,
              m16n8k8 tf32, m16n8k32 s8 (sm_80), e4m3/e5m2 (sm_89), kind::f8f6f4 m16n8k32 and
              block-scaled kind::mxf4nvf4 m16n8k64 (sm_120a).
  [CU-TMAP]   CUDA Driver API, ``cuTensorMapEncodeTiled``: globalAddress 16-byte aligned,
              globalDim in [1, 2^32], globalStrides multiples of 16 and < 2^40, boxDim in
              [1, 256], boxDim[0] * elementSize a multiple of 16 bytes; with a swizzle mode the
              inner box dimension must be <= the swizzle span (``CU_TENSOR_MAP_SWIZZLE_32B/64B/
              128B``: 16-byte chunks swizzled within a 32/64/128-byte span).
  [PG]        CUDA C++ Programming Guide, technical specifications per compute capability:
              65536 32-bit registers per SM (cc 7.0-12.x).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from graphopt.analysis.kernel_class import KernelClass
from graphopt.analysis.record import NodeAnalysis

__all__ = [
    "CPU_KERNELS", "MMA_SYNC", "SIMT", "TCGEN05", "WGMMA", "Engine", "GemmProblem", "elem_bytes",
    "gemm_problem", "gemm_tma_check", "mma_instruction", "swizzle_bytes", "tma_check",
]

_ELEM_BYTES = {"fp64": 8.0, "fp32": 4.0, "tf32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0,
               "int8": 1.0, "int4": 0.5, "fp4": 0.5}
_PTX_TYPE = {"fp16": "f16", "bf16": "bf16", "tf32": "tf32", "fp8": "e4m3", "int8": "s8",
             "int4": "s4", "fp4": "e2m1", "fp64": "f64"}
_REGS_PER_SM = 65536  # [PG], 32-bit registers
_TMA_MAX_BOX = 256  # [CU-TMAP]
_TMA_MAX_DIM = 2**32  # [CU-TMAP]
_TMA_MAX_STRIDE = 2**40  # [CU-TMAP]


def elem_bytes(key: str) -> float:
    """Bytes per element of a peak-table dtype key (fp4/int4 are half a byte)."""
    return _ELEM_BYTES.get(key, 4.0)


@dataclass(frozen=True, slots=True)
class Engine:
    """One MMA instruction family: its tile menu and the K each instruction consumes."""

    name: str
    k_step: Mapping[str, int]  # dtype key -> K elements per instruction
    m_tiles: tuple[int, ...]
    n_step: int
    n_max: int
    k_tile_bytes: int  # bytes of K per pipeline stage (one TMA box row at 128 B)
    max_acc: int | None  # accumulator elements a CTA may hold in registers (None: in TMEM)


# Register-file bound: half of the 64K registers for fp32 accumulators keeps room for addresses
# and operand fragments (CUTLASS's 128x256 tiles sit exactly at 32768).
_ACC_LIMIT = _REGS_PER_SM // 2
WGMMA = Engine("wgmma", {"fp16": 16, "bf16": 16, "tf32": 8, "fp8": 32, "int8": 32},
               (64, 128, 256), 8, 256, 128, _ACC_LIMIT)  # [PTX-WGMMA]; M = 64 x warpgroups
TCGEN05 = Engine("tcgen05", {"fp16": 16, "bf16": 16, "tf32": 8, "fp8": 32, "int8": 32,
                             "fp4": 64}, (64, 128, 256), 16, 256, 128, None)  # [PTX-TC05]
MMA_SYNC = Engine("mma_sync", {"fp16": 16, "bf16": 16, "tf32": 8, "fp8": 32, "int8": 32,
                               "int4": 64, "fp4": 64, "fp64": 4}, (64, 128, 256), 32, 256, 64,
                  _ACC_LIMIT)  # [PTX-MMA]; K tile of 64 bytes as CUTLASS's sm80 defaults
SIMT = Engine("simt", {}, (32, 64, 128), 32, 128, 32, _ACC_LIMIT // 2)  # CUDA-core FFMA


@dataclass(frozen=True, slots=True)
class GemmProblem:
    """A GEMM-like node as ``batch`` independent (M x K) @ (K x N) products."""

    kind: str  # "gemm" | "gemv" | "conv" | "attention"
    M: int
    N: int
    K: int
    batch: int = 1


def gemm_problem(a: NodeAnalysis) -> GemmProblem:
    """Read GEMM dims from the analysis record (attention: per-head QK^T; conv: per group)."""
    d = a.dims
    if a.kernel_class is KernelClass.ATTENTION:
        return GemmProblem("attention", d.get("seq_q", 1), d.get("seq_kv", 1),
                           d.get("head_dim", 1), d.get("batch", 1) * d.get("heads", 1))
    m, n, k = d.get("M", 1), d.get("N", 1), d.get("K", 1)
    if a.kernel_class is KernelClass.CONV:
        g = max(1, d.get("groups", 1))
        return GemmProblem("conv", m, max(1, n // g), k, g)
    gemv = a.kernel_class in (KernelClass.GEMV, KernelClass.QUANT_DOT) or min(m, n) == 1
    return GemmProblem("gemv" if gemv else "gemm", m, n, k, d.get("batch", 1))


def swizzle_bytes(row_bytes: float) -> int:
    """TMA swizzle span for a shared-memory row of ``row_bytes`` [CU-TMAP].

    The widest span (128, 64 or 32 B) that divides the row: the box's inner dimension is then
    one span (legal: inner box <= span) and a longer row is loaded as several boxes. 128 B
    covers all 32 four-byte banks, so 8 consecutive rows hit disjoint banks; a row that is not a
    multiple of 32 B gets no swizzle (0).
    """
    for span in (128, 64, 32):
        if row_bytes >= span and row_bytes % span == 0:
            return span
    return 0


def tma_check(shape: Sequence[int], key: str, box: Sequence[int]) -> tuple[bool, str]:
    """Can ``cuTensorMapEncodeTiled`` describe a row-major tensor and box? -> (ok, reason).

    ``shape`` and ``box`` list dims outermost first; rows are contiguous, so each stride is the
    product of the inner dims; the base address is assumed 16-byte aligned (allocators give 256).
    """
    eb = elem_bytes(key)
    if any(d < 1 or d > _TMA_MAX_DIM for d in shape):
        return False, f"a dim of {tuple(shape)} is outside [1, 2^32]"
    if any(b < 1 or b > _TMA_MAX_BOX for b in box):
        return False, f"box {tuple(box)} has a dim outside [1, 256]"
    inner_box_bytes = box[-1] * eb
    if inner_box_bytes % 16:
        return False, (f"inner box dim {box[-1]} x {eb:g} B = {inner_box_bytes:g} B, not a "
                       "multiple of 16")
    stride = shape[-1] * eb
    for dim in reversed(shape[1:]):
        if stride % 16 or stride >= _TMA_MAX_STRIDE:
            return False, (f"row stride {stride:g} B ({shape[-1]} x {eb:g} B) is not a multiple "
                           "of 16 bytes")
        stride *= dim
    return True, "strides 16-byte aligned, box within 256, inner box a multiple of 16 B"


def gemm_tma_check(p: GemmProblem, key: str, tile: tuple[int, int, int],
                   ctas: int = 1) -> tuple[bool, str]:
    """TMA legality of A [M,K], B [N,K] (K-major weight) and C [M,N] for a CTA tile."""
    tm, tn, tk = tile
    inner = max(1, int(min(tk * elem_bytes(key), 128) // elem_bytes(key)))
    for name, shape, box in (("A", (p.M, p.K), (min(tm // ctas, p.M), inner)),
                             ("B", (p.N, p.K), (min(tn, p.N), inner)),
                             ("C", (p.M, p.N), (min(tm // ctas, p.M), min(tn, p.N, 64)))):
        ok, why = tma_check(shape, key, box)
        if not ok:
            return False, f"TMA not usable for {name}: {why}"
    return True, "TMA ok: " + why


def mma_instruction(engine: Engine, key: str, tm: int, tn: int, cc: tuple[int, int] | None) -> str:
    """The instruction a ``tm`` x ``tn`` tile of ``engine`` issues, as the report names it."""
    t = _PTX_TYPE.get(key, key)
    acc = "s32" if key in ("int8", "int4") else "f64" if key == "fp64" else "f32"
    if engine is WGMMA:
        return f"wgmma.mma_async.sync.aligned.m64n{tn}k{WGMMA.k_step[key]}.{acc}.{t}.{t}"
    if engine is TCGEN05:
        kind = {"fp16": "f16", "bf16": "f16", "tf32": "tf32", "fp8": "f8f6f4", "int8": "i8",
                "fp4": "mxf4nvf4.block_scale"}[key]
        group = 2 if tm == 256 else 1
        k = TCGEN05.k_step[key]
        return f"tcgen05.mma.cta_group::{group}.kind::{kind} (M={tm}, N={tn}, K={k})"
    if engine is SIMT:
        return f"fma.rn.{'f64' if key == 'fp64' else 'f32'} (CUDA cores)"
    if cc is not None and cc < (7, 5):
        return "mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32"
    k = 8 if cc is not None and cc < (8, 0) else MMA_SYNC.k_step.get(key, 16)
    if key == "fp4":
        return f"mma.sync.aligned.kind::mxf4nvf4.block_scale.m16n8k{k}.row.col.f32.e2m1.e2m1.f32"
    if key == "fp64":  # DMMA
        return "mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64"
    return f"mma.sync.aligned.m16n8k{k}.row.col.{acc}.{t}.{t}.{acc}"


# CPU register-blocked micro-kernels: (rows, cols, K step, instruction, SIMD bytes). Shapes come
# from the register budget: AVX2 has 16 ymm (6x2 accumulators + 2 B + 1 broadcast A), AVX-512
# and NEON 32 registers (AVX-512: 14x2 zmm + 2 + 1; NEON: 8x3 q-regs + 3 + 2); AMX holds 8 tile
# registers of 16 rows x 64 B: 2x2 C tiles + 2 A + 2 B (Intel SDM vol. 1, ch. 18 "AMX").
CPU_KERNELS = {
    ("amx", "bf16"): (32, 32, 32, "tdpbf16ps (AMX tiles)", 64),
    ("amx", "int8"): (32, 32, 64, "tdpbssd (AMX tiles)", 64),
    ("vnni", "int8"): (14, 32, 4, "vpdpbusd (AVX512-VNNI)", 64),
    ("avx512", "bf16"): (14, 32, 2, "vdpbf16ps (AVX512-BF16)", 64),
    ("avx512", "fp16"): (14, 64, 1, "vfmadd231ph (AVX512-FP16)", 64),
    ("avx512", "*"): (14, 32, 1, "vfmadd231ps zmm (AVX-512)", 64),
    ("avx2", "int8"): (6, 16, 4, "vpmaddubsw + vpmaddwd (AVX2)", 32),
    ("avx2", "*"): (6, 16, 1, "vfmadd231ps ymm (AVX2+FMA)", 32),
    ("neon", "int8"): (8, 12, 4, "sdot (Armv8.2 dot product)", 16),
    ("neon", "bf16"): (8, 12, 2, "bfdot (Armv8.6 BF16)", 16),
    ("neon", "*"): (8, 12, 1, "fmla v.4s (NEON)", 16),
    ("generic", "*"): (4, 4, 1, "scalar fma", 8),
}
