"""Hardware database: generations, capability sets, datasheet numbers, lookup, detection."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphopt.errors import GraphoptError, UnknownTargetError
from graphopt.hardware import (
    capabilities_for,
    detect_report,
    family_for,
    generation_for,
    get_target,
    list_targets,
    registry,
    target_names,
)
from graphopt.hardware.cpus import cpu_profiles
from graphopt.hardware.detect import (
    GpuInfo,
    build_host_profile,
    detect_cpu,
    estimate_host_bandwidth,
    gpu_profile_for,
)
from graphopt.hardware.generations import parse_cc, smem_per_sm_bytes
from graphopt.hardware.gpus import gpu_profiles, pcie_link
from graphopt.hardware.profile import HardwareProfile

KIB, GIB = 2**10, 2**30
DTYPE_KEYS = {"fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "int8", "int4", "fp4"}
# GPU peak keys that exist only with the matching capability.
GPU_KEY_NEEDS = {"tf32": "tf32", "bf16": "bf16", "fp16": "tensor_cores", "fp8": "fp8",
                 "int8": "int8_tensor", "int4": "int4_tensor", "fp4": "fp4"}
CPU_KEY_NEEDS = {"bf16": {"avx512_bf16", "amx_bf16", "bf16"}, "fp16": {"avx512_fp16", "asimdhp"}}


# --- generations -----------------------------------------------------------------------------

@pytest.mark.parametrize("cc, generation", [
    ((7, 0), "volta"), ((7, 2), "volta"), ((7, 5), "turing"), ((8, 0), "ampere"),
    ((8, 6), "ampere"), ((8, 7), "ampere"), ((8, 9), "ada"), ((9, 0), "hopper"),
    ((10, 0), "blackwell"), ((10, 3), "blackwell"), ((12, 0), "blackwell"),
])
def test_generation_for(cc: tuple[int, int], generation: str) -> None:
    assert generation_for(cc) == generation


def test_blackwell_families_differ() -> None:
    assert family_for((10, 0)) == "blackwell_datacenter"
    assert family_for((12, 0)) == "blackwell_consumer"
    assert family_for((9, 0)) == "hopper"


@pytest.mark.parametrize("text, cc", [("9.0", (9, 0)), ("sm_90a", (9, 0)), ("sm_120", (12, 0)),
                                      ("sm_100a", (10, 0)), (8.9, (8, 9)), ((8, 6), (8, 6))])
def test_parse_cc(text: object, cc: tuple[int, int]) -> None:
    assert parse_cc(text) == cc  # type: ignore[arg-type]


@pytest.mark.parametrize("cc", [(6, 1), (11, 0), (8, 8), "hopper"])
def test_unknown_cc_is_a_clear_error(cc: object) -> None:
    with pytest.raises(GraphoptError, match="compute capability"):
        capabilities_for(cc)  # type: ignore[arg-type]


def test_capabilities_per_architecture() -> None:
    volta, ada, hopper = capabilities_for((7, 0)), capabilities_for((8, 9)), capabilities_for("9.0")
    assert "tensor_cores" in volta and not {"bf16", "tf32", "int8_tensor"} & volta
    assert {"int8_tensor", "int4_tensor"} <= capabilities_for((7, 5))
    assert {"tf32", "bf16", "async_copy"} <= capabilities_for((8, 6))
    assert "fp8" in ada and not {"tma", "wgmma", "thread_block_clusters"} & ada
    assert {"tma", "wgmma", "fp8", "thread_block_clusters", "distributed_shared_memory"} <= hopper
    assert not {"tcgen05", "tmem", "fp4"} & hopper
    dc, consumer = capabilities_for((10, 0)), capabilities_for((12, 0))
    assert {"tcgen05", "tmem", "fp4", "fp6", "fp8", "tma"} <= dc and "wgmma" not in dc
    assert {"fp4", "fp6", "fp8", "tma"} <= consumer
    assert not {"wgmma", "tcgen05", "tmem"} & consumer


def test_smem_per_sm() -> None:
    expected = {(7, 0): 96, (7, 5): 64, (8, 0): 164, (8, 6): 100, (8, 9): 100, (9, 0): 228,
                (10, 0): 228, (12, 0): 100}
    for cc, kib in expected.items():
        assert smem_per_sm_bytes(cc) == kib * KIB


# --- the tables ------------------------------------------------------------------------------

ALL = [*gpu_profiles(), *cpu_profiles()]


@pytest.mark.parametrize("p", ALL, ids=lambda p: p.name)
def test_profile_is_well_formed(p: HardwareProfile) -> None:
    assert set(p.peak_flops) <= DTYPE_KEYS and "fp32" in p.peak_flops
    assert all(isinstance(v, float) and v > 0 for v in p.peak_flops.values())
    assert all(isinstance(v, float) and v > 0 for v in p.vector_flops.values())
    assert isinstance(p.memory_bytes, int) and p.memory_bytes > 0
    assert p.bandwidth_bytes_per_s > 0 and p.host_link.bandwidth_bytes_per_s > 0
    assert p.source and p.display_name
    json.dumps(p.to_dict(), allow_nan=False)


@pytest.mark.parametrize("p", gpu_profiles(), ids=lambda p: p.name)
def test_gpu_peaks_match_capabilities(p: HardwareProfile) -> None:
    cc = p.compute_capability
    assert p.kind == "gpu" and cc is not None and p.sm_count and p.cores is None
    assert p.generation == generation_for(cc)
    assert capabilities_for(cc) <= p.capabilities
    assert p.smem_per_sm_bytes == smem_per_sm_bytes(cc)
    for key, capability in GPU_KEY_NEEDS.items():
        if key in p.peak_flops:
            assert p.has(capability), f"{p.name} lists {key} without {capability}"
    # Tensor cores are faster than CUDA cores; narrower types are never slower.
    assert p.peak_flops["fp16"] >= p.peak_flops["fp32"]
    assert p.peak_flops["fp16"] > p.vector_flops["fp32"]
    if "fp8" in p.peak_flops:
        assert p.peak_flops["fp8"] >= p.peak_flops["fp16"]
    if "fp4" in p.peak_flops:
        assert p.peak_flops["fp4"] >= p.peak_flops["fp8"]
    assert p.vector_flops["fp32"] == p.peak_flops["fp32"]
    assert ("nvlink" in p.capabilities) == (p.peer_link is not None)


@pytest.mark.parametrize("p", cpu_profiles(), ids=lambda p: p.name)
def test_cpu_profiles(p: HardwareProfile) -> None:
    assert p.kind == "cpu" and p.compute_capability is None and p.sm_count is None
    assert p.cores and p.cores > 1 and p.smem_per_sm_bytes is None
    for key, flags in CPU_KEY_NEEDS.items():
        if key in p.peak_flops:
            assert flags & p.capabilities, f"{p.name} lists {key} without {flags}"
    assert p.peak_flops["fp64"] * 2 == p.peak_flops["fp32"]


def test_datasheet_spot_checks() -> None:
    h100, a100 = get_target("h100-sxm"), get_target("a100-80gb")
    assert h100.peak_flops["bf16"] == pytest.approx(989.4e12)
    assert h100.peak_flops["fp8"] == pytest.approx(1978.9e12)  # dense, not 3958 sparse
    assert h100.bandwidth_bytes_per_s == pytest.approx(3.35e12)
    assert h100.memory_bytes == 80 * GIB and h100.sm_count == 132
    assert h100.peer_link is not None and h100.peer_link.bandwidth_bytes_per_s == 450e9
    assert a100.peak_flops["bf16"] == pytest.approx(312e12)
    assert a100.bandwidth_bytes_per_s == pytest.approx(2.039e12)
    assert get_target("a100-40gb").bandwidth_bytes_per_s == pytest.approx(1.555e12)
    assert get_target("v100").peak_flops["fp16"] == pytest.approx(125e12)
    assert get_target("h200").bandwidth_bytes_per_s == pytest.approx(4.8e12)
    # GeForce: FP32-accumulate tensor rate, half the FP16-accumulate one.
    assert get_target("rtx-4090").peak_flops["bf16"] == pytest.approx(165.2e12)
    assert get_target("rtx-3090").peak_flops["fp16"] == pytest.approx(71e12)
    assert get_target("rtx-5090").peak_flops["bf16"] == pytest.approx(209.5e12)
    assert pcie_link(4).bandwidth_bytes_per_s == pytest.approx(31.5e9, rel=1e-3)


def test_dtype_availability() -> None:
    v100, t4 = get_target("v100"), get_target("t4")
    assert not {"bf16", "tf32", "fp8", "int8"} & set(v100.peak_flops) and not v100.has("bf16")
    assert not {"bf16", "tf32", "fp8"} & set(t4.peak_flops) and "int8" in t4.peak_flops
    for p in gpu_profiles():
        assert ("fp4" in p.peak_flops) == (p.generation == "blackwell")
        if "fp8" in p.peak_flops:
            assert p.generation in ("ada", "hopper", "blackwell")
    b200 = get_target("b200")
    assert {"tcgen05", "tmem", "fp4"} <= b200.capabilities and not b200.has("wgmma")
    rtx5090 = get_target("rtx-5090")
    assert rtx5090.has("fp4") and not {"wgmma", "tcgen05", "tmem"} & rtx5090.capabilities
    assert get_target("h100").has("wgmma") and get_target("l40s").has("fp8")
    assert not get_target("l4").has("tma")


def test_amx_cpu_has_matrix_rates() -> None:
    spr = get_target("sapphire-rapids")
    assert spr.has("amx_bf16") and spr.peak_flops["bf16"] > 10 * spr.peak_flops["fp32"]
    assert "bf16" not in get_target("epyc-7763").peak_flops


# --- registry --------------------------------------------------------------------------------

@pytest.mark.parametrize("alias, name", [
    ("h100", "h100-sxm"), ("H100", "h100-sxm"), ("a100", "a100-80gb"), ("h200", "h200"),
    ("v100", "v100"), ("4090", "rtx-4090"), ("rtx4090", "rtx-4090"), ("RTX_4090", "rtx-4090"),
    (" L40S ", "l40s"), ("l4", "l4"), ("b200", "b200"), ("5090", "rtx-5090"),
    ("genoa", "epyc-9654"), ("spr", "xeon-8480"),
])
def test_aliases(alias: str, name: str) -> None:
    assert get_target(alias).name == name


def test_host_aliases() -> None:
    assert get_target("cpu") is get_target("HOST")
    assert get_target("cpu").kind == "cpu" and get_target("cpu").name == "cpu"


def test_unknown_target_lists_names_and_suggests() -> None:
    with pytest.raises(UnknownTargetError) as info:
        get_target("rtx-4900")
    text = str(info.value)
    assert "h100-sxm" in text and "epyc-9654" in text and "'rtx-4090'" in text


def test_gpu_alias_without_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "detected_gpu_profiles", lambda: ())
    with pytest.raises(UnknownTargetError, match="0 usable CUDA"):
        get_target("cuda")
    h100 = get_target("h100")
    monkeypatch.setattr(registry, "detected_gpu_profiles", lambda: (h100,))
    assert get_target("gpu") is h100 and get_target("cuda:0") is h100


def test_list_targets_is_stable() -> None:
    names = [p.name for p in list_targets()]
    assert names == target_names() == [p.name for p in list_targets()]
    assert len(set(names)) == len(names) and names[-1] == "cpu"


# --- detection -------------------------------------------------------------------------------

def test_host_detection_is_deterministic() -> None:
    first = build_host_profile(detect_cpu()).to_dict()
    second = build_host_profile(detect_cpu()).to_dict()
    assert first == second
    assert first["kind"] == "cpu" and first["cores"] >= 1 and first["peak_flops"]["fp32"] > 0


def test_detect_report_is_json() -> None:
    report = detect_report()
    text = json.dumps(report, allow_nan=False, sort_keys=True)
    assert json.loads(text)["cpu"]["physical_cores"] >= 1
    assert isinstance(report["gpus"], list)


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_x86_clock_is_base_not_cpu_mhz(tmp_path: Path) -> None:
    block = ("processor\t: {i}\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) "
             "Platinum 8480+\ncpu MHz\t\t: {mhz}\nphysical id\t: 0\ncore id\t\t: {core}\n"
             "flags\t\t: fpu sse2 avx avx2 fma f16c avx512f avx512_vnni avx512_bf16 amx_bf16 "
             "amx_int8 amx_tile\n\n")
    cache = "sys/devices/system/cpu/cpu0/cache/"
    _write(tmp_path, {
        "proc/cpuinfo": "".join(block.format(i=i, mhz=3123.4 + i, core=i // 2) for i in range(4)),
        "proc/meminfo": "MemTotal:       16384000 kB\n",
        "sys/devices/system/cpu/cpu0/cpufreq/base_frequency": "2000000\n",
        "sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq": "3800000\n",
        cache + "index0/level": "1\n", cache + "index0/type": "Data\n",
        cache + "index0/size": "48K\n", cache + "index3/level": "3\n",
        cache + "index3/type": "Unified\n", cache + "index3/size": "107520K\n",
    })
    info = detect_cpu(tmp_path)
    assert (info.physical_cores, info.logical_cores, info.vendor) == (2, 4, "intel")
    assert info.clock_hz == 2.0e9 and info.clock_source == "sysfs base_frequency"
    assert info.caches == {"L1d": 48 * KIB, "L3": 107520 * KIB}
    profile = build_host_profile(info)
    assert profile.generation == "amx" and profile.l2_bytes == 107520 * KIB
    assert profile.peak_flops["bf16"] == 2 * 2.0e9 * 1024
    assert profile.memory_bytes == 16384000 * 1024
    assert profile.bandwidth_bytes_per_s == estimate_host_bandwidth(2) == 20e9


def test_arm_detection(tmp_path: Path) -> None:
    block = ("processor\t: {i}\nBogoMIPS\t: 2100.00\nFeatures\t: fp asimd asimdhp asimddp sve "
             "bf16 i8mm\nCPU implementer\t: 0x41\nCPU part\t: 0xd40\n\n")
    _write(tmp_path, {"proc/cpuinfo": "".join(block.format(i=i) for i in range(8))})
    info = detect_cpu(tmp_path)
    assert info.arch == "aarch64" and info.vendor == "arm" and info.model == "Neoverse V1"
    assert {"neon", "sve", "bf16"} <= info.flags and info.physical_cores == 8
    assert info.clock_source == "default"
    profile = build_host_profile(info)
    assert profile.generation == "neoverse_v1" and "bf16" in profile.peak_flops


def test_detection_without_proc_does_not_crash(tmp_path: Path) -> None:
    info = detect_cpu(tmp_path)
    profile = build_host_profile(info)
    assert profile.cores and profile.cores >= 1 and profile.peak_flops["fp32"] > 0
    assert build_host_profile(detect_cpu(tmp_path)).to_dict() == profile.to_dict()


def test_gpu_name_mapping() -> None:
    def info(name: str, cc: tuple[int, int], sms: int) -> GpuInfo:
        return GpuInfo(0, name, cc, sms, 80 * GIB, None)

    assert gpu_profile_for(info("NVIDIA H100 80GB HBM3", (9, 0), 132)).name == "h100-sxm"
    assert gpu_profile_for(info("NVIDIA H100 PCIe", (9, 0), 114)).name == "h100-pcie"
    assert gpu_profile_for(info("NVIDIA A100-SXM4-80GB", (8, 0), 108)).name == "a100-80gb"
    assert gpu_profile_for(info("NVIDIA L40S", (8, 9), 142)).name == "l40s"
    assert gpu_profile_for(info("NVIDIA L4", (8, 9), 58)).name == "l4"
    assert gpu_profile_for(info("NVIDIA A10", (8, 6), 72)).name == "a10"
    a10g = gpu_profile_for(info("NVIDIA A10G", (8, 6), 80))  # not in the table: estimated
    assert a10g.name == "cuda:0" and a10g.generation == "ampere"
    assert a10g.peak_flops["fp16"] == pytest.approx(125e12 * 80 / 72)
    assert a10g.memory_bytes == 80 * GIB and a10g.capabilities == capabilities_for((8, 6))
    with pytest.raises(GraphoptError):
        gpu_profile_for(info("Tesla P100", (6, 0), 56))
