"""Fused attention on GPUs: which kernel family runs, and what it loses to softmax and tiles.

A FlashAttention-style kernel runs two GEMMs per score tile (QK^T and PV: 4 * head_dim FLOPs per
score) and one exponential per score. The exponentials run on the SM's special-function units
(MUFU, 16 results per clock per SM [PG]), not on the tensor cores, so per score they cost

    exp / matmul = (tensor-core FLOPs per clock per SM / 4 head_dim) / 16

which is 32 / head_dim on an A100 SM and 64 / head_dim on an H100 SM [WP]: at head_dim 64
the exponentials take as long as the matmuls. FlashAttention-2 (Ampere, Ada, Turing, consumer
Blackwell) hides only what warps interleaving on an SM hide; FlashAttention-3 on Hopper and the
Blackwell kernels (FA4, cuDNN) overlap them with the GEMMs of the other warpgroup (ping-pong
scheduling) [FA3]: ``_OVERLAP`` is the hidden share of each. A causal kernel also computes
the diagonal tiles in full (n(n+1)/2 tiles of 128 for n = seq / 128, not n^2 / 2), and every
query tile pays a pipeline fill of about ``_FILL_TILES`` key tiles, which short sequences
feel.

The fitted parameters (``_OVERLAP`` per family, ``_FILL_TILES``) come from a grid fit on the
27 attention points of ``benchmarks/calibration`` (``bench_calibration.py``), never per point:
median |ln(pred/meas)| 0.080 there (0.24 with attention costed as a plain GEMM), refitted when
the GEMM rate they scale became the measured per-family fraction of ``cost.efficiency``.

Decode (one query, or a few, against a long KV cache) has too few query tiles to fill the SMs
(batch x heads x 1). The kernels then split the KV sequence across CTAs and combine the partial
softmaxes (FlashDecoding; flash-attn's split-KV forward): :func:`kv_splits` is flash-attn's own
choice of the split count [FA2-split], so such a node streams its KV cache on every SM and is
memory-bound on that read (its K and V bytes, with the GQA group's fewer KV heads).

Which kernel runs at all follows torch's SDPA backend choice [SDP]: the flash kernels need
sm_80+ and a head_dim that is a multiple of 8 up to 256; before Ampere the memory-efficient
(CUTLASS) kernel runs, tiled and fused like FlashAttention-2 (its numbers here are FA2's: no
published measurement tells them apart); a head_dim that is not a multiple of 8 (or above 256)
leaves only the math path, which writes the scores and probabilities through memory between
separate GEMM and softmax kernels (:func:`scores_bytes`: S written and read, P written and
read, per head; the roofline adds them to the node's bytes).

Sources:
  [SDP] pytorch ``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`` (``use_flash_attention``
        requires sm_80+, ``check_head_dim_size_flash``; ``use_mem_efficient_attention`` runs from
        sm_50; the math kernel is the fallback), torch 2.x.
  [PG]  NVIDIA CUDA C++ Programming Guide, "Arithmetic Instructions" throughput table: 16
        results per clock per SM for 32-bit exp2/log2/rcp/rsqrt/sin/cos on cc 7.x-9.0.
  [WP]  Whitepapers: V100 and Turing, 8 tensor cores x 64 FP16 FMA per clock per SM; A100,
        4 x 256 dense FP16 FMA; GA10x and Ada, 4 x 128; H100, 4 x 512; B200, twice H100 per SM.
  [FA3] Shah et al., "FlashAttention-3" (2024), sections 3.1-3.2: MUFU exp throughput is 256x
        lower than matmul on H100; warp-specialized ping-pong overlaps softmax with GEMMs.
  [FA2-split] Dao-AILab/flash-attention ``csrc/flash_attn/flash_api.cpp`` at
        0251105a2fb19d2957484b7f023cd8c115286ced, ``num_splits_heuristic``: one split when the
        query tiles fill 80% of the SMs, else the fewest splits (up to 128 and the KV blocks)
        whose wave efficiency is within 85% of the best.
"""

from __future__ import annotations

import math

from graphopt.analysis.record import NodeAnalysis
from graphopt.hardware.profile import HardwareProfile

__all__ = ["attention_kernel", "kernel_family", "kv_splits", "query_tiles", "scores_bytes"]

#: dense FP16 tensor-core FLOPs per clock per SM by compute capability major.minor [WP]; other
#: ccs of a major (GA10x 8.6, Ada 8.9, consumer Blackwell 12.x) have the GA10x rate
_TC_FLOPS_PER_CLOCK = {(7, 0): 1024, (7, 5): 1024, (8, 0): 2048, (9, 0): 4096, (10, 0): 8192}
_OTHER_TC_FLOPS_PER_CLOCK = 1024
_MUFU_PER_CLOCK = 16  # [PG]
#: kernel family by cc major (FlashAttention-2 elsewhere), and the share of the exponentials
#: each hides behind the GEMMs
_FAMILY = {9: "FlashAttention-3", 10: "FA4 / cuDNN"}
_MATH = "SDPA math path"
_MEM_EFFICIENT = "memory-efficient (CUTLASS)"
_OVERLAP = {"FlashAttention-2": 0.3, "FlashAttention-3": 0.8, "FA4 / cuDNN": 0.8,
            _MEM_EFFICIENT: 0.3}
_ELEM_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1}
_FILL_TILES = 1.5
_TILE = 128
_MAX_SPLITS = 128  # [FA2-split]


def kv_splits(query_tiles: int, sms: int, kv_blocks: int) -> int:
    """How many slices of the KV sequence a fused attention runs in parallel [FA2-split]."""
    if query_tiles >= 0.8 * sms:
        return 1
    most = min(_MAX_SPLITS, sms, kv_blocks)

    def fill(n: int) -> float:
        waves = query_tiles * n / sms
        return waves / math.ceil(waves)

    # a split count that leaves the last slice empty (same blocks per slice as n - 1) is not one
    eligible = [n for n in range(1, most + 1)
                if n == 1 or math.ceil(kv_blocks / n) != math.ceil(kv_blocks / (n - 1))]
    best = max(fill(n) for n in eligible)
    return next(n for n in eligible if fill(n) >= 0.85 * best)


def query_tiles(d: dict[str, int]) -> int:
    """CTAs of a fused attention before any KV split: one per head per 128 queries."""
    return max(1, d.get("batch", 1) * d.get("heads", 1) * math.ceil(d.get("seq_q", 1) / _TILE))


def kernel_family(a: NodeAnalysis, profile: HardwareProfile) -> str:
    """The SDPA kernel that runs the node on ``profile`` [SDP]."""
    head_dim = a.dims.get("head_dim", 128)
    if head_dim % 8 or head_dim > 256:
        return _MATH
    cc = profile.compute_capability or (8, 0)
    if cc < (8, 0):
        return _MEM_EFFICIENT
    return _FAMILY.get(cc[0], "FlashAttention-2")


def scores_bytes(a: NodeAnalysis, profile: HardwareProfile) -> int:
    """DRAM bytes the math path adds: scores and probabilities, each written and read once per
    head (0 for the fused kernels, which keep them on chip)."""
    if not profile.is_gpu or kernel_family(a, profile) != _MATH:
        return 0
    d = a.dims
    scores = d.get("batch", 1) * d.get("heads", 1) * d.get("seq_q", 1) * d.get("seq_kv", 1)
    return 4 * scores * _ELEM_BYTES.get(a.dtype or "fp16", 2)


def attention_kernel(a: NodeAnalysis, profile: HardwareProfile) -> tuple[float, str]:
    """(fraction of the GEMM rate a fused attention reaches, the kernel family and why)."""
    cc = profile.compute_capability or (8, 0)
    family = kernel_family(a, profile)
    d = a.dims
    head_dim = max(1, d.get("head_dim", 128))
    if family == _MATH:  # two batched GEMMs at the GEMM rate; softmax is a memory pass
        return 1.0, (f"{family} on sm_{cc[0]}{cc[1]} (head_dim {head_dim} is not a multiple "
                     "of 8 up to 256): separate GEMMs and softmax, scores through memory")
    tc = _TC_FLOPS_PER_CLOCK.get(cc)
    if tc is None:  # another cc of datacenter Blackwell has B200's rate, the rest GA10x's
        tc = _TC_FLOPS_PER_CLOCK[(10, 0)] if cc[0] == 10 else _OTHER_TC_FLOPS_PER_CLOCK
    exp_ratio = tc / (4 * head_dim) / _MUFU_PER_CLOCK
    exposed = (1 - _OVERLAP[family]) * exp_ratio
    n = max(1, math.ceil(d.get("seq_kv", 1) / _TILE))
    causal = bool(d.get("causal"))
    # key tiles each query tile computes: all n, or the lower triangle with its diagonal
    tiles = (n + 1) / 2 if causal else n
    ideal = n / 2 if causal else n
    work = (tiles + _FILL_TILES) / ideal
    factor = 1 / ((1 + exposed) * work)
    splits = kv_splits(query_tiles(d), profile.sm_count or 1, n)
    why = (f"{family} on sm_{cc[0]}{cc[1]}: "
           + (f"KV split in {splits} (split-KV / FlashDecoding: {query_tiles(d)} query tiles "
              f"on {profile.sm_count} SMs); " if splits > 1 else "")
           + f"exponentials {exp_ratio:.2f}x the matmul time "
           f"at head_dim {head_dim}, {_OVERLAP[family]:.0%} hidden; "
           + ("causal diagonal tiles and " if causal else "")
           + f"pipeline fill over {n} key tiles: {factor:.2f} of the GEMM rate")
    return factor, why
