"""LLM prefill and decode: tokens/s per batch beside the bandwidth limit, and the KV cache.

A user serving a decoder LLM asks: how many tokens/s at batch B, how far from what the memory
bandwidth allows, and how many sequences fit with their cache. ``plan_llm`` traces the two
phases (:mod:`graphopt.frontends.llm_steps`: the cache is an input, the batch a
``torch.export.Dim``), plans each once over the batch range, and answers per batch::

    lp = graphopt.plan_llm(model, "h100", batch=(1, 64), prompt_len=512, cache_len=2048)
    lp.section.decode         # one row per batch: step time, tokens/s, the bound
    lp.save(md="llm.md")      # the decode plan's report, with the ``llm`` section

The model may sit on the meta device (nothing allocated): a 7B plan needs no 13 GiB.

Numbers, for each batch B in the range (1, 2, 4, ... and the range's ends):

1. Step time: the phase's graph sized at B (:func:`graphopt.ir.shape_range.bind`), annotated and
   costed per node, as :mod:`graphopt.decisions.range_plan` costs min and max. Nodes run at the
   weights' own dtype (load the model in the dtype it will be served in), except the weight
   GEMMs case 5 gives a format.
2. Decode: tokens/s = B / step. Bound = B / ((weight bytes + KV bytes read) / bandwidth): every
   weight and the whole cache cross DRAM once per token step, so no schedule does better. KV
   bytes read are the cache inputs at B: 2 x layers x kv_heads x head_dim x L x B x dtype bytes.
   The weight bytes (at case 5's formats) include the embedding table, of which a step reads
   only B rows.
3. Prefill: tokens/s = B x P / step (the step is also the time to first token). Bound =
   B x P / max(sum of FLOPs / peak at each node's dtype, (weight bytes + KV written) /
   bandwidth), the datasheet roofline.
4. Memory: the decode plan's memory plan
   (:func:`graphopt.decisions.memory_runtime.memory.memory_plan`, the
   weights at case 5's formats) counts the cache inputs as activations that grow with the
   batch, so its max batch is the largest that fits with a cache of L tokens each; the section
   adds the cache and the total at the range's max batch, and whether they fit. Each phase
   plan's ``memory`` section is that memory plan, so the two sections agree.
5. Formats (``quantize``): "none" costs every node at the weights' own dtype; "auto" each weight
   GEMM at the format its precision decision picked; a format name ("fp8", "int8", "int4")
   every weight GEMM but the sensitive ones (precision.gemm case 2), at the format's bits per
   weight and peak: :mod:`graphopt.api.llm_formats`. The KV cache stays at the model's dtype.
   :meth:`LLMPlan.requantize` re-costs the traced phases at another ``quantize`` without
   tracing again.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from graphopt.analysis import KernelClass, annotate
from graphopt.analysis.kernel_class import GEMM_LIKE
from graphopt.analysis.record import NodeAnalysis
from graphopt.api.llm_formats import (
    WeightFormats,
    cost_dtype,
    format_cost,
    format_note,
    quantize_key,
    weight_formats,
)
from graphopt.cost.roofline import NodeCost, estimate, peak_key
from graphopt.decisions.decide import model_format
from graphopt.decisions.memory_runtime.batch_advice import advise_batch
from graphopt.decisions.memory_runtime.memory import MemoryPlan, memory_plan
from graphopt.decisions.planner import build_plan
from graphopt.decisions.precision.cost import weight_tensors
from graphopt.decisions.precision.gemm import carrier_format
from graphopt.decisions.quant_formats import get_format
from graphopt.errors import GraphoptError
from graphopt.frontends import load_graph
from graphopt.hardware.detect import host_cpu_info
from graphopt.hardware.profile import HardwareProfile
from graphopt.hardware.registry import DEFAULT_TARGET, resolve_targets
from graphopt.ir.graph import Graph
from graphopt.ir.plan import Plan
from graphopt.ir.plan_llm import (
    BatchRange,
    DecodeRow,
    LLMMemory,
    LLMModel,
    LLMSection,
    PhaseFormats,
    PrefillRow,
)
from graphopt.ir.shape_range import bind

__all__ = ["LLMPlan", "WeightFormats", "batch_points", "plan_llm", "weight_formats"]

logger = logging.getLogger(__name__)

_CACHE = ("keys", "values")  # the decode step's cache inputs (llm_steps.DecodeStep)
_PHASES = ("prefill", "decode")


@dataclass(frozen=True, slots=True)
class LLMPlan:
    """Both phases planned; the decode plan's report carries the ``llm`` section."""

    prefill: Plan
    decode: Plan
    #: the traced phases, by phase name: :meth:`requantize` re-costs them
    graphs: Mapping[str, Graph] = field(default_factory=dict, repr=False, compare=False)

    @property
    def section(self) -> LLMSection:
        """The ``llm`` section (both phase plans hold the same record)."""
        return self.decode.llm

    def requantize(self, quantize: str) -> LLMPlan:
        """The same traced phases costed at another ``quantize`` (case 5), without a new trace:
        tracing a 7B model takes seconds per phase, re-costing it a fraction of one."""
        if set(self.graphs) != set(_PHASES):
            raise GraphoptError("this LLMPlan does not hold its traced phases",
                                "plan it with graphopt.plan_llm(..., quantize=...)")
        s = self.section
        shape = {k: getattr(s.model, k) for k in ("layers", "kv_heads", "head_dim", "heads",
                                                  "dtype")}
        return _costed({"prefill": self.prefill, "decode": self.decode}, self.graphs, quantize,
                       (s.batch.min, s.batch.opt, s.batch.max), s.prompt_len, s.cache_len,
                       shape)

    def to_dict(self) -> dict[str, Any]:
        return self.decode.to_dict()

    def to_markdown(self) -> str:
        return self.decode.to_markdown()

    def to_html(self) -> str:
        return self.decode.to_html()

    def save(self, json: str | None = None, md: str | None = None,
             html: str | None = None) -> list[str]:
        return self.decode.save(json=json, md=md, html=html)


def batch_points(low: int, high: int) -> list[int]:
    """The batches a row is given for: ``low``, the powers of two between, and ``high``."""
    out = [low]
    b = 1
    while b < high:
        if b > low:
            out.append(b)
        b *= 2
    return [*out, high] if high != low else out


def _batch_range(batch: Any) -> tuple[int, int]:
    if isinstance(batch, int) and not isinstance(batch, bool):
        batch = (1, batch)
    if isinstance(batch, Sequence) and len(batch) == 2 and \
            all(isinstance(b, int) and not isinstance(b, bool) for b in batch):
        low, high = batch
        if 1 <= low <= high and high >= 2:
            return low, high
    raise GraphoptError(f"batch must be a max batch or a (min, max) pair with 1 <= min <= max "
                        f"and max >= 2, got {batch!r}",
                        "pass e.g. batch=64 or batch=(1, 64) (torch.export specializes a batch "
                        "of 1: plan a single sequence with graphopt.plan)")


def plan_llm(model: Any, target: str | HardwareProfile = DEFAULT_TARGET, *,
             batch: int | tuple[int, int] = (1, 64), prompt_len: int = 512,
             cache_len: int = 2048, opt_batch: int = 8, quantize: str = "none") -> LLMPlan:
    """Plan prefill (``prompt_len`` tokens) and decode (one token against ``cache_len``
    cached ones) of a Llama-layout causal LM over a batch range.

    Args:
        model: a transformers ``LlamaForCausalLM`` (or Mistral / Qwen2), on any device; the
            meta device plans without allocating. It is not modified.
        target: one target name or profile.
        batch: the max batch, or ``(min, max)``; each phase is traced once with the batch a
            ``torch.export.Dim`` over it.
        prompt_len: the prefill's prompt length P.
        cache_len: the decode step's cache length L (tokens already in the cache).
        opt_batch: the batch the plans are decided at (clamped into the range).
        quantize: the weight GEMMs' format (module docstring, case 5): "none" (the weights'
            own dtype), "auto" (each GEMM's precision decision) or a format ("fp8", "int8",
            "int4"); a format the target cannot run is a GraphoptError. Other formats of the
            same trace: :meth:`LLMPlan.requantize`.
    """
    import torch

    from graphopt.frontends.llm_steps import DecodeStep, PrefillStep, cache_layout

    profiles = resolve_targets(target)
    if len(profiles) != 1:
        raise GraphoptError("plan_llm plans one target at a time",
                            "call it once per target")
    profile = profiles[0]
    quantize_key(quantize, profile)  # before the trace
    low, high = _batch_range(batch)
    for name, v in (("prompt_len", prompt_len), ("cache_len", cache_len)):
        if not isinstance(v, int) or v < 1:
            raise GraphoptError(f"{name} must be a positive int, got {v!r}", f"pass {name}=512")
    layers, kv_heads, head_dim = cache_layout(model)
    weight = next(model.parameters())
    opt = min(high, max(low, 2, opt_batch))
    _check_trace_cache(layers * opt * kv_heads * cache_len * head_dim * weight.element_size(),
                       cache_len)
    dim = torch.export.Dim("batch", min=low, max=high)
    ids = dict(dtype=torch.long, device=weight.device)
    # two tensors: export merges one tensor passed twice into one input, so the decode graph
    # would read the values cache for both K and V
    keys, values = (torch.zeros(layers, opt, kv_heads, cache_len, head_dim, dtype=weight.dtype,
                                device=weight.device) for _ in range(2))
    graphs = {}
    for phase, step, inputs, dynamic in (
            ("prefill", PrefillStep(model), (torch.zeros(opt, prompt_len, **ids),),
             {"input_ids": {0: dim}}),
            ("decode", DecodeStep(model), (torch.zeros(opt, 1, **ids), keys, values),
             {"input_ids": {0: dim}, "keys": {1: dim}, "values": {1: dim}})):
        step.training = False  # the wrapper only: the user's model keeps its mode
        graphs[phase] = load_graph(step, inputs, dynamic)
    plans = {phase: build_plan(g, profile) for phase, g in graphs.items()}
    shape = {"layers": layers, "kv_heads": kv_heads, "head_dim": head_dim,
             "heads": model.config.num_attention_heads,
             "dtype": str(weight.dtype).removeprefix("torch.")}
    return _costed(plans, graphs, quantize, (low, opt, high), prompt_len, cache_len, shape)


def _check_trace_cache(one: int, cache_len: int) -> None:
    """The decode trace holds a keys and a values cache of ``one`` bytes each on this host: a
    GraphoptError before allocating more than half its memory (torch's own error is a storage
    overflow, or the machine swaps)."""
    limit = host_cpu_info().ram_bytes // 2
    if 2 * one > limit:
        raise GraphoptError(f"cache_len={cache_len} needs a {2 * one / 2**30:.3g} GiB KV cache to "
                            f"trace the decode step, more than half this host's memory "
                            f"({limit / 2**30:.3g} GiB)",
                            "plan with a smaller cache_len (the decode step's cost grows "
                            "linearly in it, so a shorter cache shows the same bound), or a "
                            "smaller opt_batch")


def _costed(plans: Mapping[str, Plan], graphs: Mapping[str, Graph], quantize: str,
            batch: tuple[int, int, int], prompt_len: int, cache_len: int,
            shape: dict[str, Any]) -> LLMPlan:
    """Both phase plans with their ``memory`` and ``llm`` sections at ``quantize``'s formats."""
    formats = {p: weight_formats(plans[p], quantize) for p in _PHASES}
    memory = {p: memory_plan(plans[p], formats[p].precision) for p in _PHASES}
    section = llm_section(plans["prefill"], graphs["prefill"], plans["decode"], graphs["decode"],
                          plans["decode"].target, batch, prompt_len, cache_len, shape,
                          formats=formats, memory=memory["decode"])
    out = {p: replace(plans[p], memory=memory[p], llm=section) for p in _PHASES}
    return LLMPlan(out["prefill"], out["decode"], MappingProxyType(dict(graphs)))


def _sized(graph: Graph, b: int) -> tuple[Graph, dict[str, NodeAnalysis]]:
    rng = graph.shape_range
    values = dict(rng.values("opt")) if rng else {}
    for d in rng.dims if rng else ():
        if d.name == "batch":
            values[d.name] = b
            if d.symbol:
                values[d.symbol] = b
    sized = bind(graph, values)
    return sized, annotate(sized)


def _cache_views(graph: Graph) -> set[str]:
    """The cache inputs and every view of them (per-layer ``keys[i]``)."""
    seen = set(_CACHE) & set(graph.tensors)
    for n in graph.nodes:
        if n.inputs and n.inputs[0] in seen and n.op_type in ("Gather", "Slice", "Select",
                                                              "Squeeze", "Reshape", "Identity"):
            seen.update(n.outputs)
    return seen


def _step(graph: Graph, b: int, target: HardwareProfile, formats: Mapping[str, str],
          carrier: str) -> tuple[Graph, dict[str, NodeAnalysis], dict[str, NodeCost],
                                 dict[str, Any]]:
    """One phase sized at batch ``b`` and costed (case 1), and the fields both rows share."""
    sized, analyses = _sized(graph, b)
    costs: dict[str, NodeCost] = {}
    for n in sized.nodes:
        a, fmt = analyses[n.name], formats.get(n.name)
        costs[n.name] = estimate(a, target) if fmt is None else \
            format_cost(a, weight_tensors(sized.input_infos(n)), get_format(fmt), carrier,
                        target)
    weight_gemms = Counter(
        analyses[n.name].kernel_class.value for n in sized.nodes
        if analyses[n.name].kernel_class in GEMM_LIKE
        and analyses[n.name].kernel_class is not KernelClass.ATTENTION
        and any(t is not None and t.kind == "param" for t in sized.input_infos(n)))
    bounds = Counter(costs[n.name].bottleneck for n in sized.nodes
                     if analyses[n.name].kernel_class in GEMM_LIKE)
    common = dict(batch=b, step_s=sum(c.est_time_s for c in costs.values()),
                  weight_gemm_classes=dict(weight_gemms), gemm_bottlenecks=dict(bounds),
                  launch_s=sum(c.overhead_s for c in costs.values()))
    return sized, analyses, costs, common


def _decode_row(graph: Graph, b: int, target: HardwareProfile, weights: int,
                formats: Mapping[str, str], carrier: str, max_fit: int) -> DecodeRow:
    """Case 2 at batch ``b``; ``max_fit``: the memory plan's largest batch."""
    sized, _, costs, common = _step(graph, b, target, formats, carrier)
    step = common["step_s"]
    kv = sum(sized.tensors[t].nbytes for t in _CACHE if t in sized.tensors)
    views = _cache_views(sized)
    append = sum(costs[n.name].est_time_s for n in sized.nodes
                 if n.op_type == "Concat" and any(i in views for i in n.inputs))
    rate, bound = b / step if step else 0.0, b * target.bandwidth_bytes_per_s / (weights + kv)
    return DecodeRow(**common, tokens_per_s=rate, kv_read_bytes=kv, bound_tokens_per_s=bound,
                     cache_append_s=append,
                     tokens_per_s_static_cache=b / (step - append) if step > append else 0.0,
                     share_of_bound=_share(rate, bound), fits=b <= max_fit)


def _prefill_row(graph: Graph, b: int, target: HardwareProfile, weights: int, prompt_len: int,
                 formats: Mapping[str, str], carrier: str) -> PrefillRow:
    """Case 3 at batch ``b``."""
    sized, analyses, _, common = _step(graph, b, target, formats, carrier)
    step, bw = common["step_s"], target.bandwidth_bytes_per_s
    out = [sized.tensors[t] for t in sized.outputs[1:] if t in sized.tensors]
    kv = sum(t.nbytes for t in out)
    flops = sum(a.flops for a in analyses.values())
    dtype = next((a.dtype for a in analyses.values()
                  if a.kernel_class in GEMM_LIKE and a.dtype), None)

    def peak(d: str | None) -> float:
        return target.peak_flops.get(peak_key(d)) or target.peak_flops.get("fp32", 1.0)

    compute = sum(a.flops / peak(cost_dtype(get_format(formats[name]), carrier)
                                 if name in formats else dtype)
                  for name, a in analyses.items() if a.flops)
    floor = max(compute, (weights + kv) / bw)
    tokens = b * prompt_len
    rate, bound = tokens / step if step else 0.0, tokens / floor if floor else 0.0
    return PrefillRow(**common, tokens_per_s=rate, kv_write_bytes=kv, flops=flops,
                      bound_tokens_per_s=bound,
                      bound_by="compute" if compute >= (weights + kv) / bw else "bandwidth",
                      share_of_bound=_share(rate, bound))


def _share(tokens_per_s: float, bound: float) -> float:
    return tokens_per_s / bound if bound else 0.0


def llm_section(prefill: Plan, prefill_graph: Graph, decode: Plan, decode_graph: Graph,
                target: HardwareProfile, batch: tuple[int, int, int], prompt_len: int,
                cache_len: int, shape: dict[str, Any], *,
                formats: Mapping[str, WeightFormats] | None = None,
                memory: MemoryPlan | None = None) -> LLMSection:
    """The report's ``llm`` section (module docstring, numbers 1-5); ``formats`` per phase
    (default: the weights' dtype) and ``memory``, the decode plan's memory plan at them."""
    low, opt, high = batch
    formats = formats or {"prefill": weight_formats(prefill), "decode": weight_formats(decode)}
    mem = memory or memory_plan(decode, formats["decode"].precision)
    weights = mem.param_bytes  # at the applied formats
    own = model_format(decode)
    carrier = carrier_format(target, own)[0]
    points, max_fit = batch_points(low, high), mem.max_batch_size
    prefill_rows = tuple(_prefill_row(prefill_graph, b, target, weights, prompt_len,
                                      formats["prefill"].applied, carrier) for b in points)
    decode_rows = tuple(_decode_row(decode_graph, b, target, weights, formats["decode"].applied,
                                    carrier, max_fit) for b in points)
    kv_per_seq = decode_rows[0].kv_read_bytes // points[0]
    per_seq = mem.activation_peak_per_sample  # the cache inputs are in it
    at_max = weights + mem.constant_bytes + mem.workspace_bytes + round(per_seq * high)
    advice = advise_batch(decode, min(high, max_fit), opt,
                          limit_by="range" if high < max_fit else "memory")
    first, append = decode_rows[0], decode_rows[-1]
    notes = [
        f"{format_note(formats, own, carrier)}; the bound is the datasheet "
        f"bandwidth {target.bandwidth_bytes_per_s / 1e12:g} TB/s",
        f"decode appends each new entry with torch.cat (a copy of the cache per layer): "
        f"{append.cache_append_s / append.step_s:.0%} of the step at batch {high}; a "
        "static or paged cache writes only the new entry (tokens_per_s_static_cache leaves "
        "the copy out)",
        f"every node is costed as one kernel, as eager PyTorch runs it: launches are "
        f"{first.launch_s / first.step_s:.0%} of the decode step at batch {low} "
        "(CUDA graphs and fusion remove part of that)",
        "the weight bytes of the bound include the embedding table, of which a step reads "
        "only one row per token",
        "the bound, the memory plan and the largest batch count the weights at the same "
        "formats as the rows; the memory section is that memory plan",
        "the recommended decode batch is the throughput knee within the batch range and "
        "memory; 'range' means samples/s still rises at the range's max",
    ]
    logger.info("llm plan on %s (%s): decode %.0f tokens/s at batch %d", target.name,
                formats["decode"].quantize, append.tokens_per_s, high)
    return LLMSection(
        model=LLMModel(**shape, param_bytes=decode.model.param_bytes,
                       param_count=decode.model.param_count),
        target=target.name, bandwidth_bytes_per_s=target.bandwidth_bytes_per_s,
        prompt_len=prompt_len, cache_len=cache_len, batch=BatchRange(low, opt, high),
        quantize=formats["decode"].quantize, carrier=carrier,
        weight_formats=PhaseFormats(formats["prefill"].record(), formats["decode"].record()),
        decode=decode_rows, prefill=prefill_rows,
        memory=LLMMemory(
            kv_bytes_per_sequence=kv_per_seq, kv_bytes_per_token=kv_per_seq // cache_len,
            kv_bytes_at_max=kv_per_seq * high, bytes_per_sequence=round(per_seq),
            weight_bytes=weights, param_format=mem.param_format,
            required_bytes_at_max=at_max, usable_bytes=mem.usable_bytes,
            fits_at_max=at_max <= mem.usable_bytes, max_batch_size=max_fit,
            batch_note=mem.batch_note, recommended_batch_size=advice.recommended,
            batch_decided_by=advice.decided_by, batch_advice=advice.reason),
        notes=tuple(notes))
