"""Detect the machine graphopt runs on: the host CPU (always) and CUDA GPUs (through torch).

Plans must be byte-deterministic, so the host profile is built only from facts that do not
change between runs: the base/max clock (never the fluctuating "cpu MHz"), core counts, ISA
flags, cache sizes and MemTotal. Everything is read defensively: on macOS, in containers
without /sys, or on unknown CPUs detection falls back to documented defaults and never raises.

Host memory bandwidth cannot be read from the OS. We estimate it as

    clamp(6 GB/s x physical cores, 20 GB/s, 200 GB/s)

because one modern core sustains roughly 6-12 GB/s of STREAM triad before the channels
saturate, a single DDR4 channel streams ~20 GB/s, and an 8-channel DDR4-3200 socket peaks at
204.8 GB/s. The estimate errs low, so memory-bound ops are never predicted faster than they run.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import platform
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from graphopt.errors import GraphoptError
from graphopt.hardware.cpus import CPU_PROFILES, cpu_profile
from graphopt.hardware.generations import (
    capabilities_for,
    family_for,
    format_cc,
    generation_for,
    smem_per_sm_bytes,
)
from graphopt.hardware.gpus import GPU_PROFILES, gpu_profiles
from graphopt.hardware.profile import HardwareProfile

__all__ = [
    "HOST_ISA_ENV",
    "CpuInfo",
    "GpuInfo",
    "build_host_profile",
    "detect_cpu",
    "detect_gpus",
    "detect_report",
    "detected_gpu_profiles",
    "estimate_host_bandwidth",
    "gpu_profile_for",
    "host_cpu_info",
    "host_cpu_profile",
    "with_isa_of",
]

logger = logging.getLogger(__name__)

DEFAULT_CLOCK_HZ = 2.0e9  # when no clock is readable (e.g. ARM without cpufreq): a typical base
DEFAULT_RAM_BYTES = 8 * 2**30
_BW_PER_CORE, _BW_FLOOR, _BW_CAP = 6e9, 20e9, 200e9

# /proc/cpuinfo flags we keep. x86 names are the kernel's; on Arm "asimd" is NEON.
_X86_FLAGS = frozenset({
    "sse2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16",
    "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8",
})
_ARM_FLAGS = frozenset({"sve", "sve2", "asimdhp", "asimddp", "bf16", "i8mm"})
# Arm "CPU part" ids (implementer 0x41) with four 128-bit FMA pipes (Arm TRMs).
_ARM_WIDE_PARTS = {"0xd40": "neoverse_v1", "0xd4f": "neoverse_v2"}
_ARM_PART_NAMES = {"0xd0c": "Neoverse N1", "0xd40": "Neoverse V1", "0xd49": "Neoverse N2",
                   "0xd4f": "Neoverse V2"}
_VENDORS = {"GenuineIntel": "intel", "AuthenticAMD": "amd", "0x41": "arm", "0x61": "apple"}


@dataclass(frozen=True)
class CpuInfo:
    """What the OS tells us about the host CPU; every field is stable between runs."""

    model: str
    vendor: str
    arch: str
    physical_cores: int
    logical_cores: int
    flags: frozenset[str]
    clock_hz: float
    clock_source: str
    caches: dict[str, int] = field(default_factory=dict)
    ram_bytes: int = DEFAULT_RAM_BYTES
    arm_part: str | None = None

    @property
    def llc_bytes(self) -> int | None:
        unified = [(int(k[1]), v) for k, v in self.caches.items() if k in ("L2", "L3", "L4")]
        return max(unified)[1] if unified else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "vendor": self.vendor, "arch": self.arch,
            "physical_cores": self.physical_cores, "logical_cores": self.logical_cores,
            "clock_hz": self.clock_hz, "clock_source": self.clock_source,
            "isa": sorted(self.flags), "caches": dict(sorted(self.caches.items())),
            "ram_bytes": self.ram_bytes,
        }


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except (OSError, ValueError):
        return None


def _cpuinfo_blocks(text: str) -> list[dict[str, str]]:
    blocks: list[dict[str, str]] = [{}]
    for line in text.splitlines():
        if not line.strip():
            if blocks[-1]:
                blocks.append({})
            continue
        key, sep, value = line.partition(":")
        if sep:
            blocks[-1][key.strip().lower()] = value.strip()
    return [b for b in blocks if b]


def _size_bytes(text: str) -> int | None:
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)B?\s*", text, flags=re.IGNORECASE)
    if not m:
        return None
    return int(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[m.group(2).upper()]


def _caches(root: Path, blocks: list[dict[str, str]]) -> dict[str, int]:
    caches: dict[str, int] = {}
    base = root / "sys/devices/system/cpu/cpu0/cache"
    for index in sorted(base.glob("index*")) if base.is_dir() else []:
        level, kind = _read(index / "level"), _read(index / "type")
        size = _size_bytes(_read(index / "size") or "")
        if level is None or kind is None or size is None:
            continue
        suffix = {"Data": "d", "Instruction": "i"}.get(kind.strip(), "")
        caches[f"L{level.strip()}{suffix}"] = size
    if not caches and blocks and "cache size" in blocks[0]:  # x86 /proc/cpuinfo: the LLC
        size = _size_bytes(blocks[0]["cache size"])
        if size:
            caches["L3"] = size
    return caches


def _clock(root: Path, model: str) -> tuple[float, str]:
    freq = root / "sys/devices/system/cpu/cpu0/cpufreq"
    base = _read(freq / "base_frequency")
    if base and base.strip().isdigit():
        return int(base) * 1e3, "sysfs base_frequency"
    m = re.search(r"@\s*([\d.]+)\s*GHz", model)
    if m:
        return round(float(m.group(1)) * 1e9, -6), "model name"
    top = _read(freq / "cpuinfo_max_freq")
    if top and top.strip().isdigit():
        return int(top) * 1e3, "sysfs cpuinfo_max_freq"
    return DEFAULT_CLOCK_HZ, "default"


def _ram_bytes(root: Path) -> int:
    m = re.search(r"^MemTotal:\s*(\d+)\s*kB", _read(root / "proc/meminfo") or "", re.MULTILINE)
    if m:
        return int(m.group(1)) * 1024
    if root == Path("/"):
        try:
            return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
        except (ValueError, OSError, AttributeError):
            pass
    return DEFAULT_RAM_BYTES


def detect_cpu(root: Path = Path("/")) -> CpuInfo:
    """Read the host CPU from ``root``/proc and ``root``/sys (``root`` exists for tests)."""
    blocks = _cpuinfo_blocks(_read(root / "proc/cpuinfo") or "")
    first = blocks[0] if blocks else {}
    is_arm = "cpu implementer" in first
    is_x86 = "flags" in first
    arch = "aarch64" if is_arm else "x86_64" if is_x86 else platform.machine().lower() or "unknown"
    raw = set((first.get("flags") or first.get("features") or "").split())
    flags = {f for f in raw if f in _X86_FLAGS or f in _ARM_FLAGS}
    if is_arm or "asimd" in raw or arch in ("aarch64", "arm64"):
        flags.add("neon")  # mandatory in ARMv8-A
    arm_part = first.get("cpu part") if is_arm else None
    model = first.get("model name") or _ARM_PART_NAMES.get(arm_part or "", "")
    model = model or platform.processor() or platform.machine() or "unknown"
    vendor = _VENDORS.get(first.get("vendor_id") or first.get("cpu implementer") or "", "unknown")
    if vendor == "unknown" and platform.system() == "Darwin" and arch == "arm64":
        vendor = "apple"
    processors = [b for b in blocks if "processor" in b]
    logical = len(processors) or os.cpu_count() or 1
    cores = {(b.get("physical id", "0"), b["core id"]) for b in processors if "core id" in b}
    clock, clock_source = _clock(root, model)
    return CpuInfo(model=model, vendor=vendor, arch=arch, physical_cores=len(cores) or logical,
                   logical_cores=logical, flags=frozenset(flags), clock_hz=clock,
                   clock_source=clock_source, caches=_caches(root, blocks),
                   ram_bytes=_ram_bytes(root), arm_part=arm_part)


def _tier(info: CpuInfo) -> str:
    """Pick the cpus.FLOPS_PER_CYCLE row the flags support (conservative where ambiguous)."""
    f = info.flags
    if {"amx_bf16", "amx_int8"} <= f:
        return "amx"
    if "avx512f" in f:
        if info.vendor == "amd":
            return "zen4"  # 256-bit datapaths (Zen 5's full-width units are not told apart)
        return "avx512_vnni" if "avx512_vnni" in f else "avx512"
    if {"avx2", "fma"} <= f:
        return "avx2_fma"
    if "avx" in f:
        return "avx"
    if "neon" in f:
        return "neoverse_v1" if info.arm_part in _ARM_WIDE_PARTS else "neon"
    return "sse2"


def estimate_host_bandwidth(physical_cores: int) -> float:
    """The documented conservative host DRAM bandwidth estimate (module docstring)."""
    return min(max(_BW_PER_CORE * physical_cores, _BW_FLOOR), _BW_CAP)


def build_host_profile(info: CpuInfo) -> HardwareProfile:
    """The ``cpu`` target for a detected CPU; same info -> same profile, byte for byte."""
    tier = _tier(info)
    return cpu_profile(
        name="cpu", display_name=f"{info.model} (host)", vendor=info.vendor, generation=tier,
        tier=tier, cores=info.physical_cores, clock_hz=info.clock_hz,
        bandwidth_bytes_per_s=estimate_host_bandwidth(info.physical_cores),
        memory_bytes=info.ram_bytes, llc_bytes=info.llc_bytes, capabilities=info.flags,
        source=f"detected from /proc and /sys; clock from {info.clock_source}; bandwidth "
               "estimated as clamp(6 GB/s x cores, 20, 200 GB/s)",
    )


#: Names a CPU of the table (``xeon-8380``) whose ISA stands in for the host's: vendor and flags
#: from the table, cores, clock and memory from this machine. It runs graphopt's host
#: decisions (and its tests) as if on that ISA; kernels still run on the real CPU.
HOST_ISA_ENV = "GRAPHOPT_HOST_ISA"


def with_isa_of(info: CpuInfo, name: str) -> CpuInfo:
    """``info`` with the vendor and ISA flags of the table CPU ``name`` (see HOST_ISA_ENV)."""
    ref = CPU_PROFILES.get(name.strip().lower())
    if ref is None:
        raise GraphoptError(f"{HOST_ISA_ENV}={name!r} is not a CPU of graphopt's table",
                            f"use one of: {', '.join(CPU_PROFILES)}; or unset {HOST_ISA_ENV}")
    arm = ref.vendor == "arm"
    return replace(info, model=f"{info.model} with the ISA of {ref.display_name}",
                   vendor=ref.vendor, arch="aarch64" if arm else "x86_64",
                   flags=ref.capabilities, arm_part=next(iter(_ARM_WIDE_PARTS)) if arm else None)


def host_cpu_info() -> CpuInfo:
    """The host as detected, or with a stand-in ISA when ``GRAPHOPT_HOST_ISA`` is set."""
    stand_in = os.environ.get(HOST_ISA_ENV, "").strip()
    return with_isa_of(detect_cpu(), stand_in) if stand_in else detect_cpu()


@functools.cache
def host_cpu_profile() -> HardwareProfile:
    """The detected host CPU, detected once per process."""
    profile = build_host_profile(host_cpu_info())
    logger.debug("host cpu: %s, %d cores, tier %s", profile.display_name, profile.cores,
                 profile.generation)
    return profile


@dataclass(frozen=True)
class GpuInfo:
    """One CUDA device as torch reports it."""

    index: int
    name: str
    compute_capability: tuple[int, int]
    sm_count: int
    memory_bytes: int
    l2_bytes: int | None = None


def detect_gpus() -> list[GpuInfo]:
    """CUDA devices via torch.cuda; [] when torch or CUDA is missing (never raises)."""
    if importlib.util.find_spec("torch") is None:
        return []
    try:
        import torch

        if not torch.cuda.is_available():
            return []
        found = []
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            l2 = getattr(p, "L2_cache_size", None)
            found.append(GpuInfo(i, str(p.name), (int(p.major), int(p.minor)),
                                 int(p.multi_processor_count), int(p.total_memory),
                                 int(l2) if l2 else None))
        return found
    except Exception as exc:  # a broken driver must not break planning
        logger.warning("CUDA detection failed: %s", exc)
        return []


# Device-name patterns (lowercased torch names) -> table profile. A match also needs the same
# cc and SM count, so cut-down or renamed variants (A10G, 3090 Ti, H100 NVL) are estimated.
_NAME_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"v100.*sxm2.*32", "v100"), (r"\bt4\b", "t4"), (r"\ba10\b", "a10"),
    (r"a100.*sxm.*40", "a100-40gb"), (r"a100.*sxm.*80", "a100-80gb"),
    (r"rtx 3090", "rtx-3090"), (r"rtx 4090", "rtx-4090"), (r"\bl4\b", "l4"),
    (r"\bl40s\b", "l40s"), (r"rtx 6000 ada", "rtx-6000-ada"),
    (r"h100.*(sxm|hbm3)", "h100-sxm"), (r"h100.*pcie", "h100-pcie"),
    (r"\bh200\b(?!.*nvl)", "h200"), (r"\bb200\b", "b200"), (r"rtx 5090", "rtx-5090"),
)


def _reference_for(cc: tuple[int, int]) -> HardwareProfile | None:
    for same in (lambda p: p.compute_capability == cc,
                 lambda p: family_for(p.compute_capability) == family_for(cc),
                 lambda p: p.generation == generation_for(cc)):
        for p in gpu_profiles():
            if same(p):
                return p
    return None


def gpu_profile_for(info: GpuInfo) -> HardwareProfile:
    """The table profile for a known device, else one estimated from its cc and properties.

    Estimates scale the peak FLOP/s of the reference part with the same cc (else family, else
    generation) by SM count; bandwidth is the reference's, since torch exposes no memory clock.
    Raises GraphoptError for a cc graphopt does not know.
    """
    lowered = info.name.lower()
    for pattern, name in _NAME_PATTERNS:
        p = GPU_PROFILES[name]
        if (re.search(pattern, lowered) and p.compute_capability == info.compute_capability
                and p.sm_count == info.sm_count):
            return p
    cc = info.compute_capability
    ref = _reference_for(cc)
    if ref is None or not ref.sm_count:
        raise GraphoptError(f"no reference GPU for compute capability {format_cc(cc)}",
                            "add a profile for this generation to graphopt/hardware/gpus.py")
    scale = info.sm_count / ref.sm_count
    return HardwareProfile(
        name=f"cuda:{info.index}", display_name=f"{info.name} (estimated from {ref.name})",
        kind="gpu", vendor="nvidia", generation=generation_for(cc),
        peak_flops={k: v * scale for k, v in ref.peak_flops.items()},
        memory_bytes=info.memory_bytes, bandwidth_bytes_per_s=ref.bandwidth_bytes_per_s,
        host_link=ref.host_link,
        source=f"torch.cuda properties; rates scaled by SM count from {ref.name}",
        compute_capability=cc, sm_count=info.sm_count,
        vector_flops={k: v * scale for k, v in ref.vector_flops.items()},
        l2_bytes=info.l2_bytes, smem_per_sm_bytes=smem_per_sm_bytes(cc),
        capabilities=capabilities_for(cc), launch_overhead_s=ref.launch_overhead_s,
    )


@functools.cache
def detected_gpu_profiles() -> tuple[HardwareProfile, ...]:
    """Profiles of this machine's CUDA devices (skipping ones graphopt cannot describe)."""
    profiles = []
    for info in detect_gpus():
        try:
            profiles.append(gpu_profile_for(info))
        except GraphoptError as exc:
            logger.warning("skipping GPU %d (%s): %s", info.index, info.name, exc.problem)
    return tuple(profiles)


def detect_report() -> dict[str, Any]:
    """JSON-serialisable summary for ``graphopt detect``: cpu facts, gpus, and the cpu target."""
    gpus = []
    for info in detect_gpus():
        entry: dict[str, Any] = {
            "index": info.index, "name": info.name,
            "compute_capability": format_cc(info.compute_capability),
            "sm_count": info.sm_count, "memory_bytes": info.memory_bytes,
            "l2_bytes": info.l2_bytes, "generation": None, "profile": None,
        }
        try:
            profile = gpu_profile_for(info)
            entry["generation"] = family_for(info.compute_capability)
            entry["profile"] = profile.name
            entry["estimated"] = profile.name not in GPU_PROFILES
        except GraphoptError as exc:
            entry["error"] = exc.problem
        gpus.append(entry)
    return {"cpu": host_cpu_info().to_dict(), "gpus": gpus,
            "host_profile": host_cpu_profile().to_dict()}
