"""The plan's low-bit formats that graphopt's torch module applies (issue 22): per-node decisions
on GPUs (``decisions/precision/gpu_formats.py`` cases 3 and 5), the torch kernels' legality per
device
(``decisions/quantization/torch_kernels.py``), the INT4 group, the formats' table entries and the
torch
modes ``method_blocked`` refuses.

The Llama-like graphs are a 2-layer Llama-2-7B-shaped decoder (hidden 4096, MLP 11008, 32 heads,
8 KV heads) built on the meta device, so nothing is allocated: its decode step at batch 1 (every
weight GEMM a GEMV, memory-bound) and its prefill of 512 tokens (M = 512), traced once and
planned for an H100, a B200, an A100 and a V100.
"""

from __future__ import annotations

import pytest
import torch

import graphopt
from graphopt.decisions import FORMATS, get_format, node_precision, runs_natively
from graphopt.decisions.planner import build_plan
from graphopt.decisions.quant_formats import FORMAT_DTYPE, int4_bits_per_weight
from graphopt.decisions.quantization.choice import method_blocked
from graphopt.decisions.quantization.torch_kernels import (
    INT4_GROUPS,
    KERNEL_OPS,
    MODE_FORMAT,
    TORCH_KERNELS,
    int4_group,
    kernel_refuses,
    torch_kernel_for,
)
from graphopt.hardware import get_target
from graphopt.ir.plan import Decision, Plan, PlanSet
from tests.irbuild import G

transformers = pytest.importorskip("transformers")

TARGETS = ("h100", "b200", "a100", "v100")
LAYERS, HIDDEN, MLP, KV_HEADS, HEAD_DIM, CACHE, PROMPT = 2, 4096, 11008, 8, 128, 1024, 512
#: the Llama layers' Linear nodes in trace order: q, k, v, o, gate, up, down per layer, lm_head
PER_LAYER = ("q", "k", "v", "o", "gate", "up", "down")
ROLES = [*(r for _ in range(LAYERS) for r in PER_LAYER), "lm_head"]


def _llama() -> torch.nn.Module:
    config = transformers.LlamaConfig(
        num_hidden_layers=LAYERS, hidden_size=HIDDEN, num_attention_heads=32,
        num_key_value_heads=KV_HEADS, intermediate_size=MLP, vocab_size=32000,
        max_position_embeddings=4096, tie_word_embeddings=False)
    with torch.device("meta"):
        return transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()


@pytest.fixture(scope="module")
def phases() -> dict[str, PlanSet]:
    from graphopt.frontends.llm_steps import DecodeStep, PrefillStep

    model = _llama()
    with torch.device("meta"):
        token = torch.zeros(1, 1, dtype=torch.long)
        cache = [torch.zeros(LAYERS, 1, KV_HEADS, CACHE, HEAD_DIM, dtype=torch.bfloat16)
                 for _ in range(2)]
        prompt = torch.zeros(1, PROMPT, dtype=torch.long)
    targets = ",".join(TARGETS)
    decode = graphopt.plan(DecodeStep(model), (token, *cache), target=targets)
    prefill = graphopt.plan(PrefillStep(model), (prompt,), target=targets)
    assert isinstance(decode, PlanSet) and isinstance(prefill, PlanSet)
    return {"decode": decode, "prefill": prefill}


def _linears(plan: Plan) -> list[tuple[str, Decision]]:
    """(role, precision decision) of each Linear, in order."""
    nodes = [n for n in plan.nodes if n.op_type == "Linear"]
    assert len(nodes) == len(ROLES)
    return [(role, n.decisions["precision"]) for role, n in zip(ROLES, nodes, strict=True)]


def _plan(phases: dict[str, PlanSet], phase: str, target: str) -> Plan:
    return phases[phase][get_target(target).name]


def _by_role(plan: Plan) -> dict[str, set[tuple[str, str, str | None, int | None]]]:
    """role -> the (format, runs_on, kernel, group) its Linears got, first and last apart."""
    out: dict[str, set[tuple[str, str, str | None, int | None]]] = {}
    lin = _linears(plan)
    for i, (role, d) in enumerate(lin):
        key = "first" if i == 0 else "lm_head" if i == len(lin) - 1 else role
        f = d.detail
        out.setdefault(key, set()).add((f.format, f.runs_on, f.kernel, f.group))
    return out


# --- decode: batch 1, every weight GEMM a memory-bound GEMV -----------------------------------

INT4 = ("int4", "torch", "int4_weight_only", 128)
BF16 = ("bf16", "torch", None, None)


@pytest.mark.parametrize("target", ["h100", "b200", "a100"])
def test_decode_gemvs_take_int4_where_tinygemm_runs(phases, target: str) -> None:
    plan = _plan(phases, "decode", target)
    roles = _by_role(plan)
    # case 2: the first and last weight GEMMs stay at the carrier; k/v (N = 1024) are launch-bound
    assert roles["first"] == roles["lm_head"] == roles["k"] == roles["v"] == {BF16}
    for role in ("q", "o", "gate", "up", "down"):
        assert roles[role] == {INT4}, (role, roles[role])
    d = dict(_linears(plan))["up"]
    assert d.applied and d.detail.baseline == "bf16" and d.detail.speedup > 1.1
    assert "INT4 (weight-only, g128): roofline" in d.reason
    assert "weights at 4.25 bits, activations and the matmul at bf16 (tinygemm)" in d.reason
    assert "graphopt::int4_linear over torch._weight_int4pack_mm" in d.reason
    assert {"kernel": "int4_weight_only", "group": 128, "runs_on": "torch"}.items() \
        <= d.to_dict().items()  # the JSON report carries what the torch pass reads


def test_decode_int4_beats_the_8bit_format_and_nvfp4_by_the_margin(phases) -> None:
    """INT4 over FP8 / INT8 by >= 10 % at M = 1; NVFP4 (plan-only) does not beat INT4 by 10 %,
    so the format graphopt's torch module applies is kept, and the reason says so."""
    up = {t: dict(_linears(_plan(phases, "decode", t)))["up"] for t in ("h100", "b200", "a100")}
    assert "faster than FP8 (E4M3)" in up["h100"].reason
    assert "faster than INT8" in up["a100"].reason
    assert "runs in graphopt's torch module and NVFP4 (plan-only)" in up["b200"].reason


def test_volta_decode_takes_int8_weight_only(phases) -> None:
    """No FP8, INT8 tensor cores or bf16 on a V100: 8-bit weight-only, its matmul in fp32."""
    roles = _by_role(_plan(phases, "decode", "v100"))
    assert roles["first"] == roles["lm_head"] == {("fp16", "torch", None, None)}
    for role in PER_LAYER:
        assert roles[role] == {("int8_weight_only", "torch", "int8_weight_only", None)}, role
    d = dict(_linears(_plan(phases, "decode", "v100")))["gate"]
    assert "activations and the matmul in fp32 on the CUDA cores" in d.reason
    assert "graphopt::int8_weight_only_linear over torch._weight_int8pack_mm" in d.reason


# --- prefill: M = 512 ---------------------------------------------------------------------------

FP8 = ("fp8_e4m3", "torch", "fp8_e4m3", None)
INT8 = ("int8", "torch", "int8_dynamic", None)
NVFP4 = ("nvfp4", "plan-only", None, None)


@pytest.mark.parametrize(("target", "expect"), [
    ("h100", {r: FP8 for r in PER_LAYER}),
    ("a100", {r: INT8 for r in PER_LAYER}),
    # k and v (N = 1024) are launch-bound on a B200; the rest weight-heavy enough for NVFP4
    ("b200", {"k": BF16, "v": BF16, **{r: NVFP4 for r in ("q", "o", "gate", "up", "down")}}),
    ("v100", {r: ("fp16", "torch", None, None) for r in PER_LAYER}),
])
def test_prefill_gemms(phases, target: str, expect: dict) -> None:
    roles = _by_role(_plan(phases, "prefill", target))
    for role, fmt in expect.items():
        assert roles[role] == {fmt}, (role, roles[role])


def test_prefill_reasons_name_who_runs_the_format(phases) -> None:
    h100 = dict(_linears(_plan(phases, "prefill", "h100")))["up"]
    assert "graphopt::fp8_linear over torch._scaled_mm" in h100.reason
    assert "INT4 (weight-only, g128) saves weight bytes only: not for a compute-bound GEMM" \
        in h100.reason
    a100 = dict(_linears(_plan(phases, "prefill", "a100")))["up"]
    assert "graphopt::int8_dynamic_linear over torch._int_mm" in a100.reason
    b200 = dict(_linears(_plan(phases, "prefill", "b200")))["up"]
    assert "which graphopt's torch module runs (>= 10%)" in b200.reason
    assert "plan-only: torch has no NVFP4 kernel" in b200.reason
    v100 = dict(_linears(_plan(phases, "prefill", "v100")))["up"]
    assert "no FP8 or INT8 tensor cores on volta" in v100.reason


# --- a node torch's kernel refuses ------------------------------------------------------------

def _mid(target: str, m: int, k: int, n: int, dtype: str = "bf16", op: str = "Linear"
         ) -> Decision:
    """The decision on the middle one (K = k, N = n) of three weight GEMMs
    x[m, n] -> [m, k] -> [m, n] -> [m, k] (the first and last stay at the carrier, case 2)."""
    g = G()
    x = g.input("x", (m, n), dtype)
    for i, (a, b) in enumerate([(n, k), (k, n), (n, k)]):
        w = g.param(f"w{i}", (b, a) if op == "Linear" else (a, b), dtype)
        x = g.op(op, [x, w], (m, b), dtype, name=f"fc{i}")
    plan = build_plan(g.build([x]), get_target(target))
    return node_precision(plan.node("fc1"), get_target(target))


def test_fp16_activations_are_refused_by_tinygemm_and_the_next_format_is_taken() -> None:
    """An fp16 model keeps fp16 as its carrier; CUDA's int4 kernel takes bf16 only."""
    d = _mid("a100", 1, 4096, 4096, "fp16")
    assert (d.detail.format, d.detail.runs_on, d.detail.kernel) == \
        ("int8", "torch", "int8_dynamic")
    assert "torch's kernel refuses the node (fp16 activations: tinygemm (CUDA int4) takes bf16 " \
           "only" in d.reason
    h = _mid("h100", 1, 4096, 4096, "fp16")
    assert h.detail.format == "fp8_e4m3" and "tinygemm" in h.reason


def test_a_shape_no_kernel_takes_keeps_the_carrier_with_each_reason() -> None:
    """N = 4104: FP8 needs N % 16 (tensor-core alignment) and the int4 packing N % 16."""
    d = _mid("h100", 1, 4096, 4104)
    assert d.detail.format == "bf16" and d.detail.kernel is None
    assert "FP8 (E4M3) needs K and N multiples of 16" in d.reason
    assert "N=4104: the int4 weight packing needs N divisible by 16" in d.reason
    k = _mid("h100", 1, 4104, 4096)  # K = 4104 splits into no int4 group
    assert "INT4: K=4104 splits into no group of 32, 64, 128, 256" in k.reason


def test_a_k_that_splits_into_64_but_not_128_takes_group_64() -> None:
    d = _mid("a100", 1, 4160, 4096)  # 4160 = 65 x 64
    assert (d.detail.format, d.detail.group) == ("int4", 64)
    assert "INT4 (weight-only, g64)" in d.reason and "weights at 4.5 bits" in d.reason


def test_a_low_bit_matmul_is_plan_only_torch_replaces_linear_only() -> None:
    """Must not fire: torch's kernels replace aten.linear, so a MatMul is never "torch" (and
    gets no weight-only candidate)."""
    d = _mid("h100", 4096, 4096, 4096, op="MatMul")
    assert d.detail.format == "fp8_e4m3" and d.detail.runs_on == "plan-only"
    assert d.detail.kernel is None and "replace nn.Linear only, not MatMul" in d.reason
    gemv = _mid("h100", 1, 4096, 4096, op="MatMul")
    assert gemv.detail.format == "fp8_e4m3" and "INT4" not in gemv.reason


def test_the_cpu_path_is_unchanged() -> None:
    """Must not fire on CPUs: INT8 by cost (case 4) with torch's dynamic INT8 pass, no kernel
    key (``backends/torch/quantize.py`` runs it, not the GPU kernels)."""
    cpu = get_target("xeon-8380")
    g = G()
    x = g.input("x", (4096, 4096), "fp32")
    for i in range(3):
        x = g.op("Linear", [x, g.param(f"w{i}", (4096, 4096), "fp32")], (4096, 4096), "fp32",
                 name=f"fc{i}")
    d = node_precision(build_plan(g.build([x]), cpu).node("fc1"), cpu)
    assert (d.detail.format, d.detail.runs_on) == ("int8", "torch")
    assert d.detail.kernel is None and d.detail.group is None


# --- kernel legality per device -----------------------------------------------------------------

@pytest.mark.parametrize(("kernel", "k", "n", "act", "group", "device", "why"), [
    # dynamic INT8: any K, N on the CPU (measured); cuBLASLt wants K, N % 8 on CUDA
    ("int8_dynamic", 4100, 4100, "bf16", None, "cpu", None),
    ("int8_dynamic", 4100, 4096, "bf16", None, "cuda", "multiples of 8"),
    ("int8_dynamic", 4096, 4100, "fp16", None, "cuda", "multiples of 8"),
    ("int8_dynamic", 4104, 4104, "bf16", None, "cuda", None),
    # FP8: K, N % 16 everywhere; graphopt::fp8_linear writes bf16 (what CUDA's row-wise scaled
    # GEMM writes) and casts, so fp32 activations run on both devices
    ("fp8_e4m3", 4096, 4096, "fp32", None, "cpu", None),
    ("fp8_e4m3", 4096, 4096, "fp32", None, "cuda", None),
    ("fp8_e4m3", 4104, 4096, "fp16", None, "cpu", "multiples of 16"),
    ("fp8_e4m3", 4096, 4104, "bf16", None, "cuda", "multiples of 16"),
    # INT4: the CPU rules, plus tinygemm's bf16-only activations on CUDA
    ("int4_weight_only", 4096, 4096, "fp16", 128, "cpu", None),
    ("int4_weight_only", 4096, 4096, "fp16", 128, "cuda", "takes bf16 only"),
    ("int4_weight_only", 4096, 4096, "bf16", 128, "cuda", None),
    ("int4_weight_only", 4096, 4104, "bf16", 128, "cuda", "N divisible by 16"),
    ("int4_weight_only", 4160, 4096, "bf16", 128, "cuda", "does not split into groups of 128"),
    # 8-bit weight-only: CUDA's kernel has no shape rule; the CPU's bf16 crash rule still holds
    ("int8_weight_only", 250, 256, "fp16", None, "cuda", None),
    ("int8_weight_only", 250, 256, "bf16", None, "cuda", "crashes on bf16 activations"),
    ("nvfp4", 4096, 4096, "bf16", None, "cuda", "no torch kernel"),
])
def test_kernel_refuses_per_device(kernel: str, k: int, n: int, act: str, group: int | None,
                                   device: str, why: str | None) -> None:
    got = kernel_refuses(kernel, k, n, act, group, device=device)
    assert (got is None) if why is None else (got is not None and why in got), got


def test_kernel_refuses_an_unknown_device() -> None:
    with pytest.raises(ValueError, match="device"):
        kernel_refuses("fp8_e4m3", 16, 16, "bf16", device="mps")


@pytest.mark.parametrize(("k", "preferred", "group"), [
    (4096, 128, 128), (11008, 128, 128), (384, 128, 128), (4160, 128, 64), (320, 128, 64),
    (96, 128, 32), (4104, 128, None), (0, 128, None), (4096, 64, 64), (512, 256, 256),
    (4096, 48, 256),  # a group the kernels do not take is not preferred: the largest that fits
])
def test_int4_group(k: int, preferred: int, group: int | None) -> None:
    assert int4_group(k, preferred) == group
    if group is not None:
        assert group in INT4_GROUPS and kernel_refuses("int4_weight_only", k, 4096, "bf16",
                                                       group, device="cuda") is None


def test_modes_formats_and_kernels_map_onto_each_other() -> None:
    assert MODE_FORMAT == {"fp8": "fp8_e4m3", "int8_dynamic": "int8", "int4": "int4",
                           "int8_weight_only": "int8_weight_only"}
    assert {torch_kernel_for(f) for f in MODE_FORMAT.values()} == set(TORCH_KERNELS)
    assert all(f in FORMATS for f in MODE_FORMAT.values()) and set(KERNEL_OPS) == set(TORCH_KERNELS)
    for fmt in ("nvfp4", "q4_k_m", "bf16", "fp32"):
        assert torch_kernel_for(fmt) is None


# --- the formats' table -------------------------------------------------------------------------

def test_int4_and_int8_weight_only_formats() -> None:
    int4, w8 = get_format("int4"), get_format("int8_weight_only")
    assert (int4.display, int4.bits_per_weight, int4.weight_only) == \
        ("INT4 (weight-only, g128)", 4.25, True)
    assert int4_bits_per_weight(128) == 4.25 and int4_bits_per_weight(32) == 5.0
    assert (w8.bits_per_weight, w8.weight_only, w8.activations_quantized) == (8.0, True, False)
    assert get_format("int4_weight_only") is int4 and get_format("w8a16") is w8
    # the cost dtype is the matmul's: tinygemm's bf16, the CUDA 8-bit kernel's fp32
    assert FORMAT_DTYPE["int4"] == "bf16" and FORMAT_DTYPE["int8_weight_only"] == "fp32"
    assert runs_natively(int4, get_target("a100"))[0]
    assert not runs_natively(int4, get_target("t4"))[0]  # no bf16: tinygemm is sm_80+
    ok, why = runs_natively(int4, get_target("xeon-8380"))
    assert ok and "torch's kernel" in why
    assert runs_natively(w8, get_target("v100"))[0]


# --- method_blocked: the torch modes ----------------------------------------------------------

V100, T4, A100 = get_target("v100"), get_target("t4"), get_target("a100")


@pytest.mark.parametrize(("mode", "target", "backend", "blocked"), [
    ("int8_dynamic", V100, "torch", "no int8 tensor cores"),
    ("int8_dynamic", T4, "torch", None),
    ("int8_dynamic", get_target("xeon-8380"), "torch", None),  # the CPU's own dynamic pass
    ("int4", T4, "torch", "has no bf16"),
    ("int4", V100, "torch", "has no bf16"),
    ("int4", A100, "torch", None),
    ("int4", get_target("xeon-8380"), "torch", None),  # torch's CPU int4 kernel
    ("fp8", A100, "torch", "has no FP8 tensor cores"),
    ("int8_weight_only", V100, "torch", None),
    # the ONNX backend's answers are unchanged (MatMulNBits, ORT's integer kernels)
    ("int4", T4, "onnx", None),
    ("int8_dynamic", V100, "onnx", None),
])
def test_method_blocked_for_the_torch_modes(mode: str, target, backend: str,
                                            blocked: str | None) -> None:
    got = method_blocked(mode, "Linear" if backend == "torch" else "MatMul", target,
                         backend=backend)
    assert (got is None) if blocked is None else (got is not None and blocked in got), got
    if backend == "onnx":
        assert method_blocked(mode, "MatMul", target) == got  # the default is ONNX's


def test_method_blocked_names_its_backends() -> None:
    with pytest.raises(ValueError, match="backend"):
        method_blocked("int4", "Linear", A100, backend="tensorrt")
