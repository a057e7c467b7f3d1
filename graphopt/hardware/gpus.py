"""Datasheet profiles of NVIDIA GPUs.

Conventions (every row follows them):
  * ``peak_flops`` are DENSE peaks. Datasheets since Ampere headline 2:4 structured-sparsity
    figures (footnote "*with sparsity"); we halve those and never store the sparse number.
  * ``fp64`` is the fastest native unit: FP64 tensor cores (DMMA) on A100/H100/H200/B200, CUDA
    cores elsewhere. ``vector_flops`` hold the non-tensor (CUDA core) rates: fp64, fp32, and fp16
    (packed HFMA2) where published. A missing vector ``fp16`` means unpublished: use fp32.
  * GeForce parts (RTX 3090/4090/5090) run FP16/BF16/FP8 tensor ops with FP32 accumulate at
    HALF the FP16-accumulate rate (GA102, Ada and RTX Blackwell whitepapers, "Peak FP16 Tensor
    TFLOPS with FP32 Accumulate"). Frameworks accumulate in FP32, so we store that figure. TF32
    is also halved on GeForce. Datacenter/professional parts run FP32 accumulate at full rate.
  * FP64 on GA10x/AD10x/GB202 parts is 1/64 of FP32 (2 FP64 units per SM; GA102 and Ada
    whitepapers), on TU104 1/32; those rows are derived and say so.
  * ``memory_bytes`` in GiB (NVIDIA's "80 GB" HBM is 80 GiB of which the driver reserves a
    little); ``bandwidth_bytes_per_s`` in decimal GB/s as marketed; ``l2_bytes`` in MiB as
    cudaDeviceProp.l2CacheSize reports. ``None`` = not published by NVIDIA.
  * Links are PER DIRECTION: PCIe from the line rate after 128b/130b encoding; NVLink as half
    of the bidirectional per-GPU datasheet figure.
  * ``launch_overhead_s`` = 5 us: host-side cost of one CUDA kernel launch (an empty kernel
    measures ~2-5 us launch-to-launch; we take the top of that range since graph-level dispatch
    adds to it).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from graphopt.hardware.generations import capabilities_for, generation_for, smem_per_sm_bytes
from graphopt.hardware.profile import HardwareProfile, Link

__all__ = ["GPU_PROFILES", "gpu_profiles", "pcie_link"]

logger = logging.getLogger(__name__)

T = 1e12
GIB = 2**30
MIB = 2**20

# Small transfers over PCIe cost a few microseconds end to end (driver + DMA setup + TLP round
# trip); 5 us is a typical cudaMemcpy latency for a tiny pinned copy. A rough, documented value.
_PCIE_LATENCY_S = 5e-6
# GPU-to-GPU copies over NVLink: the copy-engine launch dominates small transfers; ~2 us.
_NVLINK_LATENCY_S = 2e-6
_PCIE_GT_PER_S = {3: 8e9, 4: 16e9, 5: 32e9}  # PCI-SIG base specs: transfers/s per lane.


def pcie_link(gen: int, lanes: int = 16) -> Link:
    """Per-direction PCIe bandwidth: GT/s x lanes x 128/130 (encoding) / 8 bits.

    gen3 x16 = 15.75 GB/s, gen4 x16 = 31.5 GB/s, gen5 x16 = 63.0 GB/s; real copies reach ~80%.
    """
    bw = _PCIE_GT_PER_S[gen] * lanes * (128 / 130) / 8
    return Link(f"pcie{gen}-x{lanes}", bw, _PCIE_LATENCY_S)


def _nvlink(name: str, bidirectional_bytes_per_s: float) -> Link:
    return Link(name, bidirectional_bytes_per_s / 2, _NVLINK_LATENCY_S)


def _gpu(
    name: str,
    display_name: str,
    cc: tuple[int, int],
    sm_count: int,
    peak: Mapping[str, float],
    vector: Mapping[str, float],
    memory_gib: float,
    bandwidth: float,
    l2_mib: int | None,
    pcie_gen: int,
    source: str,
    peer: Link | None = None,
) -> HardwareProfile:
    caps = set(capabilities_for(cc))
    if peer is not None:
        caps.add("nvlink")
    return HardwareProfile(
        name=name,
        display_name=display_name,
        kind="gpu",
        vendor="nvidia",
        generation=generation_for(cc),
        peak_flops=dict(peak),
        memory_bytes=int(memory_gib * GIB),
        bandwidth_bytes_per_s=bandwidth,
        host_link=pcie_link(pcie_gen),
        source=source,
        compute_capability=cc,
        sm_count=sm_count,
        vector_flops=dict(vector),
        l2_bytes=None if l2_mib is None else l2_mib * MIB,
        smem_per_sm_bytes=smem_per_sm_bytes(cc),
        peer_link=peer,
        capabilities=frozenset(caps),
    )


# The table. Order is the listing order of `graphopt targets` (oldest generation first).
_TABLE: tuple[HardwareProfile, ...] = (
    # Tesla V100 datasheet (SXM2 32GB) + Volta GV100 whitepaper: 80 SMs @ 1530 MHz. Tensor cores
    # are FP16-only (125 TF with FP32 accumulate). INT8 runs only via dp4a on CUDA cores (no
    # datasheet figure), so no int8 entry. Non-tensor FP16 is packed HFMA2 at 2x FP32.
    # NVLink2: 300 GB/s bidirectional per GPU.
    _gpu("v100", "NVIDIA Tesla V100 SXM2 32GB", (7, 0), 80,
         {"fp64": 7.8 * T, "fp32": 15.7 * T, "fp16": 125 * T},
         {"fp64": 7.8 * T, "fp32": 15.7 * T, "fp16": 31.4 * T},
         32, 900e9, 6, 3, "NVIDIA Tesla V100 datasheet; Volta GV100 whitepaper",
         _nvlink("nvlink2", 300e9)),
    # Tesla T4 datasheet + Turing whitepaper (Tesla T4 column): 40 SMs @ 1590 MHz, FP16 tensor
    # 65 TF at full rate with FP32 accumulate, INT8 130, INT4 260 TOPS, 320 GB/s GDDR6, 4 MB L2.
    # FP64 derived: 1/32 of FP32 (TU104: 2 FP64 units per SM).
    _gpu("t4", "NVIDIA Tesla T4", (7, 5), 40,
         {"fp64": 8.1 * T / 32, "fp32": 8.1 * T, "fp16": 65 * T, "int8": 130 * T, "int4": 260 * T},
         {"fp64": 8.1 * T / 32, "fp32": 8.1 * T, "fp16": 16.2 * T},
         16, 320e9, 4, 3, "NVIDIA T4 datasheet; Turing architecture whitepaper"),
    # A10 datasheet (dense = sparse/2): 72 SMs (GA102), FP32 31.2, TF32 62.5, BF16/FP16 125,
    # INT8 250, INT4 500; 600 GB/s; GA102 L2 6 MB (GA102 whitepaper). Professional part: full-rate
    # FP32 accumulate. FP64 derived 1/64; FP16 non-tensor 1:1 with FP32 on GA10x.
    _gpu("a10", "NVIDIA A10", (8, 6), 72,
         {"fp64": 31.2 * T / 64, "fp32": 31.2 * T, "tf32": 62.5 * T, "fp16": 125 * T,
          "bf16": 125 * T, "int8": 250 * T, "int4": 500 * T},
         {"fp64": 31.2 * T / 64, "fp32": 31.2 * T, "fp16": 31.2 * T},
         24, 600e9, 6, 4, "NVIDIA A10 datasheet; GA102 whitepaper"),
    # A100 datasheet (SXM4 40GB) + Ampere GA100 whitepaper: 108 SMs @ 1410 MHz. FP64 tensor 19.5,
    # FP32 19.5, TF32 156, BF16/FP16 312, INT8 624, INT4 1248 (dense). 1555 GB/s HBM2, 40 MB L2.
    # Non-tensor FP16 78 TF. NVLink3 600 GB/s bidirectional.
    _gpu("a100-40gb", "NVIDIA A100 SXM4 40GB", (8, 0), 108,
         {"fp64": 19.5 * T, "fp32": 19.5 * T, "tf32": 156 * T, "fp16": 312 * T, "bf16": 312 * T,
          "int8": 624 * T, "int4": 1248 * T},
         {"fp64": 9.7 * T, "fp32": 19.5 * T, "fp16": 78 * T},
         40, 1555e9, 40, 4, "NVIDIA A100 datasheet; NVIDIA A100 Tensor Core GPU Architecture",
         _nvlink("nvlink3", 600e9)),
    # A100 80GB SXM4: same compute as 40GB (A100 datasheet), HBM2e at 2039 GB/s.
    _gpu("a100-80gb", "NVIDIA A100 SXM4 80GB", (8, 0), 108,
         {"fp64": 19.5 * T, "fp32": 19.5 * T, "tf32": 156 * T, "fp16": 312 * T, "bf16": 312 * T,
          "int8": 624 * T, "int4": 1248 * T},
         {"fp64": 9.7 * T, "fp32": 19.5 * T, "fp16": 78 * T},
         80, 2039e9, 40, 4, "NVIDIA A100 datasheet (80GB SXM)", _nvlink("nvlink3", 600e9)),
    # GeForce RTX 3090, GA102 whitepaper Appendix A: 82 SMs @ 1695 MHz, FP32 35.6; FP16/BF16
    # tensor with FP32 accumulate 71 (FP16 accumulate 142); TF32 35.6; INT8 284; INT4 568;
    # 936 GB/s; 6 MB L2. NVLink3 bridge: 4 x4 links, 112.5 GB/s bidirectional.
    _gpu("rtx-3090", "NVIDIA GeForce RTX 3090", (8, 6), 82,
         {"fp64": 35.6 * T / 64, "fp32": 35.6 * T, "tf32": 35.6 * T, "fp16": 71 * T,
          "bf16": 71 * T, "int8": 284 * T, "int4": 568 * T},
         {"fp64": 35.6 * T / 64, "fp32": 35.6 * T, "fp16": 35.6 * T},
         24, 936e9, 6, 4, "NVIDIA Ampere GA102 GPU architecture whitepaper (RTX 3090)",
         _nvlink("nvlink3-bridge", 112.5e9)),
    # GeForce RTX 4090, Ada Lovelace whitepaper Appendix: 128 SMs @ 2520 MHz, FP32 82.6;
    # FP16/BF16 with FP32 accumulate 165.2 (FP16 accumulate 330.3); FP8 with FP32 accumulate
    # 330.3 (FP16 accumulate 660.6); TF32 82.6; INT8 660.6; INT4 1321.2; 1008 GB/s; 72 MB L2.
    _gpu("rtx-4090", "NVIDIA GeForce RTX 4090", (8, 9), 128,
         {"fp64": 82.6 * T / 64, "fp32": 82.6 * T, "tf32": 82.6 * T, "fp16": 165.2 * T,
          "bf16": 165.2 * T, "fp8": 330.3 * T, "int8": 660.6 * T, "int4": 1321.2 * T},
         {"fp64": 82.6 * T / 64, "fp32": 82.6 * T, "fp16": 82.6 * T},
         24, 1008e9, 72, 4, "NVIDIA Ada Lovelace GPU architecture whitepaper (RTX 4090)"),
    # L4 datasheet (dense = sparse/2): 58 SMs (7424 cores) @ 2040 MHz, FP32 30.3, TF32 60,
    # BF16/FP16 121, FP8 242.5, INT8 242.5 TOPS; 300 GB/s GDDR6. INT4 and L2 not on the datasheet
    # (third parties report 48 MB L2). FP64 derived 1/64.
    _gpu("l4", "NVIDIA L4", (8, 9), 58,
         {"fp64": 30.3 * T / 64, "fp32": 30.3 * T, "tf32": 60 * T, "fp16": 121 * T,
          "bf16": 121 * T, "fp8": 242.5 * T, "int8": 242.5 * T},
         {"fp64": 30.3 * T / 64, "fp32": 30.3 * T, "fp16": 30.3 * T},
         24, 300e9, None, 4, "NVIDIA L4 Tensor Core GPU datasheet"),
    # L40S datasheet (dense column): 142 SMs, FP32 91.6, TF32 183, BF16/FP16 362.05, FP8 733,
    # INT8 733 TOPS; 864 GB/s GDDR6. The datasheet prints INT4 = INT8 = 733, which contradicts
    # the Ada 2x INT4 ratio, so INT4 is left out. L2 not on the datasheet. FP64 derived 1/64.
    _gpu("l40s", "NVIDIA L40S", (8, 9), 142,
         {"fp64": 91.6 * T / 64, "fp32": 91.6 * T, "tf32": 183 * T, "fp16": 362.05 * T,
          "bf16": 362.05 * T, "fp8": 733 * T, "int8": 733 * T},
         {"fp64": 91.6 * T / 64, "fp32": 91.6 * T, "fp16": 91.6 * T},
         48, 864e9, None, 4, "NVIDIA L40S datasheet"),
    # RTX 6000 Ada Generation datasheet: 142 SMs (18176 cores) @ 2505 MHz, FP32 91.1, "Tensor
    # performance 1457.0" = FP8 with sparsity -> 728.5 dense; 960 GB/s GDDR6. The other tensor
    # rates are DERIVED from Ada per-SM ratios at full-rate FP32 accumulate (professional part):
    # FP16/BF16 = FP8/2, TF32 = FP8/4, INT8 = FP8. L2 not on the datasheet. FP64 derived 1/64.
    _gpu("rtx-6000-ada", "NVIDIA RTX 6000 Ada Generation", (8, 9), 142,
         {"fp64": 91.1 * T / 64, "fp32": 91.1 * T, "tf32": 182.1 * T, "fp16": 364.2 * T,
          "bf16": 364.2 * T, "fp8": 728.5 * T, "int8": 728.5 * T},
         {"fp64": 91.1 * T / 64, "fp32": 91.1 * T, "fp16": 91.1 * T},
         48, 960e9, None, 4, "NVIDIA RTX 6000 Ada Generation datasheet"),
    # H100 SXM5, H100 datasheet + Hopper whitepaper (dense): 132 SMs, FP64 33.5 / FP64 tensor
    # 66.9, FP32 66.9, TF32 494.7, BF16/FP16 989.4, FP8 1978.9, INT8 1978.9; non-tensor FP16
    # 133.8; 80 GB HBM3 at 3.35 TB/s; 50 MB L2. NVLink4 900 GB/s bidirectional; PCIe gen5.
    _gpu("h100-sxm", "NVIDIA H100 SXM5 80GB", (9, 0), 132,
         {"fp64": 66.9 * T, "fp32": 66.9 * T, "tf32": 494.7 * T, "fp16": 989.4 * T,
          "bf16": 989.4 * T, "fp8": 1978.9 * T, "int8": 1978.9 * T},
         {"fp64": 33.5 * T, "fp32": 66.9 * T, "fp16": 133.8 * T},
         80, 3.35e12, 50, 5, "NVIDIA H100 Tensor Core GPU datasheet; NVIDIA H100 whitepaper",
         _nvlink("nvlink4", 900e9)),
    # H100 PCIe, Hopper whitepaper (dense): 114 SMs, FP64 25.6 / tensor 51.2, FP32 51.2, TF32
    # 378, BF16/FP16 756, FP8 1513, INT8 1513; non-tensor FP16 102.4; 80 GB HBM2e at 2.0 TB/s
    # (datasheet); 50 MB L2. NVLink bridge: 600 GB/s bidirectional.
    _gpu("h100-pcie", "NVIDIA H100 PCIe 80GB", (9, 0), 114,
         {"fp64": 51.2 * T, "fp32": 51.2 * T, "tf32": 378 * T, "fp16": 756 * T, "bf16": 756 * T,
          "fp8": 1513 * T, "int8": 1513 * T},
         {"fp64": 25.6 * T, "fp32": 51.2 * T, "fp16": 102.4 * T},
         80, 2.0e12, 50, 5, "NVIDIA H100 Tensor Core GPU datasheet; NVIDIA H100 whitepaper",
         _nvlink("nvlink4-bridge", 600e9)),
    # H200 SXM datasheet: same GH100 compute as H100 SXM (FP64 34 / tensor 67, FP32 67, sparse
    # figures twice H100's dense ones); 141 GB HBM3e at 4.8 TB/s; NVLink 900 GB/s; PCIe gen5.
    _gpu("h200", "NVIDIA H200 SXM 141GB", (9, 0), 132,
         {"fp64": 66.9 * T, "fp32": 66.9 * T, "tf32": 494.7 * T, "fp16": 989.4 * T,
          "bf16": 989.4 * T, "fp8": 1978.9 * T, "int8": 1978.9 * T},
         {"fp64": 33.5 * T, "fp32": 66.9 * T, "fp16": 133.8 * T},
         141, 4.8e12, 50, 5, "NVIDIA H200 Tensor Core GPU datasheet", _nvlink("nvlink4", 900e9)),
    # B200 in HGX B200 (1000 W), NVIDIA HGX platform page "Individual Blackwell GPU
    # Specifications" (dense = sparse/2): FP4 9 PF, FP8/FP6 4.5 PF, INT8 4.5 POPS, FP16/BF16
    # 2.25 PF, TF32 1.1 PF, FP32 75 TF, FP64/FP64 tensor 37 TF; 180 GB HBM3e at 7.7 TB/s; NVLink5
    # 1.8 TB/s bidirectional; PCIe gen5. 148 SMs (2 dies x 74). L2 and non-tensor FP16 are not
    # published. (An earlier HGX revision listed 40 TF FP64, 80 TF FP32, 8 TB/s.)
    _gpu("b200", "NVIDIA B200 (HGX)", (10, 0), 148,
         {"fp64": 37 * T, "fp32": 75 * T, "tf32": 1100 * T, "fp16": 2250 * T, "bf16": 2250 * T,
          "fp8": 4500 * T, "int8": 4500 * T, "fp4": 9000 * T},
         {"fp64": 37 * T, "fp32": 75 * T},
         180, 7.7e12, None, 5, "NVIDIA HGX B200 specifications (nvidia.com HGX platform page)",
         _nvlink("nvlink5", 1.8e12)),
    # GeForce RTX 5090, RTX Blackwell (GB202) whitepaper: 170 SMs @ 2407 MHz, FP32 104.8;
    # FP16/BF16 with FP32 accumulate 209.5 (FP16 accumulate 419); FP8 with FP32 accumulate 419;
    # INT8 838; FP4 1676 (dense); TF32 104.8; no INT4 tensor rate. 32 GB GDDR7 at 1792 GB/s;
    # 96 MB L2; PCIe gen5. FP64 derived 1/64; FP16 non-tensor 1:1 as on GA10x/AD10x.
    _gpu("rtx-5090", "NVIDIA GeForce RTX 5090", (12, 0), 170,
         {"fp64": 104.8 * T / 64, "fp32": 104.8 * T, "tf32": 104.8 * T, "fp16": 209.5 * T,
          "bf16": 209.5 * T, "fp8": 419 * T, "int8": 838 * T, "fp4": 1676 * T},
         {"fp64": 104.8 * T / 64, "fp32": 104.8 * T, "fp16": 104.8 * T},
         32, 1792e9, 96, 5, "NVIDIA RTX Blackwell GPU architecture whitepaper (RTX 5090)"),
)

GPU_PROFILES: dict[str, HardwareProfile] = {p.name: p for p in _TABLE}


def gpu_profiles() -> list[HardwareProfile]:
    """All GPU profiles in table order."""
    return list(_TABLE)
