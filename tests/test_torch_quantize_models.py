"""The plan's low-bit formats in the torch artifact (issue 22): tiny Llama, Mistral and Qwen2
causal LMs and a CNN, optimized with FP8, INT4 and INT8 for the h100, b200 and a100 decisions.

Each artifact is checked three ways:

1. On this CPU with torch's real kernels: its outputs against the original model within the
   format's budget (``decisions.tolerance``), and at least one Linear actually lowered.
2. On "CUDA" without a GPU: the module as ``load(device="cuda")`` leaves it (INT4 re-packed
   in CUDA's layout), run with every tensor a fake CUDA tensor: the meta kernels check the
   layouts, a tensor left on the CPU raises.
3. Saved, then loaded in a fresh process (graphopt and torch only): equal outputs.

FP8 on an A100 (no FP8 tensor cores) is refused with its reason; a layer whose shape a kernel
cannot take keeps its float format with the kernel's reason.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

import graphopt
from graphopt.backends.torch.quant_ops import QUANT_OPS, int4_from_saved, int4_to_saved
from graphopt.decisions.quantization.torch_kernels import MODE_FORMAT, torch_kernel_for
from graphopt.decisions.tolerance import tolerance_for

VOCAB, SEQ = 256, 8
TARGETS = ("h100", "b200", "a100")
MODES = ("fp8", "int4", "int8_dynamic")
#: the formats each target's tensor cores run (FP8 needs cc 8.9+: not an A100)
RUNS = {(t, m) for t in TARGETS for m in MODES} - {("a100", "fp8")}


class CausalLM(nn.Module):
    """The logits of a transformers causal LM (no cache): a plain tensor output."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False).logits


def _causal_lm(config_cls: str, model_cls: str, **extra: Any) -> nn.Module:
    import transformers

    torch.manual_seed(0)
    config = getattr(transformers, config_cls)(
        num_hidden_layers=2, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=256, vocab_size=VOCAB, max_position_embeddings=64,
        tie_word_embeddings=False, **extra)
    return CausalLM(getattr(transformers, model_cls)(config)).eval()


class ConvNet(nn.Module):
    """Convolutions (no low-bit torch kernel: they stay float) and a two-Linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),
                                      nn.Conv2d(32, 64, 3, padding=1, stride=2), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean((2, 3)))


def _models() -> dict[str, tuple[nn.Module, tuple[torch.Tensor, ...]]]:
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    return {"llama": (_causal_lm("LlamaConfig", "LlamaForCausalLM"), (ids,)),
            "mistral": (_causal_lm("MistralConfig", "MistralForCausalLM", sliding_window=4),
                        (ids,)),
            "qwen2": (_causal_lm("Qwen2Config", "Qwen2ForCausalLM"), (ids,)),
            "cnn": (ConvNet().eval(), (torch.randn(2, 3, 16, 16),))}


@pytest.fixture(scope="module")
def built() -> dict[str, Any]:
    """Every (model, target, mode) optimized once; the models and their example inputs."""
    models = _models()
    out: dict[str, Any] = {"models": models, "opts": {}}
    for name, (model, args) in models.items():
        for target, mode in sorted(RUNS):
            out["opts"][name, target, mode] = graphopt.optimize(
                model, args, target=target, quantize=mode, measure=False)
    return out


def _lowered(opt: graphopt.Optimized, mode: str) -> list[str]:
    op = QUANT_OPS[torch_kernel_for(MODE_FORMAT[mode])]
    return [n.name for n in opt.module.graph_module.graph.nodes if n.target is op]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama", "mistral", "qwen2", "cnn"])
@pytest.mark.parametrize("target,mode", sorted(RUNS))
def test_runs_here_within_its_budget(built: dict[str, Any], name: str, target: str,
                                     mode: str) -> None:
    """Case 1: torch's real kernels on this CPU, against the original model."""
    model, args = built["models"][name]
    opt = built["opts"][name, target, mode]
    assert "quantize" in opt.info.passes_applied, opt.info.passes_reverted
    assert _lowered(opt, mode), f"no Linear lowered to {mode}"
    budget = tolerance_for(MODE_FORMAT[mode])
    with torch.no_grad():
        ref, got = model(*args).float(), opt.module(*args).float()
    assert (got - ref).abs().max() <= budget.rel_to_scale * ref.abs().max()
    cos = torch.nn.functional.cosine_similarity(got.flatten(), ref.flatten(), dim=0)
    assert cos >= budget.min_cosine
    # every lowered node says its format and its measured share of the output error
    plan = opt.plan.to_dict()
    decided = {n["name"]: n["decisions"].get("quantize") for n in plan["nodes"]}
    for node in _lowered(opt, mode):
        d = decided[node]
        assert d["applied"] and d["format"] == MODE_FORMAT[mode]
        assert d["share"] is not None and "share of the output error" in d["reason"]


def _saved_form(module: nn.Module) -> nn.Module:
    """A copy with INT4 weights in their device-independent form, as a save writes them."""
    m = copy.deepcopy(module)
    int4_to_saved(m.graph_module)
    return m


def _on_fake_cuda(m: nn.Module) -> nn.Module:
    """``m`` as ``load(device="cuda")`` leaves it: every tensor a fake CUDA tensor, INT4
    packed for CUDA (call inside a ``FakeTensorMode``)."""
    for sub in m.modules():
        for table in (sub._parameters, sub._buffers):
            for key, t in table.items():
                if t is not None:
                    table[key] = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype,
                                                     device="cuda")
    int4_from_saved(m.graph_module)
    return m


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama", "mistral", "qwen2", "cnn"])
@pytest.mark.parametrize("target,mode", sorted(RUNS))
def test_fake_cuda(built: dict[str, Any], name: str, target: str, mode: str) -> None:
    """Case 2: the GPU artifact places every tensor on the GPU and its layouts pass the CUDA
    kernels' checks."""
    _, args = built["models"][name]
    opt = built["opts"][name, target, mode]
    saved = _saved_form(opt.module)
    with FakeTensorMode(allow_non_fake_inputs=False), torch.no_grad():
        on_cuda = _on_fake_cuda(saved)
        fake_args = tuple(torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="cuda")
                          for a in args)
        out = on_cuda(*fake_args)
    assert out.device.type == "cuda" and out.shape == opt.module(*args).shape


_FRESH = """
import json, sys, torch, graphopt
outs = {}
for path in sys.argv[2:]:
    m = graphopt.load(path)
    args = torch.load(sys.argv[1], weights_only=True)[path.rsplit("/", 1)[-1].split("-")[0]]
    outs[path] = m(*args)
torch.save(outs, sys.argv[1] + ".out")
print(json.dumps(sorted(k for k in sys.modules if k.startswith("transformers"))))
"""


@pytest.mark.slow
def test_save_load_in_fresh_process(built: dict[str, Any], tmp_path: Path) -> None:
    """Case 3: every artifact saved, loaded in one fresh process, equal outputs."""
    paths, inputs = [], {name: args for name, (_, args) in built["models"].items()}
    for (name, target, mode), opt in built["opts"].items():
        paths.append(str(opt.save(tmp_path / f"{name}-{target}-{mode}.pt2")))
    torch.save(inputs, tmp_path / "inputs.pt")
    done = subprocess.run([sys.executable, "-c", _FRESH, str(tmp_path / "inputs.pt"), *paths],
                          capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []  # no model code there
    outs = torch.load(str(tmp_path / "inputs.pt") + ".out", weights_only=True)
    for path in paths:
        name, target, mode = Path(path).stem.split("-", 2)
        opt = built["opts"][name, target, mode]
        with torch.no_grad():
            want = opt.module(*inputs[name])
        torch.testing.assert_close(outs[path], want, rtol=0, atol=0)


def test_fp8_without_fp8_tensor_cores_is_refused_with_its_reason() -> None:
    model, args = ConvNet().eval(), (torch.randn(2, 3, 16, 16),)
    opt = graphopt.optimize(model, args, target="a100", quantize="fp8", measure=False)
    assert "quantize" not in opt.info.passes_applied
    assert "FP8" in opt.info.notes["quantize"]["reason"]


class Odd(nn.Module):
    """One Linear whose K no int4 group divides (K = 40), one that takes it."""

    def __init__(self) -> None:
        super().__init__()
        self.odd = nn.Linear(40, 64)
        self.even = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.even(torch.relu(self.odd(x)))


def test_a_layer_the_kernel_refuses_keeps_its_float_format_with_the_reason() -> None:
    torch.manual_seed(0)
    opt = graphopt.optimize(Odd().eval(), (torch.randn(4, 40),), target="h100",
                            quantize="int4", measure=False)
    decided = {n["name"]: n["decisions"].get("quantize") for n in opt.plan.to_dict()["nodes"]}
    refused = [d for d in decided.values() if d and not d["applied"]]
    assert any("K=40" in d["reason"] for d in refused), decided
    assert len(_lowered(opt, "int4")) == 1


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_load_on_cuda_moves_the_weights_with_their_scales(built: dict[str, Any], mode: str,
                                                          tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """``graphopt.load(path, device="cuda")`` without a GPU: the reader's transfer makes fake
    CUDA tensors (no values), the rest of ``load`` runs as it would there: every weight and
    scale on the GPU, INT4 packed in CUDA's layout, and the module runs."""
    from graphopt.backends.torch import pt2_reader

    def fake_mover(to: str | None) -> Any:
        def move(t: torch.Tensor, saved: Any) -> torch.Tensor:
            return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=to)
        return move

    monkeypatch.setattr(pt2_reader, "_mover", fake_mover)
    _, args = built["models"]["llama"]
    path = built["opts"]["llama", "h100", mode].save(tmp_path / f"llama-{mode}.pt2")
    with FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
        loaded = graphopt.load(path, device="cuda")
        state = [*loaded.parameters(), *loaded.buffers()]
        out = loaded(*(torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="cuda")
                       for a in args))
    assert {t.device.type for t in state} == {"cuda"} and out.device.type == "cuda"
    lowered = [n for n in loaded.graph_module.graph.nodes
               if n.target is QUANT_OPS[torch_kernel_for(MODE_FORMAT[mode])]]
    assert lowered, "the low-bit ops did not survive the round trip"


def _mlp() -> nn.Module:
    """Decode-sized and prefill-sized GEMMs, 4096 wide: big enough for the plan to pick a
    low-bit format (a tiny model's GEMMs are launch-bound and stay bf16)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 4096), nn.GELU(),
                         nn.Linear(4096, 4096), nn.GELU(), nn.Linear(4096, 1024)).eval()


@pytest.mark.slow
@pytest.mark.parametrize("rows,target,fmt", [
    (1, "h100", "int4"), (1, "a100", "int4"), (1, "v100", "int8_weight_only"),
    (256, "h100", "fp8_e4m3"), (256, "a100", "int8"), (256, "b200", None)])
def test_auto_applies_what_the_plan_picked(rows: int, target: str, fmt: str | None) -> None:
    """``quantize="auto"``: the module carries the plan's torch formats, runs here within budget
    and on fake CUDA. The first and last GEMMs stay float in the plan (its prior) with their
    format as a ``candidate`` where one pays: the guard measures those. NVFP4 on a B200
    prefill is plan-only (no torch FP4 kernel): nothing is lowered and the plan says so."""
    model, x = _mlp(), torch.randn(rows, 1024, generator=torch.Generator().manual_seed(3))
    opt = graphopt.optimize(model, x, target=target, measure=False)
    planned = {n.name: n.decisions["precision"].detail
               for n in graphopt.plan(model, x, target).nodes if n.op_type == "Linear"}
    picked = {name for name, f in planned.items() if f.runs_on == "torch" and f.kernel}
    lowered = {n.name for n in opt.module.graph_module.graph.nodes
               if n.target in QUANT_OPS.values()}
    if fmt is None:
        assert not lowered and not picked
        assert {f.format for f in planned.values()} >= {"nvfp4"}
        assert all(f.runs_on == "plan-only" for f in planned.values() if f.format == "nvfp4")
        return
    candidates = {name for name, f in planned.items() if f.candidate}
    assert picked == {"linear_1", "linear_2"} and candidates <= {"linear", "linear_3"}
    assert lowered and lowered <= picked | candidates
    assert {planned[n].format for n in picked} == {fmt}
    assert all(planned[n].candidate == fmt and planned[n].edge in ("first", "last")
               for n in candidates)
    budget = tolerance_for(fmt)
    with torch.no_grad():
        ref, got = model(x), opt.module(x).float()
    assert (got - ref).abs().max() <= budget.rel_to_scale * ref.abs().max()
    saved = _saved_form(opt.module)
    with FakeTensorMode(allow_non_fake_inputs=False), torch.no_grad():
        out = _on_fake_cuda(saved)(torch.empty(rows, 1024, device="cuda"))
    assert out.device.type == "cuda" and out.shape == (rows, 1024)


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_moving_the_module_keeps_its_formats_and_numbers(built: dict[str, Any],
                                                         mode: str) -> None:
    """``.to(device)`` re-packs INT4 for the device (here the same CPU: unpacked and packed
    again, bit-exact), and ``.to(dtype)`` leaves low-bit weights and their scales alone (the
    graph's own casts fix its dtypes: a cast module is not expected to run)."""
    _, args = built["models"]["llama"]
    opt = built["opts"]["llama", "h100", mode]
    moved = copy.deepcopy(opt.module).to("cpu")
    with torch.no_grad():
        torch.testing.assert_close(moved(*args), opt.module(*args), rtol=0, atol=0)
    before = {k: t.dtype for k, t in moved.named_buffers() if k.split(".")[-1].startswith(
        "_graphopt_q")}
    moved.to(torch.float16)  # casts float state; the low-bit weights and their scales stay
    after = {k: t.dtype for k, t in moved.named_buffers() if k in before}
    assert after == before and before
    want = {"fp8": torch.float8_e4m3fn, "int8_dynamic": torch.int8, "int4": torch.uint8}[mode]
    assert want in set(before.values())
