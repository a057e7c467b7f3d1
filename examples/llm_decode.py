"""Plan a 7B Llama-style LLM's prefill and decode on an H100 in bf16, FP8 and INT4, then
optimize a tiny one.

Part 1 builds the 7B model (hidden 4096, 32 layers, 32 heads, intermediate 11008, vocab 32000)
on the meta device in bf16, so nothing is allocated, and plans prefill (512-token prompts) and
decode (one token against 2048 cached) for batches 1 to 64 with ``graphopt.plan_llm``. It prints
decode and prefill tokens/s per batch beside the bandwidth bound, and the KV cache in memory.
Then it re-costs the same trace (``LLMPlan.requantize``: no second trace) with the weight GEMMs
in FP8 and in INT4 (weight-only, group 128) and prints one row per format: weights, KV cache,
the largest batch that fits, decode tokens/s and the bound. Every number is predicted by
graphopt's cost model from the H100's datasheet; nothing runs on a GPU.

Part 2 optimizes a 2-layer Llama with random weights for this CPU: the decode step, its batch
dynamic, and checks the optimized module against the original at several batches.

Runtime: about 25-30 s on a 2-core machine shared with other work (measured 23 s by its own
clock, 28 s with Python's start): about 15 s tracing the 7B model's 32 layers once per phase
with torch.export, under 2 s re-costing that trace in FP8 and INT4, and about 6 s the tiny
model's optimize. A first run on a machine also calibrates its CPU for part 2 (about 10 s more,
once). Run: ``python examples/llm_decode.py``.
"""

from __future__ import annotations

import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from graphopt.api.llm import LLMPlan, plan_llm
from graphopt.frontends.llm_steps import DecodeStep
from graphopt.ir.plan_llm import LLMSection

GIB = 2**30
FORMATS = (("bf16", "none"), ("FP8", "fp8"), ("INT4", "int4"))  # (label, plan_llm's quantize)
BATCHES = (1, 16, 64)  # the decode batches the format table shows


def plan_7b() -> LLMPlan:
    """Part 1: the 7B plan at the weights' own dtype (bf16), printed per batch."""
    config = LlamaConfig(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                         intermediate_size=11008, vocab_size=32000)
    with torch.device("meta"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    lp = plan_llm(model, "h100", batch=(1, 64), prompt_len=512, cache_len=2048)
    llm = lp.section
    mem = llm.memory
    print(f"7B Llama on h100 (bf16): KV cache {mem.kv_bytes_per_sequence / GIB:.2f} GiB per "
          f"sequence of {llm.cache_len} tokens, {mem.kv_bytes_at_max / GIB:.1f} GiB at "
          f"batch {llm.batch.max}; {mem.required_bytes_at_max / GIB:.1f} GiB in all of "
          f"{mem.usable_bytes / GIB:.1f} GiB usable ({'' if mem.fits_at_max else 'does not '}"
          f"fit); largest batch that fits: {mem.max_batch_size}; recommended decode batch "
          f"{mem.recommended_batch_size} (decided by {mem.batch_decided_by})")
    print("decode  batch  tokens/s  static-cache  bound tokens/s")
    for r in llm.decode:
        print(f"        {r.batch:5d}  {r.tokens_per_s:8.0f}  "
              f"{r.tokens_per_s_static_cache:12.0f}  {r.bound_tokens_per_s:14.0f}")
    print("prefill batch  tokens/s  bound tokens/s  TTFT")
    for r in llm.prefill:
        print(f"        {r.batch:5d}  {r.tokens_per_s:8.0f}  "
              f"{r.bound_tokens_per_s:14.0f}  {r.step_s * 1e3:.1f} ms")
    return lp


def compare_formats(lp: LLMPlan) -> dict[str, LLMSection]:
    """Part 1, continued: the same trace re-costed per weight format; one row per format.
    Returns each format's ``llm`` section by label."""
    sections = {label: lp.requantize(q).section for label, q in FORMATS}
    first = next(iter(sections.values()))
    print(f"\n7B Llama decode on h100 per weight format, predicted (not measured): GEMMs = "
          f"weight GEMMs at the format (the first and last stay bf16); KV cache bf16, "
          f"{first.cache_len} tokens per sequence")
    rates = "  ".join(f"{f'tok/s @{b}':>9}" for b in BATCHES)
    print(f"format  GEMMs    weights   KV/seq    max batch  {rates}  bound @1  "
          f"bound @{BATCHES[-1]}")
    for (label, q), s in zip(FORMATS, sections.values(), strict=True):
        mem = s.memory
        rows = {r.batch: r for r in s.decode}
        gemms = s.weight_formats.decode.gemm_formats
        at = gemms.get("bf16" if q == "none" else s.quantize, 0)
        cells = "  ".join(f"{rows[b].tokens_per_s:9.0f}" if rows[b].fits
                          else f"{'no fit':>9}" for b in BATCHES)
        kv = mem.kv_bytes_per_sequence / GIB
        bounds = f"{rows[1].bound_tokens_per_s:8.0f}  " \
            f"{rows[BATCHES[-1]].bound_tokens_per_s:9.0f}"
        print(f"{label:6s}  {f'{at}/{sum(gemms.values())}':7s}  "
              f"{mem.weight_bytes / GIB:4.1f} GiB  {kv:4.2f} GiB  {mem.max_batch_size:9d}  "
              f"{cells}  {bounds}")
    return sections


def optimize_tiny() -> float:
    """Part 2: optimize a tiny decode step for this CPU with INT8 Linears (so a pass applies;
    ``quantize="auto"`` keeps fp32 on a CPU without VNNI/AMX) and check it against the original
    at batches 1, 4 and 16 within the plan's tolerance. Returns the worst error / scale."""
    import graphopt

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=128, vocab_size=256)
    step = DecodeStep(LlamaForCausalLM(config).eval()).eval()
    layers, heads, length, dim = 2, 2, 32, 16

    def inputs(b: int) -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(b)
        cache = (layers, b, heads, length, dim)
        return (torch.randint(0, 256, (b, 1), generator=g), torch.randn(cache, generator=g),
                torch.randn(cache, generator=g))

    batch = torch.export.Dim("batch", min=1, max=16)
    opt = graphopt.optimize(step, inputs(4), "cpu", quantize="int8", measure=False,
                            dynamic_shapes={"input_ids": {0: batch}, "keys": {1: batch},
                                            "values": {1: batch}})
    tol = opt.info.tolerance
    worst = 0.0
    with torch.no_grad():
        for b in (1, 4, 16):
            for ref, out in zip(step(*inputs(b)), opt.module(*inputs(b)), strict=True):
                err = float((out - ref).abs().max() / ref.abs().max())
                cos = float(torch.nn.functional.cosine_similarity(out.flatten(), ref.flatten(),
                                                                  dim=0))
                if err > tol.rel_to_scale or cos < tol.min_cosine:
                    raise SystemExit(f"batch {b}: error {err:.3g} of scale, cosine {cos:.6f}, "
                                     f"outside the tolerance {tol}")
                worst = max(worst, err)
    print(f"tiny Llama decode optimized for cpu (passes: {', '.join(opt.info.passes_applied)})"
          f": matches the original at batch 1, 4, 16 (worst error {worst:.2%} of the output "
          f"scale, tolerance {tol.rel_to_scale:.0%})")
    return worst


if __name__ == "__main__":
    start = time.perf_counter()
    compare_formats(plan_7b())
    optimize_tiny()
    print(f"done in {time.perf_counter() - start:.0f} s")
