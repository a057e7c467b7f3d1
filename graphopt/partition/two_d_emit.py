"""Emit the 2-D plan: pipeline stages on a decoder's module boundaries, each stage tensor-parallel
over its group, run by torch's own engine as torchtitan does (a ``("pp", "tp")`` DeviceMesh,
``parallelize_module`` per stage on ``mesh["tp"]``, ``PipelineStage`` and ``ScheduleGPipe``).

Cases:

1. **Which models** (:func:`decoder_of`): a transformers ``LlamaModel``, ``MistralModel`` or
   ``Qwen2Model`` (their ``*ForCausalLM`` with its ``lm_head``), the module itself or wrapped
   by modules that hold no parameters or buffers of their own. The stage module re-runs what
   those classes' ``forward`` does between layers (position ids, rotary tables, the causal or
   sliding-window mask), so another class is refused, naming why; so is a plan whose output is
   not the LM head's logits (or the final norm's hidden states): the last stage returns those.
2. **Module boundaries** (:func:`module_boundaries`): the cut before decoder layer ``k``
   (``k = L``: before the final norm) is a plan position between the last node reading a
   parameter of an earlier part (embedding, layers ``< k``) and the first reading one of a
   later part, the one whose cut carries the fewest bytes (after the residual add: the hidden
   state alone). A tied LM head (the embedding's weight) belongs to the head.
3. **Moved cuts** (:func:`on_module_boundaries`): a cut :func:`.two_d.two_d` chose elsewhere
   (between a layer's attention and its MLP) moves to the nearest boundary, the split is
   re-costed there (:func:`.two_d.cost_split`) and the move is reported (:class:`MovedCut`).
4. **Stage plans**: the ``parallelize_module`` plan of the blocks the cost model split in each
   stage (:func:`.tp_styles.style_specs`, or with sequence parallelism
   :func:`.tp_sequence.sequence_parallel_specs` on the whole model), renamed to the stage
   module's FQNs. With sequence parallelism the stage module takes its token shard itself
   after the embedding, so the decoder layers' ``PrepareModuleInput`` is dropped; between
   stages each rank sends its token shard.
5. **Stage module** (:func:`decoder_stage`): one deep copy of the parts a stage runs (tied
   weights stay tied within it), held by reference: ``embed_tokens``, ``layers.<i>``,
   ``norm``, ``lm_head``, ``rotary_emb``; the user's model is never changed.
"""

from __future__ import annotations

import copy
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from graphopt.analysis.kernel_class import KernelClass
from graphopt.errors import GraphoptError
from graphopt.ir.plan import Plan
from graphopt.partition.pipeline_dp import cut_bytes
from graphopt.partition.plan_flow import GEMMS
from graphopt.partition.problem import build_problem
from graphopt.partition.tp_blocks import find_tp_blocks, parameter_fqns
from graphopt.partition.tp_emit import head_attributes
from graphopt.partition.tp_sequence import sequence_parallel_specs
from graphopt.partition.tp_styles import Specs, build_styles, emittable, style_code, style_specs
from graphopt.partition.two_d import cost_split
from graphopt.partition.two_d_result import (
    MovedCut,
    StageModules,
    TwoD,
    TwoDLayout,
    TwoDRun,
    two_d_snippet,
)

__all__ = ["MovedCut", "TwoDRun", "apply_two_d", "decoder_of", "decoder_stage",
           "module_boundaries", "on_module_boundaries", "two_d_snippet"]

logger = logging.getLogger(__name__)

#: decoder class -> how its forward builds each layer's mask (transformers 5.x modeling files)
MASK_RULES = {"LlamaModel": "causal", "MistralModel": "sliding_window",
              "Qwen2Model": "layer_types"}
CAUSAL_LMS = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
_FIX = "use --strategy tensor or pipeline for this model"


@dataclass(frozen=True)
class _Decoder:
    fqn: str  # the decoder model's FQN ("" when it is the module)
    model: nn.Module
    lm_head: str | None
    rule: str

    def part(self, fqn: str, layers: int) -> int | None:
        """Case 2: -1 embedding, k decoder layer k, ``layers`` the norm or LM head."""
        pre = f"{self.fqn}." if self.fqn else ""
        if fqn.startswith(f"{pre}embed_tokens."):
            return -1
        if fqn.startswith(f"{pre}norm.") or (self.lm_head and fqn.startswith(f"{self.lm_head}.")):
            return layers
        m = re.match(re.escape(f"{pre}layers.") + r"(\d+)\.", fqn)
        return int(m.group(1)) if m else None


def decoder_of(module: nn.Module) -> _Decoder:
    """Case 1: the Llama-layout decoder in ``module``, or the error saying why there is none."""
    found = [(f, m) for f, m in module.named_modules() if type(m).__name__ in MASK_RULES
             and type(m).__module__.startswith("transformers.")]
    if len(found) != 1:
        raise GraphoptError(
            f"{type(module).__name__} holds {len(found)} transformers Llama/Mistral/Qwen2 "
            "decoders (LlamaModel, MistralModel, Qwen2Model), not one: the 2-D stages re-run "
            "those classes' rotary tables and masks between their layers", _FIX)
    fqn, dec = found[0]
    parent = fqn.rpartition(".")[0]
    outer = module.get_submodule(parent) if fqn else module
    head = outer.get_output_embeddings() if type(outer).__name__ in CAUSAL_LMS else None
    lm_head = next((f for f, m in outer.named_modules() if m is head), None) if head else None
    top = parent if lm_head is not None else fqn
    if lm_head is not None and parent:
        lm_head = f"{parent}.{lm_head}"
    inside = {id(t) for t in (module.get_submodule(top) if top else module).state_dict(
        keep_vars=True).values()}
    extra = [k for k, t in module.state_dict(keep_vars=True).items() if id(t) not in inside]
    if extra:
        raise GraphoptError(f"{type(module).__name__} holds {extra[0]} outside its decoder "
                            f"{top}: the 2-D stages run the decoder alone", _FIX)
    if not isinstance(getattr(dec, "layers", None), nn.ModuleList):
        raise GraphoptError(f"{fqn or 'the model'} keeps no nn.ModuleList of layers", _FIX)
    return _Decoder(fqn, dec, lm_head, MASK_RULES[type(dec).__name__])


def _owners(plan: Plan, module: nn.Module, source: Any, dec: _Decoder) -> list[int | None]:
    """Case 2: each node's part (:meth:`_Decoder.part`) from the parameters it reads."""
    fqns = parameter_fqns(source if source is not None else module)
    tied: dict[int, list[str]] = {}
    for f, p in module.named_parameters(remove_duplicate=False):
        tied.setdefault(id(p), []).append(f)
    alias = {f: names for names in tied.values() for f in names}
    layers = len(dec.model.layers)
    out: list[int | None] = []
    for n in plan.nodes:
        parts = {dec.part(a, layers) for t in n.inputs if t is not None and t.name in fqns
                 for a in alias.get(fqns[t.name], [fqns[t.name]])} - {None}
        gemm = n.analysis.kernel_class in GEMMS  # a tied LM head is the head, not the embedding
        out.append((max if gemm else min)(parts) if parts else None)  # type: ignore[type-var]
    return out


def module_boundaries(plan: Plan, module: nn.Module, devices: Any, *, source: Any = None
                      ) -> dict[int, int]:
    """Case 2: plan position -> the layer ``k`` the cut there comes before (``L``: the norm)."""
    dec = decoder_of(module)
    owners = _owners(plan, module, source, dec)
    cut = cut_bytes(build_problem(plan, devices))
    out: dict[int, int] = {}
    for k in range(len(dec.model.layers) + 1):
        lo = max((v for v, o in enumerate(owners) if o is not None and o < k), default=-1)
        hi = min((v for v, o in enumerate(owners) if o is not None and o >= k),
                 default=len(owners))
        if lo < hi:
            span = range(max(lo + 1, 1), min(hi, len(owners) - 1) + 1)
            if len(span):
                out[min(span, key=lambda j: (cut[j], j))] = k
    return out


def _check_output(plan: Plan, owners: list[int | None], layers: int) -> None:
    """Case 1: the plan returns one tensor, made (through views) by the norm or LM head."""
    outs = plan.model.output_names
    made = {t.name: v for v, n in enumerate(plan.nodes) for t in n.outputs if t is not None}
    v = made.get(outs[0]) if len(outs) == 1 else None
    while v is not None and owners[v] is None and plan.nodes[v].analysis.kernel_class in (
            KernelClass.VIEW, KernelClass.DATA_MOVEMENT):
        ins = [t.name for t in plan.nodes[v].inputs if t is not None and t.name in made]
        v = made[ins[0]] if len(ins) == 1 else None
    if v is None or owners[v] != layers:
        raise GraphoptError(f"the plan returns {len(outs)} tensor(s), not the LM head's logits "
                            "or the final norm's output alone: the last 2-D stage returns "
                            "those", "trace the model with use_cache=False, returning logits")


def _nearest(planned: list[int], spots: list[int]) -> list[int]:
    """Case 3: each cut to the nearest boundary, in order, leaving one for every later cut."""
    out, lo = [], 0
    for i, b in enumerate(planned):
        hi = len(spots) - (len(planned) - i)
        if lo > hi:
            raise GraphoptError(f"{len(planned) + 1} stages need {len(planned)} module "
                                f"boundaries; the decoder has {len(spots)}", _FIX)
        k = min(range(lo, hi + 1), key=lambda x: (abs(spots[x] - b), x))
        out.append(spots[k])
        lo = k + 1
    return out


def on_module_boundaries(res: TwoD, plan: Plan, module: nn.Module, *, source: Any = None,
                         device_type: str = "cuda") -> TwoD:
    """Cases 1-4: ``res`` with its cuts on module boundaries (re-costed when one moved), the
    moves reported, and the stage modules, plans and code (``layout``). Raises why not."""
    dec = decoder_of(module)
    if len({len(g) for g in res.groups[:len(res.stages)]}) != 1:
        raise GraphoptError("groups of different sizes "
                            f"({', '.join(str(len(s.group)) for s in res.stages)}) do not form "
                            "a (pp, tp) device mesh", "give every machine the same GPU count")
    layers = len(dec.model.layers)
    owners = _owners(plan, module, source, dec)
    _check_output(plan, owners, layers)
    spots = module_boundaries(plan, module, res.devices, source=source)
    planned = [s.first for s in res.stages[1:]]
    cuts = _nearest(planned, sorted(spots))
    moved = tuple(_moved(i, b, c, plan, owners, spots, dec)
                  for i, (b, c) in enumerate(zip(planned, cuts, strict=True)) if b != c)
    if moved:
        notes = {**res.notes, "planned_latency_s": res.latency_s,
                 "planned_bottleneck_s": res.bottleneck_s}
        res = cost_split(plan, res.devices, [0, *cuts, len(plan.nodes)],
                         groups=list(res.groups), source=source,
                         sequence_parallel=res.sequence_parallel, notes=notes)
        logger.info("2-D: %d cut(s) moved onto module boundaries; latency %.3g s", len(moved),
                    res.latency_s)
    ks = [0, *(spots[c] for c in cuts), layers]
    spans = [(ks[i], ks[i + 1]) for i in range(len(res.stages))]
    counts = [b - a for a, b in spans]
    notes = {k: v for k, v in res.notes.items() if k != "uneven"}
    notes["stage_layers"] = [list(s) for s in spans]
    if len(set(counts)) > 1:
        notes["uneven"] = (f"{layers} decoder layers over {len(spans)} stages: "
                           f"{', '.join(map(str, counts))}")
    stages = _stage_modules(res, plan, module, source, dec, spans)
    layout = TwoDLayout(dec.fqn, type(dec.model).__name__, layers, dec.lm_head, stages, "")
    out = replace(res, moved_cuts=moved, notes=notes, layout=layout)
    return replace(out, layout=replace(layout, code=two_d_snippet(out, device_type)))


def _moved(i: int, b: int, c: int, plan: Plan, owners: list[int | None],
           spots: Mapping[int, int], dec: _Decoder) -> MovedCut:
    layers = len(dec.model.layers)
    pre = f"{dec.fqn}." if dec.fqn else ""

    def name(part: int) -> str:
        return (f"{pre}embed_tokens" if part < 0 else f"{pre}norm" if part >= layers
                else f"{pre}layers.{part}")

    before = next((o for o in reversed(owners[:b]) if o is not None), -1)
    after = next((o for o in owners[b:] if o is not None), layers)
    why = (f"inside {name(before)}" if before == after else
           f"between {name(before)} and {name(after)}, where more than the hidden state crosses")
    return MovedCut(i, b, c, plan.nodes[b - 1].name, plan.nodes[c - 1].name,
                    f"before {name(spots[c])}", why)


def _stage_modules(res: TwoD, plan: Plan, module: nn.Module, source: Any, dec: _Decoder,
                   spans: list[tuple[int, int]]) -> tuple[StageModules, ...]:
    """Case 4: each stage's modules and its plan on the stage module's FQNs."""
    split = {b.block for s in res.stages for b in s.tp.splits}
    blocks = [b for b in find_tp_blocks(plan, source=source if source is not None
                                        else module)[0] if b.name in split]
    blocks, unsplit = emittable(blocks, module)
    if unsplit or len(blocks) != len(split):
        raise GraphoptError("the cost model split a block tp_emit cannot: "
                            f"{unsplit[0] if unsplit else 'one the whole plan does not name'}",
                            _FIX)
    if blocks and head_attributes(module, blocks, len(res.stages[0].group)):
        raise GraphoptError("the attention keeps its head counts as attributes "
                            "(transformers < 4.48): the stages would need them divided", _FIX)
    whole = sequence_parallel_specs(blocks, module) if res.sequence_parallel \
        else style_specs(blocks)
    pre = f"{dec.fqn}." if dec.fqn else ""
    per: list[Specs] = [{} for _ in spans]
    for fqn, spec in whole.items():
        if re.fullmatch(re.escape(f"{pre}layers.") + r"\d+", fqn):
            continue  # case 4: the stage module shards the tokens itself
        part = dec.part(f"{fqn}.", len(dec.model.layers))
        if part is None:
            raise GraphoptError(f"{fqn} is outside the decoder's parts", _FIX)
        s = next(i for i, (a, b) in enumerate(spans)
                 if a <= part < b or (part == -1 and i == 0) or (part == spans[-1][1]
                                                                 and i == len(spans) - 1))
        name = fqn.removeprefix(pre) if not (dec.lm_head and fqn == dec.lm_head) else "lm_head"
        per[s][name] = spec
    out = []
    for i, (a, b) in enumerate(spans):
        first, last = i == 0, i == len(spans) - 1
        mods = ([f"{pre}embed_tokens"] if first else []) + [f"{pre}layers.{k}"
                                                              for k in range(a, b)]
        mods += ([f"{pre}norm"] + ([dec.lm_head] if dec.lm_head else [])) if last else []
        out.append(StageModules(i, first, (a, b), last, tuple(mods), per[i],
                                {k: style_code(c, dict(kw)) for k, (c, kw) in per[i].items()}))
    return tuple(out)


class DecoderStage(nn.Module):
    """Case 5: decoder layers ``[a, b)`` of a Llama-layout model, with the embedding first and
    the final norm and LM head last when the stage has them; position ids, rotary tables and
    masks made here as the decoder's own ``forward`` makes them."""

    def __init__(self, parts: dict[str, Any], rule: str, first: int,
                 token_shards: tuple[int, int]) -> None:
        super().__init__()
        self.embed_tokens = parts["embed"]
        self.layers = nn.ModuleDict({str(first + i): m for i, m in enumerate(parts["layers"])})
        self.norm, self.lm_head = parts["norm"], parts["head"]
        self.rotary_emb = parts["rotary"]
        self.config, self.rule, self.token_shards = parts["config"], rule, token_shards

    def _kind(self, i: int) -> str:
        c = self.config
        sliding = (self.rule == "sliding_window" and getattr(c, "sliding_window", None)) or (
            self.rule == "layer_types" and c.layer_types[i] == "sliding_attention")
        return "sliding_attention" if sliding else "full_attention"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from transformers import masking_utils

        t, r = self.token_shards
        h = x if self.embed_tokens is None else self.embed_tokens(x)
        if self.embed_tokens is not None and t > 1:
            if h.shape[1] % t:
                raise GraphoptError(f"sequence parallelism over {t} devices got {h.shape[1]} "
                                    "tokens", f"pad the sequence to a multiple of {t}")
            h = h.tensor_split(t, dim=1)[r].contiguous()
        whole = h[:, :1].expand(h.shape[0], h.shape[1] * t, h.shape[2])
        pos = torch.arange(whole.shape[1], device=h.device).unsqueeze(0)
        kinds = {self._kind(int(i)) for i in self.layers}
        kw = {"config": self.config, "inputs_embeds": whole, "attention_mask": None,
              "past_key_values": None, "position_ids": pos}
        masks = {k: (masking_utils.create_sliding_window_causal_mask if k == "sliding_attention"
                     else masking_utils.create_causal_mask)(**kw) for k in kinds}
        rope = self.rotary_emb(whole, pos)
        for i, layer in self.layers.items():
            out = layer(h, attention_mask=masks[self._kind(int(i))], position_ids=pos,
                        position_embeddings=rope)
            h = out[0] if isinstance(out, tuple) else out
        if self.norm is not None:
            h = self.norm(h)
        if self.lm_head is not None:
            h = self.lm_head(h)
        return h.full_tensor() if hasattr(h, "full_tensor") else h


def decoder_stage(model: nn.Module, *, embed: bool, layers: tuple[int, int], head: bool,
                  token_shards: tuple[int, int] = (1, 0)) -> DecoderStage:
    """Case 5: the stage module for layers ``[a, b)`` of ``model`` (a deep copy of its parts;
    ``token_shards``: (tensor-parallel degree, this rank) with sequence parallelism)."""
    dec = decoder_of(model)
    a, b = layers
    if not 0 <= a <= b <= len(dec.model.layers):
        raise GraphoptError(f"layers {layers} are not in 0..{len(dec.model.layers)}",
                            "give the stage's [first, end) layer range")
    parts = copy.deepcopy({
        "embed": dec.model.embed_tokens if embed else None,
        "layers": list(dec.model.layers[a:b]),
        "norm": dec.model.norm if head else None,
        "head": model.get_submodule(dec.lm_head) if head and dec.lm_head else None,
        "rotary": dec.model.rotary_emb, "config": dec.model.config})
    return DecoderStage(parts, dec.rule, a, token_shards)


def apply_two_d(model: nn.Module, result: TwoD, mesh: Any, *, schedule: str | None = None
                ) -> TwoDRun:
    """Build this rank's stage of ``result`` (from :func:`on_module_boundaries`) on the 2-D
    ``mesh`` ``("pp", "tp")``: a deep copy of its parts, ``parallelize_module`` on
    ``mesh["tp"]``, ``PipelineStage`` over ``mesh["pp"]`` and the plan's schedule
    (``schedule``: "GPipe" or "1F1B" instead). Every rank calls it with the same model."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    from torch.distributed.tensor.parallel import parallelize_module

    lay = result.layout
    if lay is None:
        raise GraphoptError(f"this 2-D split has no module layout: {result.not_emitted or 'it'}"
                            " was costed only", "pass it through on_module_boundaries first")
    names = tuple(mesh.mesh_dim_names or ())
    if names != ("pp", "tp") or mesh["pp"].size() != len(lay.stages) \
            or mesh["tp"].size() != len(result.stages[0].group):
        want = f"(pp={len(lay.stages)}, tp={len(result.stages[0].group)})"
        raise GraphoptError(f"mesh {names} of shape {tuple(mesh.shape)} is not {want}",
                            "init_device_mesh(device, (pp, tp), mesh_dim_names=('pp', 'tp'))")
    dec = decoder_of(model)
    if (dec.fqn, len(dec.model.layers), dec.lm_head) != (lay.decoder, lay.layer_count,
                                                          lay.lm_head):
        raise GraphoptError(f"{type(model).__name__} is not the model this split was planned "
                            f"for ({lay.model_class} with {lay.layer_count} layers at "
                            f"{lay.decoder or 'the top'})", "plan the model you run")
    pp, tp = mesh["pp"].get_local_rank(), mesh["tp"]
    st = lay.stages[pp]
    shards = (tp.size(), tp.get_local_rank()) if result.sequence_parallel else (1, 0)
    stage = decoder_stage(model, embed=st.embed, layers=st.layers, head=st.head,
                          token_shards=shards)
    device = torch.device(mesh.device_type, torch.cuda.current_device()) \
        if mesh.device_type == "cuda" else torch.device(mesh.device_type)
    if st.specs:  # the split weights go to the device shard by shard
        parallelize_module(stage, tp, build_styles(dict(st.specs)))
    stage.to(device)  # then the rest: norms, embedding, rotary tables
    pipe = PipelineStage(stage, pp, len(lay.stages), device, group=mesh["pp"].get_group())
    kind = schedule or result.pipeline_schedule
    cls = {"GPipe": ScheduleGPipe, "1F1B": Schedule1F1B}.get(kind)
    if cls is None:
        raise GraphoptError(f"unknown pipeline schedule {kind!r}", "use 'GPipe' or '1F1B'")
    logger.info("2-D stage %d/%d: layers %s, %d styles over tp=%d", pp + 1, len(lay.stages),
                st.layers, len(st.specs), tp.size())
    return TwoDRun(stage, pipe, cls(pipe, n_microbatches=result.micro_batches),
                   result.micro_batches)
