"""Tensor parallelism vs the HEFT and pipeline splits: a Llama-70B-shaped model on 4 and 8 H100s.

The model is transformers' ``LlamaForCausalLM`` at Llama-3-70B's shape (hidden 8192, 80 layers,
64 heads, 8 KV heads, intermediate 28672, vocab 128256) in bf16 on the meta device: nothing is
allocated. Two programs are traced with graphopt's LLM wrappers (``graphopt.frontends.llm_steps``),
each planned on the h100 profile:

- prefill: one sequence of ``--prompt`` tokens (default 1024), batch 1;
- decode: one new token per sequence for ``--decode-batch`` sequences against a cache of
  ``--cache`` tokens (keys and values passed as two distinct tensors: torch.export merges two
  inputs given the same tensor object).

For each device count (``--gpus``, default 4 and 8; ``cuda:i=h100``, NVLink between them from
the hardware database) it reports the tensor-parallel split
(:func:`graphopt.partition.tensor_parallel.tensor_parallel`): per-device memory, busy and
all-reduce time, the prefill makespan beside the HEFT and pipeline splits'
(:func:`graphopt.partition.split`), and decode tokens/s beside the bandwidth limit
(``batch * t * HBM bandwidth / (weight bytes + KV bytes)``: every byte read once, split
perfectly over t devices). Each is also costed with sequence parallelism (norms and residual
adds split by tokens, reduce-scatter + all-gather in place of each all-reduce). Planning time
is tracing + ``build_plan``; split times are given apart.

Then 2 nodes x 4 H100s (``--nodes 2x4``: NVLink within a node, ``net=400Gb/s`` between, from
``--devices``' ``@HOST`` syntax): tensor parallelism over all 8 (its all-reduces cross the
network), the 2-D split (tensor parallel per node, pipeline stages across nodes:
:func:`graphopt.partition.two_d.two_d`) with its stages, decode on the 2-D split, and for every
device set the ``auto`` strategy's pick (:func:`graphopt.partition.strategies.run_strategy`)
with every candidate's latency and throughput. On 4 and 8 GPUs ``auto`` also runs on the
LlamaForCausalLM's own prefill with the module given, where tensor parallelism may use sequence
parallelism (the emitter can emit it for that module, not for PrefillStep's own layer loop).

The emitted 2-D plan (issue 23): on the LlamaForCausalLM's own prefill with the module given,
the 2-D split put on decoder-layer boundaries (:func:`graphopt.partition.two_d_emit.
on_module_boundaries`): each stage's modules, the cuts moved onto a module boundary and the
latency re-costed there, an uneven split, the micro-batches and schedule, plain and with
sequence parallelism inside the stages, and ``auto``'s pick with the module. ``--only-2d``
traces that prefill alone and runs this part only.

Usage: python benchmarks/bench_tensor_parallel.py [--layers 80] [--gpus 4,8] [--prompt 1024]
       [--cache 1024] [--decode-batch 1,32] [--nodes 2x4] [--only-2d]
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from graphopt.decisions.planner import build_plan  # noqa: E402
from graphopt.errors import GraphoptError  # noqa: E402
from graphopt.frontends import load_graph  # noqa: E402
from graphopt.frontends.llm_steps import DecodeStep, PrefillStep  # noqa: E402
from graphopt.hardware import get_target  # noqa: E402
from graphopt.ir.plan_partition import StrategyChoice  # noqa: E402
from graphopt.partition import parse_devices, split  # noqa: E402
from graphopt.partition.strategies import run_strategy  # noqa: E402
from graphopt.partition.tensor_parallel import tensor_parallel  # noqa: E402
from graphopt.partition.two_d import two_d  # noqa: E402

GB = 1e9


def machine() -> str:
    import os

    from graphopt.hardware.detect import host_cpu_info

    return (f"machine: {host_cpu_info().model}; {os.cpu_count()} CPUs; "
            f"{torch.get_num_threads()} torch threads; torch {torch.__version__}; python "
            f"{platform.python_version()}")


def model_70b(layers: int) -> LlamaForCausalLM:
    config = LlamaConfig(hidden_size=8192, num_hidden_layers=layers, num_attention_heads=64,
                         num_key_value_heads=8, intermediate_size=28672, vocab_size=128256,
                         max_position_embeddings=8192)
    with torch.device("meta"):
        return LlamaForCausalLM(config).to(torch.bfloat16)


def plan_phase(step: torch.nn.Module, inputs: tuple[torch.Tensor, ...]):
    step.training = False
    t0 = time.perf_counter()
    graph = load_graph(step, inputs)
    t1 = time.perf_counter()
    plan = build_plan(graph, get_target("h100"))
    return graph, plan, t1 - t0, time.perf_counter() - t1


def spec(gpus: int) -> str:
    return ",".join(f"cuda:{i}=h100" for i in range(gpus))


def nodes_spec(shape: str) -> str:
    """``"2x4"`` -> 2 machines of 4 H100s each, 400 Gb/s between machines."""
    n, per = (int(x) for x in shape.lower().split("x"))
    return ",".join(f"cuda:{m * per + i}=h100@node{m}" for m in range(n)
                    for i in range(per)) + ",net=400Gb/s"


def auto_choice(plan, devices, source, module=None) -> StrategyChoice:
    """``--strategy auto``: every candidate's latency and throughput, and the pick."""
    t0 = time.perf_counter()
    win, section = run_strategy(plan, devices, "auto", source=source, module=module)
    print(f"  auto ({time.perf_counter() - t0:.1f} s): picked {win.name}: {section.why}")
    for c in section.candidates:
        if c.feasible:
            shown = f" [costed, not emitted: {c.not_emitted}]" if c.not_emitted else ""
            print(f"    {c.strategy:8s} latency {c.latency_s * 1e3:7.1f} ms, throughput "
                  f"{c.throughput_per_s:6.2f} prompts/s ({c.detail}){shown}")
        else:
            print(f"    {c.strategy:8s} could not run: {c.why_not[:160]}")
    return section


def model_prefill(model: LlamaForCausalLM, prompt: int):
    """The prefill of the LlamaForCausalLM itself (every token's logits): the module the
    tensor-parallel emitter splits, so auto may use sequence parallelism there. PrefillStep
    runs its own layer loop, which the emitter's per-module plan does not reach."""
    model.config.use_cache = False  # a DynamicCache output does not trace
    graph, plan, trace_s, plan_s = plan_phase(
        model, (torch.zeros(1, prompt, dtype=torch.long, device="meta"),))
    print(f"model prefill plan (LlamaForCausalLM, batch 1, {prompt} tokens, every token's "
          f"logits): {len(plan.nodes)} nodes, trace {trace_s:.1f} s + plan {plan_s:.1f} s")
    return graph, plan


def model_auto(plan, graph, model, devices) -> None:
    """auto on the model itself, with the module: tensor may use sequence parallelism."""
    print("  auto on the LlamaForCausalLM prefill (module given, so tensor may use sequence "
          "parallelism):")
    section = auto_choice(plan, devices, graph, module=model)
    lat = {c.strategy: c.latency_s for c in section.candidates if c.feasible}
    base = [lat[s] for s in ("heft", "pipeline") if s in lat]
    if "tensor" in lat and base:
        print(f"  tensor ({'with' if section.sequence_parallel else 'without'} sequence "
              f"parallelism) / best of HEFT and pipeline: {lat['tensor'] / min(base):.2f}x")


def multi_node(prefill, g_pre, decodes, shape: str, params: int) -> None:
    """2 nodes x 4 H100s: tensor over all 8, the 2-D split, decode on it, and auto."""
    devices = parse_devices(nodes_spec(shape))
    net = devices.link("cuda:0", devices.devices[-1].name)
    print(f"\n== {shape} H100 (NVLink within a node; {net.name}, "
          f"{net.bandwidth_bytes_per_s / GB:.0f} GB/s, {net.latency_s * 1e6:.0f} us between "
          "nodes) ==")
    tp = tensor_parallel(prefill, devices, source=g_pre)
    print(f"tensor x{len(devices.devices)} over both nodes prefill: makespan "
          f"{tp.makespan_s * 1e3:.1f} ms ({(tp.makespan_s - tp.compute_s) * 1e3:.1f} ms of "
          f"all-reduce on {tp.link.name}); {max(tp.memory_used.values()) / GB:.1f} GB per device")
    t0 = time.perf_counter()
    res = two_d(prefill, devices, source=g_pre)
    took = time.perf_counter() - t0
    print(f"2-D prefill: latency {res.latency_s * 1e3:.1f} ms, slowest stage "
          f"{res.bottleneck_s * 1e3:.1f} ms -> {res.throughput_per_s:.2f} prompts/s with "
          f"micro-batches in flight (split {took:.1f} s); every device within memory: "
          f"{'yes' if res.feasible else 'NO: ' + res.overflow_text()}")
    for st in res.stages:
        print(f"  stage {st.index + 1} on {'+'.join(st.group)}: nodes {st.first}..{st.end - 1}, "
              f"{len(st.tp.splits)} blocks split x{st.tp.degree}, compute+all-reduce "
              f"{st.tp.makespan_s * 1e3:.1f} ms (all-reduce "
              f"{(st.tp.makespan_s - st.tp.compute_s) * 1e3:.1f} ms), send "
              f"{st.send_bytes / 1e6:.1f} MB in {st.send_s * 1e6:.0f} us; "
              f"{max(st.tp.memory_used.values()) / GB:.1f} GB per device")
    h100 = get_target("h100")
    for b, dplan, kv in decodes:
        dd = two_d(dplan, devices)
        bound = b * len(devices.devices) * h100.bandwidth_bytes_per_s / (params * 2 + kv)
        print(f"  decode batch {b} on 2-D: one token {dd.latency_s * 1e3:.2f} ms -> "
              f"{b / dd.latency_s:.0f} tokens/s for one stream, {b * dd.throughput_per_s:.0f} "
              f"tokens/s with {len(dd.stages)} micro-batches in flight; bandwidth limit "
              f"{bound:.0f} tokens/s; {max(dd.memory_used.values()) / GB:.1f} GB per device"
              f"{'' if dd.feasible else ' OVER: ' + dd.overflow_text()}")
    auto_choice(prefill, devices, g_pre)


def two_d_emitted(plan, graph, model, shape: str) -> None:
    """The 2-D split of the model's own prefill on module boundaries, as emitted."""
    from graphopt.partition.two_d_emit import on_module_boundaries

    devices = parse_devices(nodes_spec(shape))
    print(f"\n== emitted 2-D on {shape} H100, LlamaForCausalLM prefill (module given) ==")
    for sp in (False, True):
        t0 = time.perf_counter()
        res = two_d(plan, devices, source=graph, sequence_parallel=sp)
        out = on_module_boundaries(res, plan, model, source=graph)
        took = time.perf_counter() - t0
        print(f"2-D {'with sequence parallelism' if sp else 'plain'}: costed latency "
              f"{res.latency_s * 1e3:.1f} ms (slowest stage {res.bottleneck_s * 1e3:.1f} ms); "
              f"on module boundaries {out.latency_s * 1e3:.1f} ms (slowest stage "
              f"{out.bottleneck_s * 1e3:.1f} ms, {out.throughput_per_s:.2f} prompts/s); "
              f"{out.micro_batches} micro-batch(es), {out.pipeline_schedule} ({took:.1f} s); "
              f"fits: {'yes' if out.feasible else 'NO: ' + out.overflow_text()}")
        for st, mods in zip(out.stages, out.layout.stages, strict=True):
            a, b = mods.layers
            print(f"  stage {st.index + 1} on {'+'.join(st.group)}: "
                  f"{'embedding + ' if mods.embed else ''}layers {a}..{b - 1} ({b - a})"
                  f"{' + norm + lm_head' if mods.head else ''}; nodes {st.first}..{st.end - 1},"
                  f" {len(st.tp.splits)} blocks split x{st.tp.degree}, "
                  f"{st.tp.makespan_s * 1e3:.1f} ms, send {st.send_bytes / 1e6:.1f} MB in "
                  f"{st.send_s * 1e6:.0f} us; {max(st.tp.memory_used.values()) / GB:.1f} GB "
                  "per device")
        for c in out.moved_cuts:
            print(f"  moved cut: planned after {c.planned_after} ({c.why}) -> {c.at}, after "
                  f"{c.moved_after}")
        if not out.moved_cuts:
            print("  no cut moved: the cost model's cuts were on decoder-layer boundaries")
        if out.notes.get("uneven"):
            print(f"  uneven: {out.notes['uneven']}")
        print(f"  schedule: {out.schedule_why}")
    auto_choice(plan, devices, graph, module=model)


def baseline(plan, devices, strategy: str) -> tuple[str, float | None]:
    t0 = time.perf_counter()
    try:
        part = split(plan, devices, strategy)
    except GraphoptError as e:
        return f"{strategy}: infeasible ({e.problem[:120]})", None
    took = time.perf_counter() - t0
    mem = ", ".join(f"{d}: {b / GB:.0f} GB" for d, b in part.memory_used.items())
    busy = ", ".join(f"{d}: {s * 1e3:.0f} ms" for d, s in part.busy_s.items())
    extra = ""
    if strategy == "pipeline":
        extra = f"; bottleneck stage {part.notes['bottleneck_s'] * 1e3:.1f} ms"
    return (f"{strategy}: makespan {part.makespan_s * 1e3:.1f} ms{extra} (split {took:.1f} s); "
            f"memory {mem}; busy {busy}"), part.makespan_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=80)
    ap.add_argument("--gpus", default="4,8")
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--cache", type=int, default=1024)
    ap.add_argument("--decode-batch", default="1,32")
    ap.add_argument("--nodes", default="2x4", help="machines x GPUs each ('' to skip)")
    ap.add_argument("--only-2d", action="store_true",
                    help="trace the model's own prefill only and run the emitted 2-D part")
    args = ap.parse_args()
    print(machine())
    model = model_70b(args.layers)
    if args.only_2d:
        g_model, model_plan = model_prefill(model, args.prompt)
        two_d_emitted(model_plan, g_model, model, args.nodes or "2x4")
        return
    cfg = model.config
    params = sum(p.numel() for p in model.parameters())
    print(f"Llama-70B shape: {args.layers} layers, hidden {cfg.hidden_size}, "
          f"{cfg.num_attention_heads} heads / {cfg.num_key_value_heads} KV heads, intermediate "
          f"{cfg.intermediate_size}, vocab {cfg.vocab_size}; {params / 1e9:.1f} B parameters "
          f"({params * 2 / GB:.0f} GB bf16)")
    ids = dict(dtype=torch.long, device="meta")
    g_pre, prefill, trace_s, plan_s = plan_phase(PrefillStep(model),
                                                 (torch.zeros(1, args.prompt, **ids),))
    print(f"prefill plan (batch 1, {args.prompt} tokens): {len(prefill.nodes)} nodes, trace "
          f"{trace_s:.1f} s + plan {plan_s:.1f} s; one H100 alone: "
          f"{prefill.est_latency_s * 1e3:.1f} ms")
    hd = cfg.hidden_size // cfg.num_attention_heads
    decodes = []
    for b in (int(x) for x in args.decode_batch.split(",")):
        shape = (args.layers, b, cfg.num_key_value_heads, args.cache, hd)
        keys = torch.zeros(shape, dtype=torch.bfloat16, device="meta")
        values = torch.zeros(shape, dtype=torch.bfloat16, device="meta")
        _, dplan, dtrace, dplan_s = plan_phase(DecodeStep(model),
                                               (torch.zeros(b, 1, **ids), keys, values))
        kv = 2 * keys.numel() * 2
        decodes.append((b, dplan, kv))
        print(f"decode plan (batch {b}, cache {args.cache}): trace {dtrace:.1f} s + plan "
              f"{dplan_s:.1f} s; KV cache {kv / GB:.1f} GB; one H100 (if it fit): step "
              f"{dplan.est_latency_s * 1e3:.1f} ms")
    g_model, model_plan = model_prefill(model, args.prompt)
    h100 = get_target("h100")
    for gpus in (int(x) for x in args.gpus.split(",")):
        devices = parse_devices(spec(gpus))
        print(f"\n== {gpus} x H100 ({devices.link('cuda:0', 'cuda:1').name}, "
              f"{devices.link('cuda:0', 'cuda:1').bandwidth_bytes_per_s / GB:.0f} GB/s, "
              f"{devices.link('cuda:0', 'cuda:1').latency_s * 1e6:.1f} us per step; "
              f"{devices.devices[0].memory_bytes / GB:.1f} GB usable each) ==")
        t0 = time.perf_counter()
        tp = tensor_parallel(prefill, devices, source=g_pre)
        tp_s = time.perf_counter() - t0
        print(f"tensor x{gpus} prefill: makespan {tp.makespan_s * 1e3:.1f} ms (compute "
              f"{tp.compute_s * 1e3:.1f} ms + "
              f"{sum(c.kind == 'all-reduce' for c in tp.collectives)} all-reduces and "
              f"{sum(c.kind == 'all-gather' for c in tp.collectives)} all-gathers "
              f"{(tp.makespan_s - tp.compute_s) * 1e3:.1f} ms); {len(tp.splits)} blocks split, "
              f"{len(tp.fallbacks)} unsplit, {tp.notes['replicated_nodes']} nodes replicated "
              f"({tp.notes['replicated_s'] * 1e3:.1f} ms); "
              f"throughput {tp.throughput_per_s:.2f} prompts/s back to back, "
              f"{tp.throughput_overlapped_per_s:.2f} with all-reduce overlapped (split "
              f"{tp_s:.1f} s)")
        print("  device   memory    params  activations  busy      collective  fits")
        for d in devices.devices:
            print(f"  {d.name:7s} {tp.memory_used[d.name] / GB:6.1f} GB "
                  f"{tp.params[d.name] / GB:6.1f} GB {tp.activations[d.name] / GB:8.2f} GB "
                  f"{tp.busy_s[d.name] * 1e3:7.1f} ms "
                  f"{tp.collective_s[d.name] * 1e3:8.1f} ms  "
                  f"{'yes' if d.name not in tp.over else 'NO'}")
        if tp.over:
            print(f"  overflow: {tp.overflow_text()}")
        kinds = {s.kind: s for s in tp.splits}
        for kind, s in sorted(kinds.items()):
            row = f", row {s.dims['row']}" if "row" in s.dims else ""
            print(f"  {kind} block ({s.block}): column {s.dims['column']}{row}; "
                  f"{s.unsplit_s * 1e3:.3f} ms whole -> {s.compute_s * 1e3:.3f} ms per device "
                  f"+ {s.collective} of {s.allreduce_bytes / 1e6:.1f} MB "
                  f"{s.allreduce_s * 1e6:.1f} us")
        sp = tensor_parallel(prefill, devices, sequence_parallel=True)
        spn = sp.notes["sequence_parallel"]
        print(f"tensor x{gpus} + sequence parallel prefill: makespan {sp.makespan_s * 1e3:.1f} ms "
              f"(compute {sp.compute_s * 1e3:.1f} ms + {spn['reduce_scatters']} reduce-scatters, "
              f"{spn['all_gathers']} all-gathers and "
              f"{sum(c.kind == 'all-reduce' for c in sp.collectives)} all-reduces "
              f"{(sp.makespan_s - sp.compute_s) * 1e3:.1f} ms); {spn['nodes']} nodes split by "
              f"tokens; {max(sp.memory_used.values()) / GB:.1f} GB per device"
              f"{'' if sp.feasible else ' OVER: ' + sp.overflow_text()}")
        best = None
        for strategy in ("heft", "pipeline"):
            text, mk = baseline(prefill, devices, strategy)
            print("  " + text)
            if mk is not None:
                best = mk if best is None else min(best, mk)
        if best:
            print(f"  tensor / best of HEFT and pipeline: {tp.makespan_s / best:.2f}x; with "
                  f"sequence parallelism {sp.makespan_s / best:.2f}x")
        for b, dplan, kv in decodes:
            td = tensor_parallel(dplan, devices)
            tsp = tensor_parallel(dplan, devices, sequence_parallel=True)
            bound = b * gpus * h100.bandwidth_bytes_per_s / (params * 2 + kv)
            print(f"  decode batch {b}: step {td.makespan_s * 1e3:.2f} ms ({td.compute_s * 1e3:.2f}"
                  f" compute + {(td.makespan_s - td.compute_s) * 1e3:.2f} all-reduce), "
                  f"{b / td.makespan_s:.0f} tokens/s; bandwidth limit {bound:.0f} tokens/s "
                  f"({b / td.makespan_s / bound:.0%}); memory "
                  f"{max(td.memory_used.values()) / GB:.1f} GB per device; replicated nodes "
                  f"{td.notes['replicated_s'] * 1e3:.2f} ms of each step; with sequence "
                  f"parallelism {b / tsp.makespan_s:.0f} tokens/s"
                  f"{'' if td.feasible else ' OVER: ' + td.overflow_text()}")
        auto_choice(prefill, devices, g_pre)
        model_auto(model_plan, g_model, model, devices)
    if args.nodes:
        multi_node(prefill, g_pre, decodes, args.nodes, params)
        two_d_emitted(model_plan, g_model, model, args.nodes)


if __name__ == "__main__":
    main()
