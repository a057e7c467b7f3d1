"""What a 2-D split costs (:func:`.two_d.two_d` fills it): its stages, each tensor-parallel over
its group, the request's clock and the report's dictionary; and, once :mod:`.two_d_emit` has
put its cuts on module boundaries, what it emits (:class:`TwoDLayout`, the code, and
:class:`TwoDRun`, what :func:`.two_d_emit.apply_two_d` returns on each rank).

Why apart: the search over cuts (:mod:`.two_d`) and the record it returns change for different
reasons; the record is what the report and :mod:`.tp_attach` read.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from graphopt.errors import GraphoptError
from graphopt.ir.plan_parallel import (
    LinkRow,
    MovedCutRow,
    ParallelizePlan,
    ParallelizeUnavailable,
    StageModulesRow,
    TwoDDeviceRow,
    TwoDLayoutRow,
    TwoDParallelPlan,
    TwoDPipeline,
    TwoDStageRow,
)
from graphopt.ir.plan_partition import CollectiveRow, Strategy, TwoDNotes
from graphopt.partition.devices import DeviceSet
from graphopt.partition.result import ScheduledNode, Transfer
from graphopt.partition.tp_result import TensorParallel

__all__ = ["MovedCut", "Stage2D", "StageModules", "TwoD", "TwoDLayout", "TwoDRun",
           "two_d_snippet"]


@dataclass(frozen=True)
class Stage2D:
    """One pipeline stage: plan nodes ``[first, end)`` split tensor-parallel over ``group``."""

    index: int
    group: tuple[str, ...]
    first: int
    end: int
    tp: TensorParallel
    send_bytes: int
    send_s: float

    @property
    def stage_s(self) -> float:
        """Compute, collectives and the outgoing transfer: what bounds the stream's rate."""
        return self.tp.makespan_s + self.send_s


@dataclass(frozen=True)
class MovedCut:
    """A cut the cost model chose off a module boundary, and where it went: plan positions (the
    cut before node ``position``), the nodes it followed and the module boundary's name."""

    boundary: int  # 0: the cut between stages 1 and 2
    planned: int
    moved_to: int
    planned_after: str
    moved_after: str
    at: str  # "before model.layers.2"
    why: str  # where the planned cut fell

    def to_row(self) -> MovedCutRow:
        return MovedCutRow((self.boundary + 1, self.boundary + 2), self.planned_after,
                           self.moved_after, self.planned, self.moved_to, self.at, self.why)


@dataclass(frozen=True)
class StageModules:
    """What one emitted stage runs: the embedding, decoder layers ``[layers[0], layers[1])``,
    the final norm and LM head (``head``), as the user's module FQNs (``modules``), and its
    ``parallelize_module`` plan on the stage module's own FQNs (``specs``: style class name and
    keyword arguments; ``styles``: the same as code)."""

    index: int
    embed: bool
    layers: tuple[int, int]
    head: bool
    modules: tuple[str, ...]
    specs: Mapping[str, tuple[str, Mapping[str, Any]]]
    styles: Mapping[str, str]

    def to_row(self) -> StageModulesRow:
        return StageModulesRow(self.index, self.embed, self.layers, self.head, self.modules,
                               dict(self.styles))


@dataclass(frozen=True)
class TwoDLayout:
    """A 2-D split put on a Llama-layout decoder's modules (:mod:`.two_d_emit`)."""

    decoder: str  # the decoder model's FQN in the user's module ("" when it is the module)
    model_class: str
    layer_count: int
    lm_head: str | None  # None: a base model, the last stage returns the hidden states
    stages: tuple[StageModules, ...]
    code: str  # what a user runs on every rank (:func:`.two_d_emit.two_d_snippet`)

    def to_row(self) -> TwoDLayoutRow:
        return TwoDLayoutRow(self.decoder, self.model_class, self.layer_count, self.lm_head,
                             tuple(s.to_row() for s in self.stages), self.code)


@dataclass(frozen=True)
class TwoD:
    """A 2-D split: stages in order, each tensor-parallel over its group.

    ``micro_batches`` and ``pipeline_schedule`` are the run's (:func:`.two_d.pipeline_rule`);
    ``moved_cuts`` and ``layout`` are set when :mod:`.two_d_emit` put the cuts on module
    boundaries (None: costed only, not emittable as it stands).
    """

    devices: DeviceSet
    groups: tuple[tuple[str, ...], ...]
    stages: tuple[Stage2D, ...]
    node_names: tuple[str, ...]
    latency_s: float
    bottleneck_s: float
    schedule: tuple[ScheduledNode, ...]
    transfers: tuple[Transfer, ...]
    notes: dict[str, Any] = field(default_factory=dict)
    micro_batches: int = 1
    pipeline_schedule: str = "GPipe"
    schedule_why: str = ""
    sequence_parallel: bool = False
    moved_cuts: tuple[MovedCut, ...] = ()
    layout: TwoDLayout | None = None
    not_emitted: str = ""  # why there is no layout, when known

    @property
    def throughput_per_s(self) -> float:
        return 1.0 / self.bottleneck_s if self.bottleneck_s > 0 else 0.0

    def _per_device(self, attr: str) -> dict[str, Any]:
        out: dict[str, Any] = {d.name: 0 for d in self.devices.devices}
        for s in self.stages:
            out.update(getattr(s.tp, attr))
        return out

    @property
    def memory_used(self) -> dict[str, int]:
        return self._per_device("memory_used")

    @property
    def busy_s(self) -> dict[str, float]:
        return self._per_device("busy_s")

    @property
    def collective_s(self) -> dict[str, float]:
        return self._per_device("collective_s")

    @property
    def over(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.stages:
            out.update(s.tp.over)
        return out

    @property
    def feasible(self) -> bool:
        return not self.over

    def overflow_text(self) -> str:
        return "; ".join(s.tp.overflow_text() for s in self.stages if s.tp.over)

    def collectives(self) -> tuple[CollectiveRow, ...]:
        """Every stage's collectives on the request's clock, with the devices they run on."""
        return tuple(c.row(start, s.group, s.index)
                     for s, start in zip(self.stages, self.stage_starts(), strict=True)
                     for c in s.tp.collectives)

    def stage_starts(self) -> list[float]:
        out, t = [], 0.0
        for s in self.stages:
            out.append(t)
            t += s.stage_s
        return out

    def to_record(self, parallelize: ParallelizePlan | ParallelizeUnavailable
                  ) -> TwoDParallelPlan:
        """The report's ``tensor_parallel`` section for the 2-D case."""
        caps = {d.name: d.memory_bytes for d in self.devices.devices}
        group_of = {n: i for i, g in enumerate(self.groups) for n in g}
        rows = [TwoDDeviceRow(**r.to_json(), stage=s.index)
                for s in self.stages for r in s.tp.device_rows()]
        used = {r.name for r in rows}
        rows = [replace(r, group=group_of[r.name]) for r in rows] + [
            TwoDDeviceRow(d.name, d.profile.name, d.memory_bytes, 0, 0, 0, 0.0, 0.0,
                          group_of[d.name], None)
            for d in self.devices.devices if d.name not in used]
        return TwoDParallelPlan(
            strategy=Strategy.TWO_D, degree=max(s.tp.degree for s in self.stages),
            groups=self.groups, makespan_s=self.latency_s,
            throughput_per_s=self.throughput_per_s, bottleneck_s=self.bottleneck_s,
            stages=tuple(self._stage_row(s) for s in self.stages), devices=tuple(rows),
            over={k: v for k, v in self.over.items() if k in caps},
            splits=tuple(b.to_row(s.index) for s in self.stages for b in s.tp.splits),
            fallbacks=tuple(sorted({f for s in self.stages for f in s.tp.fallbacks})),
            collectives=self.collectives(), notes=TwoDNotes.from_json(self.notes),
            pipeline=TwoDPipeline(
                self.micro_batches, self.pipeline_schedule, self.schedule_why,
                self.sequence_parallel, tuple(c.to_row() for c in self.moved_cuts),
                None if self.layout is None else self.layout.to_row(),
                self.not_emitted or None),
            parallelize_module=parallelize)

    def _stage_row(self, s: Stage2D) -> TwoDStageRow:
        link = s.tp.link
        return TwoDStageRow(s.index, s.group, self.node_names[s.first],
                            self.node_names[s.end - 1], s.end - s.first, s.tp.makespan_s,
                            s.tp.makespan_s - s.tp.compute_s, s.send_bytes, s.send_s,
                            s.stage_s, None if link is None else LinkRow(**link.to_dict()))


@dataclass(frozen=True)
class TwoDRun:
    """This rank's part of a 2-D run: its parallelized stage module, the ``PipelineStage`` and
    the schedule; :meth:`run` feeds the batch on the first stage and returns the last's
    output (None on other stages)."""

    module: Any  # two_d_emit.DecoderStage
    stage: Any
    schedule: Any
    micro_batches: int

    def run(self, input_ids: Any = None) -> Any:
        import torch

        t = self.module.token_shards[0]
        if self.stage.is_first and (input_ids is None or input_ids.shape[0] % self.micro_batches
                                    or input_ids.shape[1] % t):
            shape = None if input_ids is None else tuple(input_ids.shape)
            raise GraphoptError(f"input ids {shape}: the first stage needs a batch that splits "
                                f"into {self.micro_batches} micro-batches and tokens that divide "
                                f"by {t}", "pass the whole batch on the first stage's ranks")
        with torch.no_grad():
            return self.schedule.eval(input_ids) if self.stage.is_first \
                else self.schedule.eval()


def two_d_snippet(result: TwoD, device_type: str = "cuda") -> str:
    """The code a user runs on every rank (``torchrun --nnodes <pp> --nproc-per-node <tp>``)."""
    lay = result.layout
    if lay is None:
        raise GraphoptError("this 2-D split has no module layout", "call on_module_boundaries")
    pp, tp = len(lay.stages), len(result.stages[0].group)
    text = "\n".join(v for s in lay.stages for v in s.styles.values())
    styles = sorted(set(re.findall(r"\b([A-Z]\w+)\(", text)) - {"Replicate", "Shard"})
    layouts = [x for x in ("Replicate", "Shard") if f"{x}(" in text]
    sched = "Schedule1F1B" if result.pipeline_schedule == "1F1B" else "ScheduleGPipe"
    device = ('torch.device("cuda", torch.cuda.current_device())' if device_type == "cuda"
              else f'torch.device("{device_type}")')
    shards = "(tp.size(), tp.get_local_rank())" if result.sequence_parallel else "(1, 0)"
    return "\n".join([
        "import torch", "from torch.distributed.device_mesh import init_device_mesh",
        f"from torch.distributed.pipelining import PipelineStage, {sched}",
        *([f"from torch.distributed.tensor import {', '.join(layouts)}"] if layouts else []),
        "from torch.distributed.tensor.parallel import (",
        f"    {', '.join([*styles, 'parallelize_module'])})", "",
        "from graphopt.partition.two_d_emit import decoder_stage", "",
        f'mesh = init_device_mesh("{device_type}", ({pp}, {tp}), mesh_dim_names=("pp", "tp"))',
        'pp, tp = mesh["pp"].get_local_rank(), mesh["tp"]',
        *(f"# stage {s.index + 1}: {', '.join(_short(s.modules))}" for s in lay.stages),
        "STAGES = [", *(f"    dict(embed={s.embed}, layers={s.layers}, head={s.head}),"
                        for s in lay.stages), "]",
        *_plan_lines(lay),
        "# a deep copy of this stage's parts of the model (every rank passes the same model)",
        f"stage = decoder_stage(model, **STAGES[pp], token_shards={shards})",
        "parallelize_module(stage, tp, plan)  # the split weights go to the device",
        f"device = {device}",
        "stage.to(device)  # the rest: norms, embedding, rotary tables",
        f'pipe = PipelineStage(stage, pp, {pp}, device, group=mesh["pp"].get_group())',
        f"schedule = {sched}(pipe, n_microbatches={result.micro_batches})",
        "with torch.no_grad():  # the last stage returns the output, the others None",
        "    out = schedule.eval(input_ids) if pp == 0 else schedule.eval()",
    ])


def _plan_lines(lay: TwoDLayout) -> list[str]:
    """``plan`` for this rank's stage: one decoder layer's styles for every layer of the stage
    when they are the same everywhere (they are for Llama), else every stage's styles."""
    key = re.compile(r"layers\.\d+\.")
    each = [{key.sub("", k, count=1): v for k, v in s.styles.items() if key.match(k)}
            for s in lay.stages]
    layer = next((e for e in each if e), {})

    def text(d: Mapping[str, str]) -> str:
        return "{" + ", ".join(f"{k!r}: {v}" for k, v in d.items()) + "}"

    if any(e and e != layer for e in each):
        return ["PLANS = [", *(f"    {text(s.styles)}," for s in lay.stages), "]",
                "plan = PLANS[pp]"]
    return [
        "", "def layer_plan():  # fresh styles for each layer", "    return {",
        *(f"        {k!r}: {v}," for k, v in layer.items()), "    }", "", "OTHER = [",
        *(f"    {text({k: v for k, v in s.styles.items() if not key.match(k)})},"
          for s in lay.stages), "]",
        'first, end = STAGES[pp]["layers"]',
        'plan = {f"layers.{i}.{name}": style for i in range(first, end)',
        "        for name, style in layer_plan().items()} | OTHER[pp]"]


def _short(mods: tuple[str, ...]) -> list[str]:
    """``model.layers.0 .. 39`` for a run of decoder layers."""
    layers = [m for m in mods if re.search(r"layers\.\d+$", m)]
    if len(layers) > 2:
        at = mods.index(layers[0])
        mods = (*mods[:at], f"{layers[0]} .. {layers[-1].rpartition('.')[2]}",
                *mods[at + len(layers):])
    return list(mods)
