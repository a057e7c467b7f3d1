"""Reference CPU profiles, derived from core count, clock and per-ISA FLOPs per cycle.

Peak FLOP/s of a CPU is not printed on a datasheet; it follows from the microarchitecture:

    peak[dtype] = cores x clock_hz x FLOPS_PER_CYCLE[tier][dtype]

with one fused multiply-add counted as 2 FLOPs (2 OPs for int8 multiply-accumulate). The clock
is the BASE clock: under sustained AVX-512/AMX load Intel server parts run at or below base
(AVX frequency licences), and turbo varies with load, so base is the honest steady-state rate.

Memory bandwidth is the theoretical peak ``channels x MT/s x 8 bytes`` (one 64-bit channel per
DIMM slot, DDR5's two 32-bit subchannels included); STREAM reaches ~70-85% of it.

For CPUs ``l2_bytes`` holds the LAST-LEVEL cache (L3): like a GPU's L2 it is the on-chip cache
that every core shares, which is what a working-set check needs. ``memory_bytes`` of a
reference CPU is a nominal population of one 32 GiB DIMM per channel (RAM belongs to the
server, not the CPU); the detected host profile uses /proc/meminfo instead.

Sources for the FLOPs/cycle tiers:
  [INTEL-OPT] Intel 64 and IA-32 Architectures Optimization Reference Manual (2 x 256-bit FMA
              ports since Haswell; 2 x 512-bit FMA on Xeon Scalable Gold 6xxx/Platinum; VNNI
              VPDPBUSD = 4 int8 MACs per 32-bit lane).
  [INTEL-AMX] Intel Architecture Day 2021 / SPR AMX: 2048 INT8 OPs and 1024 BF16 FLOPs per
              cycle per core; AVX512-FP16 doubles FP32 lane count.
  [AMD-SOG]   AMD Software Optimization Guides for family 19h (Zen 3, Zen 4): two 256-bit FMA
              pipes; Zen 4 executes 512-bit AVX-512 (incl. VNNI, BF16) as two 256-bit halves.
  [ARM-V1]    Arm Neoverse V1 Software Optimization Guide: 4 x 128-bit NEON / 2 x 256-bit SVE
              FMA pipes; SDOT (4 int8 MACs per 32-bit lane), BFDOT, FP16 FMLA.
  [INTEL-INTR] Intel Intrinsics Guide / SDM vol. 2 instruction pages: VPMADDUBSW multiplies
              unsigned by signed bytes and adds adjacent pairs into SATURATED int16; VPMADDWD
              multiplies int16 and adds pairs into int32; VPDPBUSD (AVX512-VNNI, AVX-VNNI) does
              both in one instruction: 4 u8 x s8 products summed into each int32 lane.
  [ORT-QUANT] ONNX Runtime "Quantize ONNX models" docs, "When to use reduce_range": U8S8 on
              x86-64 without VNNI uses VPMADDUBSW, whose int16 sums can saturate; 7-bit
              quantization (reduce_range) avoids it.

INT8 GEMMs run on one of several instruction paths (:data:`INT8_PATHS`, best first); a CPU's
``peak_flops["int8"]`` is its best path's rate:

    peak["int8"] = cores x clock_hz x int8_ops_per_cycle(path, tier)

AMX-INT8 states its rate absolutely (2048 OPs/cycle/core [INTEL-AMX]); the vector paths as a
multiple of the tier's fp32 FMA FLOPs per cycle, since they issue on the same ports at the same
width: VNNI's VPDPBUSD does 4 int8 MACs per 32-bit lane where an FMA does 1 (4x)
[INTEL-OPT, INTEL-INTR; AMD-SOG: Zen 4 executes it on its two 256-bit pipes]; the AVX2 (and
AVX-512BW) u8s8 sequence VPMADDUBSW + VPMADDWD needs two multiply uops on the FMA ports for
the same 4 MACs (2x) [INTEL-OPT, AMD-SOG, INTEL-INTR], with int16 saturation handled by
``reduce_range`` [ORT-QUANT]; Arm's SDOT is VNNI's equal (4x) [ARM-V1].
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from graphopt.hardware.profile import HardwareProfile, Link

__all__ = [
    "CPU_LAUNCH_OVERHEAD_S",
    "CPU_PROFILES",
    "DTYPE_FLAGS",
    "FLOPS_PER_CYCLE",
    "INT8_PATHS",
    "Int8Path",
    "cpu_profile",
    "cpu_profiles",
    "int8_ops_per_cycle",
    "int8_path",
]

logger = logging.getLogger(__name__)

GIB = 2**30
MIB = 2**20

# Per-core FLOPs per cycle, by ISA tier. A dtype missing from a tier has no native arithmetic
# there (x86 before SPR only converts fp16 via F16C; it computes in fp32). int8 is not a tier's:
# it follows the CPU's int8 path (INT8_PATHS below).
FLOPS_PER_CYCLE: dict[str, dict[str, int]] = {
    # SSE2 only: one 128-bit add + one 128-bit mul port [INTEL-OPT].
    "sse2": {"fp64": 4, "fp32": 8},
    # AVX without FMA (Sandy/Ivy Bridge): 256-bit add + 256-bit mul [INTEL-OPT].
    "avx": {"fp64": 8, "fp32": 16},
    # 2 x 256-bit FMA (Haswell..Alder Lake P-core, Zen 2/3) [INTEL-OPT, AMD-SOG].
    "avx2_fma": {"fp64": 16, "fp32": 32},
    # 2 x 512-bit FMA without VNNI (Skylake-SP Gold 6xxx/Platinum) [INTEL-OPT].
    "avx512": {"fp64": 32, "fp32": 64},
    # 2 x 512-bit FMA + VNNI (Cascade Lake, Ice Lake-SP) [INTEL-OPT].
    "avx512_vnni": {"fp64": 32, "fp32": 64},
    # Sapphire Rapids: AVX-512 + AVX512-FP16 (2x FP32 lanes) + AMX tiles [INTEL-AMX].
    "amx": {"fp64": 32, "fp32": 64, "fp16": 128, "bf16": 1024},
    # Zen 4: AVX-512 on 256-bit datapaths; VDPBF16PS on two 256-bit pipes [AMD-SOG].
    "zen4": {"fp64": 16, "fp32": 32, "bf16": 64},
    # Arm 2 x 128-bit FMA (Neoverse N1/N2, Cortex-A7x): the conservative Arm default.
    "neon": {"fp64": 8, "fp32": 16, "fp16": 32},
    # Neoverse V1/V2: 4 x 128-bit pipes; FP16 FMLA 2x FP32, BFDOT 2x FP32 [ARM-V1].
    # BFDOT issuing on all four pipes is an assumption, not checked against the SWOG tables.
    "neoverse_v1": {"fp64": 16, "fp32": 32, "fp16": 64, "bf16": 64},
}


@dataclass(frozen=True)
class Int8Path:
    """One way a CPU multiplies int8 matrices (module docstring, "INT8 GEMMs").

    ``ops_per_cycle`` (per core; one MAC = 2 OPs) is absolute where set, else
    ``fp32_multiple`` x the tier's fp32 FLOPs per cycle. ``saturates``: its int16 intermediate
    can overflow for full-range u8 x s8 (quantize activations to 7 bits: ``reduce_range``).
    """

    name: str
    flags: frozenset[str]  # any one of them enables the path
    instructions: str
    fp32_multiple: float = 0.0
    ops_per_cycle: int = 0
    saturates: bool = False
    source: str = ""


#: int8 GEMM paths, best first; a CPU takes the first whose flags it has
INT8_PATHS: tuple[Int8Path, ...] = (
    Int8Path("amx_int8", frozenset({"amx_int8"}), "AMX TDPBUSD tiles", ops_per_cycle=2048,
             source="[INTEL-AMX] 2048 INT8 OPs/cycle/core; [INTEL-OPT] Intel AMX chapter"),
    Int8Path("avx512_vnni", frozenset({"avx512_vnni"}), "AVX512-VNNI VPDPBUSD",
             fp32_multiple=4.0,
             source="[INTEL-OPT, INTEL-INTR] 4 u8 x s8 MACs per 32-bit lane in one "
                    "instruction, on the FMA ports; [AMD-SOG] Zen 4: on two 256-bit pipes"),
    Int8Path("avx_vnni", frozenset({"avx_vnni"}), "AVX-VNNI VPDPBUSD (256-bit)",
             fp32_multiple=4.0,
             source="[INTEL-OPT, INTEL-INTR] VNNI at 256 bits (Alder Lake and later cores "
                    "without AVX-512)"),
    Int8Path("avx2_u8s8", frozenset({"avx2"}), "AVX2 VPMADDUBSW + VPMADDWD (u8s8)",
             fp32_multiple=2.0, saturates=True,
             source="[INTEL-OPT, AMD-SOG, INTEL-INTR] two multiply uops on the FMA ports per "
                    "4 MACs per 32-bit lane: 2x the fp32 FMA rate on paper (the AVX-512BW "
                    "form on Skylake-SP likewise); [ORT-QUANT] int16 saturation: reduce_range"),
    Int8Path("arm_sdot", frozenset({"asimddp"}), "Arm SDOT/UDOT", fp32_multiple=4.0,
             source="[ARM-V1] SDOT: 4 int8 MACs per 32-bit lane"),
)


def int8_path(capabilities: frozenset[str]) -> Int8Path | None:
    """The best int8 GEMM path a CPU with these ISA flags has, or None (no int8 arithmetic
    faster than fp32: SSE/AVX without AVX2, Arm without the dot product)."""
    return next((p for p in INT8_PATHS if p.flags & capabilities), None)


def int8_ops_per_cycle(path: Int8Path, tier: str) -> float:
    """Per-core int8 OPs per cycle of ``path`` on a core of ISA ``tier``."""
    return float(path.ops_per_cycle or path.fp32_multiple * FLOPS_PER_CYCLE[tier]["fp32"])

# Narrow float dtypes a tier lists only count where the CPU has the flag for them (e.g. Arm
# cores without FP16 arithmetic, x86 without AVX512-FP16 compute fp16 in fp32 after F16C).
DTYPE_FLAGS: dict[str, frozenset[str]] = {
    "fp16": frozenset({"avx512_fp16", "asimdhp"}),
    "bf16": frozenset({"avx512_bf16", "amx_bf16", "bf16"}),
}

# Per-operator dispatch cost of a CPU runtime: ONNX Runtime's per-node overhead is around a
# microsecond and PyTorch eager dispatch a few; 2 us is our documented middle estimate.
CPU_LAUNCH_OVERHEAD_S = 2e-6


def cpu_profile(
    *,
    name: str,
    display_name: str,
    vendor: str,
    generation: str,
    tier: str,
    cores: int,
    clock_hz: float,
    bandwidth_bytes_per_s: float,
    memory_bytes: int,
    llc_bytes: int | None,
    capabilities: frozenset[str],
    source: str,
) -> HardwareProfile:
    """Build a CPU profile from the formula above; also used for the detected host."""
    rates: Mapping[str, int] = FLOPS_PER_CYCLE[tier]
    peak = {dtype: float(cores * clock_hz * per_cycle) for dtype, per_cycle in rates.items()
            if dtype not in DTYPE_FLAGS or DTYPE_FLAGS[dtype] & capabilities}
    path = int8_path(capabilities)
    if path is not None:
        peak["int8"] = float(cores * clock_hz * int8_ops_per_cycle(path, tier))
    vector = {k: v for k, v in peak.items() if k in ("fp64", "fp32", "fp16")}
    if tier == "amx" and "avx512_bf16" in capabilities:
        vector["bf16"] = float(cores * clock_hz * 128)  # AVX512_BF16 VDPBF16PS, not AMX
    return HardwareProfile(
        name=name,
        display_name=display_name,
        kind="cpu",
        vendor=vendor,
        generation=generation,
        peak_flops=peak,
        memory_bytes=memory_bytes,
        bandwidth_bytes_per_s=bandwidth_bytes_per_s,
        # Inputs already sit in host DRAM: a "transfer" is at most a DRAM copy, no bus latency.
        host_link=Link("local-dram", bandwidth_bytes_per_s, 0.0),
        source=source,
        cores=cores,
        vector_flops=vector,
        l2_bytes=llc_bytes,
        capabilities=capabilities,
        launch_overhead_s=CPU_LAUNCH_OVERHEAD_S,
    )


def _dram(channels: int, mega_transfers: int) -> float:
    return channels * mega_transfers * 1e6 * 8


_X86_BASE = frozenset({"avx", "avx2", "fma", "f16c"})
_AVX512 = _X86_BASE | {"avx512f"}

_TABLE: tuple[HardwareProfile, ...] = (
    # AMD EPYC 7763 (Zen 3 "Milan"): 64 cores, 2.45 GHz base, 256 MB L3, 8 ch DDR4-3200.
    # AVX2 + FMA, no AVX-512. [AMD product page; AMD-SOG 19h]
    cpu_profile(name="epyc-7763", display_name="AMD EPYC 7763 (Zen 3)", vendor="amd",
                generation="zen3", tier="avx2_fma", cores=64, clock_hz=2.45e9,
                bandwidth_bytes_per_s=_dram(8, 3200), memory_bytes=8 * 32 * GIB,
                llc_bytes=256 * MIB, capabilities=_X86_BASE,
                source="AMD EPYC 7763 product specifications; AMD SOG family 19h"),
    # Intel Xeon Platinum 8380 (Ice Lake-SP): 40 cores, 2.3 GHz base, 60 MB L3, 8 ch DDR4-3200,
    # 2 AVX-512 FMA units, VNNI, no BF16. [Intel ARK 8380; INTEL-OPT]
    cpu_profile(name="xeon-8380", display_name="Intel Xeon Platinum 8380 (Ice Lake-SP)",
                vendor="intel", generation="icelake", tier="avx512_vnni", cores=40,
                clock_hz=2.3e9, bandwidth_bytes_per_s=_dram(8, 3200),
                memory_bytes=8 * 32 * GIB, llc_bytes=60 * MIB,
                capabilities=_AVX512 | {"avx512_vnni"},
                source="Intel ARK Xeon Platinum 8380; Intel Optimization Reference Manual"),
    # Intel Xeon Platinum 8480+ (Sapphire Rapids): 56 cores, 2.0 GHz base, 105 MB L3,
    # 8 ch DDR5-4800, AMX-BF16/AMX-INT8, AVX512-BF16/FP16. [Intel ARK 8480+; INTEL-AMX]
    cpu_profile(name="xeon-8480", display_name="Intel Xeon Platinum 8480+ (Sapphire Rapids)",
                vendor="intel", generation="sapphire_rapids", tier="amx", cores=56,
                clock_hz=2.0e9, bandwidth_bytes_per_s=_dram(8, 4800),
                memory_bytes=8 * 32 * GIB, llc_bytes=105 * MIB,
                capabilities=_AVX512 | {"avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni",
                                        "amx_tile", "amx_bf16", "amx_int8"},
                source="Intel ARK Xeon Platinum 8480+; Intel Architecture Day 2021 (AMX)"),
    # AMD EPYC 9654 (Zen 4 "Genoa"): 96 cores, 2.4 GHz base, 384 MB L3, 12 ch DDR5-4800.
    # AVX-512 (double-pumped 256-bit), VNNI, BF16. [AMD product page; AMD-SOG 19h Zen 4]
    cpu_profile(name="epyc-9654", display_name="AMD EPYC 9654 (Zen 4)", vendor="amd",
                generation="zen4", tier="zen4", cores=96, clock_hz=2.4e9,
                bandwidth_bytes_per_s=_dram(12, 4800), memory_bytes=12 * 32 * GIB,
                llc_bytes=384 * MIB, capabilities=_AVX512 | {"avx512_vnni", "avx512_bf16"},
                source="AMD EPYC 9654 product specifications; AMD SOG family 19h (Zen 4)"),
    # AWS Graviton3 (Neoverse V1): 64 cores, 2.6 GHz, 32 MB LLC, 8 ch DDR5-4800; NEON, SVE
    # (256-bit), FP16, BF16, I8MM, dot product. [AWS Graviton3 / re:Invent 2021; ARM-V1]
    cpu_profile(name="graviton3", display_name="AWS Graviton3 (Neoverse V1)", vendor="arm",
                generation="neoverse_v1", tier="neoverse_v1", cores=64, clock_hz=2.6e9,
                bandwidth_bytes_per_s=_dram(8, 4800), memory_bytes=8 * 32 * GIB,
                llc_bytes=32 * MIB,
                capabilities=frozenset({"neon", "sve", "asimdhp", "asimddp", "bf16", "i8mm"}),
                source="AWS Graviton3 specifications; Arm Neoverse V1 Software Optimization Guide"),
)

CPU_PROFILES: dict[str, HardwareProfile] = {p.name: p for p in _TABLE}


def cpu_profiles() -> list[HardwareProfile]:
    """Reference CPU profiles in table order (the detected host is in registry, not here)."""
    return list(_TABLE)
