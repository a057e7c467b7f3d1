"""CUDA compute capability -> architecture generation, feature set and per-SM limits.

A compute capability (cc) is a code-generation target, not a ranking: sm_120 (consumer
Blackwell) is numerically above sm_100 (datacenter Blackwell) yet lacks its tcgen05 tensor cores
and tensor memory, and sm_90 (Hopper) is the only target with ``wgmma``. Decisions that depend
on a feature must therefore ask :func:`capabilities_for`, never compare cc numbers.

Sources:
  [PG]   NVIDIA CUDA C++ Programming Guide, "Compute Capabilities" (feature availability and
         technical specifications tables; shared-memory sections per architecture).
  [PTX]  NVIDIA PTX ISA, target requirements of ``mma``/``wmma``, ``cp.async``,
         ``cp.async.bulk.tensor`` (TMA), ``wgmma.mma_async`` (sm_90a) and ``tcgen05.*``
         (sm_100a family).
  [WP]   Architecture whitepapers: Volta (GV100), Turing, Ampere (GA100), Ada Lovelace,
         Hopper (H100), Blackwell, RTX Blackwell (GB202).
"""

from __future__ import annotations

import logging

from graphopt.errors import GraphoptError

__all__ = [
    "CAPABILITY_NAMES",
    "KNOWN_COMPUTE_CAPABILITIES",
    "capabilities_for",
    "family_for",
    "format_cc",
    "generation_for",
    "parse_cc",
    "smem_per_sm_bytes",
]

logger = logging.getLogger(__name__)

CC = tuple[int, int]

_VOLTA: frozenset[CC] = frozenset({(7, 0), (7, 2)})  # V100; Jetson Xavier
_TURING: frozenset[CC] = frozenset({(7, 5)})  # T4, RTX 20xx
_AMPERE: frozenset[CC] = frozenset({(8, 0), (8, 6), (8, 7)})  # A100; GA10x; Jetson Orin
_ADA: frozenset[CC] = frozenset({(8, 9)})  # L4, L40S, RTX 40xx
_HOPPER: frozenset[CC] = frozenset({(9, 0)})  # H100, H200
# 10.0 B200/GB200, 10.1 Thor (renamed 11.0 in CUDA 13), 10.3 B300/GB300.
_BLACKWELL_DC: frozenset[CC] = frozenset({(10, 0), (10, 1), (10, 3)})
_BLACKWELL_CONSUMER: frozenset[CC] = frozenset({(12, 0), (12, 1)})  # RTX 50xx; GB10 (Spark)

_GENERATION: dict[frozenset[CC], tuple[str, str]] = {
    # ccs -> (generation, family). The family only differs from the generation on Blackwell,
    # where 10.x and 12.x expose different tensor-core programming models [PTX].
    _VOLTA: ("volta", "volta"),
    _TURING: ("turing", "turing"),
    _AMPERE: ("ampere", "ampere"),
    _ADA: ("ada", "ada"),
    _HOPPER: ("hopper", "hopper"),
    _BLACKWELL_DC: ("blackwell", "blackwell_datacenter"),
    _BLACKWELL_CONSUMER: ("blackwell", "blackwell_consumer"),
}

KNOWN_COMPUTE_CAPABILITIES: tuple[CC, ...] = tuple(sorted(cc for ccs in _GENERATION for cc in ccs))

_FROM_AMPERE = _AMPERE | _ADA | _HOPPER | _BLACKWELL_DC | _BLACKWELL_CONSUMER
_FROM_HOPPER = _HOPPER | _BLACKWELL_DC | _BLACKWELL_CONSUMER

# Capability -> the ccs that have it. Each row says where it comes from.
_CAPABILITY_CCS: dict[str, frozenset[CC]] = {
    # Tensor cores since Volta [WP Volta]; Volta's run fp16 only (HMMA) [WP Volta, PG wmma].
    "tensor_cores": _VOLTA | _TURING | _FROM_AMPERE,
    # Integer wmma/mma (s8/u8) needs sm_72 [PG "Element Types and Matrix Sizes"]: Xavier has it,
    # V100 (7.0) does not.
    "int8_tensor": frozenset({(7, 2)}) | _TURING | _FROM_AMPERE,
    # Sub-byte s4/u4 mma: Turing through Ada. Hopper and Blackwell datasheets list no INT4 tensor
    # rate and the RTX Blackwell whitepaper drops it [WP Hopper, WP RTX Blackwell].
    "int4_tensor": _TURING | _AMPERE | _ADA,
    # TF32 and BF16 tensor cores and cp.async arrive with Ampere [WP Ampere, PTX cp.async sm_80].
    "tf32": _FROM_AMPERE,
    "bf16": _FROM_AMPERE,
    "async_copy": _FROM_AMPERE,
    # FP64 tensor cores (DMMA) on the HPC dies only: GA100, GH100, GB100 [WP Ampere/Hopper/
    # Blackwell]. B300 (10.3) cuts FP64, so it is not listed.
    "fp64_tensor": frozenset({(8, 0), (9, 0), (10, 0)}),
    # FP8 (e4m3/e5m2) tensor cores: Ada 8.9 and later [WP Ada, PTX mma .e4m3 sm_89].
    "fp8": _ADA | _FROM_HOPPER,
    # TMA (cp.async.bulk.tensor), thread-block clusters and distributed shared memory: sm_90+,
    # including sm_100 and sm_120 [PG "Thread Block Clusters", PTX cp.async.bulk sm_90].
    "tma": _FROM_HOPPER,
    "thread_block_clusters": _FROM_HOPPER,
    "distributed_shared_memory": _FROM_HOPPER,
    # wgmma.mma_async exists on sm_90a ONLY [PTX]. Datacenter Blackwell replaces it with tcgen05
    # MMA that accumulates in tensor memory (TMEM); consumer Blackwell (sm_120) has neither and
    # keeps warp-level mma.sync, extended with FP4/FP6/FP8 block-scaled types [PTX, WP].
    "wgmma": _HOPPER,
    "tcgen05": _BLACKWELL_DC,
    "tmem": _BLACKWELL_DC,
    # FP4 and FP6 tensor types (incl. MXFP4/NVFP4 block scaling): all Blackwell [WP Blackwell].
    "fp6": _BLACKWELL_DC | _BLACKWELL_CONSUMER,
    "fp4": _BLACKWELL_DC | _BLACKWELL_CONSUMER,
}

CAPABILITY_NAMES: tuple[str, ...] = tuple(sorted(_CAPABILITY_CCS))

# Maximum shared memory per SM, by cc [PG "Technical Specifications per Compute Capability" and
# the per-architecture shared-memory sections]. One KB per SM is reserved for the system, so a
# single block gets 1 KB less (e.g. 227 KB on 9.0).
_KB = 1024
_SMEM_PER_SM: dict[CC, int] = {
    (7, 0): 96 * _KB,
    (7, 2): 96 * _KB,
    (7, 5): 64 * _KB,
    (8, 0): 164 * _KB,
    (8, 6): 100 * _KB,
    (8, 7): 164 * _KB,
    (8, 9): 100 * _KB,
    (9, 0): 228 * _KB,
    (10, 0): 228 * _KB,
    (10, 1): 228 * _KB,
    (10, 3): 228 * _KB,
    (12, 0): 100 * _KB,  # [PG 12.0 "Shared Memory"]: capacity 0..100 KB, 99 KB per block.
    (12, 1): 100 * _KB,
}


def parse_cc(cc: CC | str | float) -> CC:
    """Read ``(9, 0)``, ``"9.0"``, ``"sm_90"``, ``"sm_100a"`` or ``9.0`` as one canonical tuple."""
    if isinstance(cc, tuple):
        if len(cc) == 2 and all(isinstance(x, int) for x in cc):
            return (int(cc[0]), int(cc[1]))
    elif isinstance(cc, float):
        return parse_cc(f"{cc:.1f}")
    elif isinstance(cc, str):
        text = cc.strip().lower()
        if text.startswith(("sm_", "sm", "compute_")):
            digits = "".join(ch for ch in text.split("_")[-1] if ch.isdigit())
            if len(digits) >= 2:
                return (int(digits[:-1]), int(digits[-1]))
        elif "." in text:
            major, _, minor = text.partition(".")
            if major.isdigit() and minor.isdigit():
                return (int(major), int(minor))
    raise GraphoptError(
        f"cannot read compute capability {cc!r}",
        "write it as (major, minor), '9.0' or 'sm_90'",
    )


def format_cc(cc: CC) -> str:
    return f"{cc[0]}.{cc[1]}"


def _lookup(cc: CC | str | float) -> tuple[CC, tuple[str, str]]:
    key = parse_cc(cc)
    for ccs, names in _GENERATION.items():
        if key in ccs:
            return key, names
    known = ", ".join(format_cc(c) for c in KNOWN_COMPUTE_CAPABILITIES)
    raise GraphoptError(
        f"unknown CUDA compute capability {format_cc(key)}",
        f"graphopt knows {known}; add the new one to graphopt/hardware/generations.py",
    )


def generation_for(cc: CC | str | float) -> str:
    """Architecture generation: volta, turing, ampere, ada, hopper or blackwell."""
    return _lookup(cc)[1][0]


def family_for(cc: CC | str | float) -> str:
    """Like :func:`generation_for`, but splits Blackwell into ``blackwell_datacenter`` (10.x,
    tcgen05 + TMEM) and ``blackwell_consumer`` (12.x, warp-level mma), which need different
    kernels."""
    return _lookup(cc)[1][1]


def capabilities_for(cc: CC | str | float) -> frozenset[str]:
    """The feature flags of a cc, from the table above; unknown cc -> GraphoptError."""
    key, _ = _lookup(cc)
    return frozenset(cap for cap, ccs in _CAPABILITY_CCS.items() if key in ccs)


def smem_per_sm_bytes(cc: CC | str | float) -> int:
    """Maximum shared memory one SM can hold, in bytes."""
    key, _ = _lookup(cc)
    return _SMEM_PER_SM[key]
