"""The plan's ``tensor_parallel`` section as typed records: a tensor-parallel split over one
group (:class:`TensorParallelPlan`) or a 2-D split, tensor parallel per group with pipeline
stages across groups (:class:`TwoDParallelPlan`), each with the ``parallelize_module`` plan
graphopt emits for it (or why there is none).

Why two section records: the 2-D split has stages, a pipeline and device rows with a stage
(null for a device no stage uses), which a one-group split has not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from graphopt.ir.plan_partition import CollectiveRow, Strategy, TwoDNotes
from graphopt.ir.records import Record, optional

__all__ = ["AttentionBlockRow", "BlockRow", "BlockSplitRow", "LMHeadBlockRow", "LinkRow",
           "MovedCutRow", "ParallelizePlan", "ParallelizeUnavailable", "SequenceParallelNotes",
           "StageModulesRow", "TPDeviceRow", "TPNotes", "TensorParallelPlan", "TwoDDeviceRow",
           "TwoDLayoutRow", "TwoDPipeline", "TwoDStageRow", "TwoDSupport", "TwoDParallelPlan"]


@dataclass(frozen=True)
class LinkRow(Record):
    """The link a group's collectives run over."""

    name: str
    bandwidth_bytes_per_s: float
    latency_s: float


@dataclass(frozen=True)
class TPDeviceRow(Record):
    """One device of a tensor-parallel group: its memory (parameters, activations), busy and
    collective time, and its group's index."""

    name: str
    target: str
    memory_bytes: int
    memory_used_bytes: int
    param_bytes: int
    activation_bytes: int
    busy_s: float
    collective_s: float
    group: int


@dataclass(frozen=True)
class TwoDDeviceRow(TPDeviceRow):
    """A device of a 2-D split, with its stage (None: no stage uses it)."""

    stage: int | None


@dataclass(frozen=True)
class BlockSplitRow(Record):
    """How one block is split and what it costs per device (``stage``: its 2-D stage)."""

    block: str
    kind: str
    degree: int
    dims: Mapping[str, str]
    column: tuple[str, ...]
    row: tuple[str, ...]
    compute_s: float
    unsplit_s: float
    collective: str
    allreduce_bytes: int
    allreduce_s: float
    stage: int | None = optional()


@dataclass(frozen=True)
class SequenceParallelNotes(Record):
    """Whether the split uses sequence parallelism, and what it adds."""

    enabled: bool
    nodes: int
    reduce_scatters: int
    all_gathers: int


@dataclass(frozen=True)
class TPNotes(Record):
    """What a tensor-parallel split runs replicated, and how its clock is modelled."""

    replicated: str
    replicated_nodes: int
    replicated_s: float
    sharded_tails: int
    sequence_parallel: SequenceParallelNotes
    collective_model: str
    throughput_is: str


@dataclass(frozen=True)
class BlockRow(Record):
    """A block (an MLP) in the ``parallelize_module`` plan: its column- and row-split Linears."""

    kind: str
    column: tuple[str, ...]
    row: tuple[str, ...]


@dataclass(frozen=True)
class AttentionBlockRow(BlockRow):
    """An attention block in the ``parallelize_module`` plan, with its heads per device."""

    module: str
    heads: int | None
    kv_heads: int | None
    local_heads: int
    local_kv_heads: int


@dataclass(frozen=True)
class LMHeadBlockRow(BlockRow):
    """A vocabulary-split LM head, gathered after."""

    gather: str


@dataclass(frozen=True)
class TwoDSupport(Record):
    """What torch's engine allows for 2-D parallelism, and where graphopt emits it."""

    torch_allows: bool
    emitted: bool
    emitter: str
    models: str
    statement: str
    recipe: str


@dataclass(frozen=True)
class ParallelizePlan(Record):
    """The ``parallelize_module`` plan for the user's module: styles per module, the blocks,
    why others run unsplit, the code; ``head_attributes``: the attention attributes it
    divides (given the module), as (before, after)."""

    engine: str
    degree: int
    mesh_shape: tuple[int, ...]
    mesh_dim_names: tuple[str, ...]
    sequence_parallel: bool
    plan: Mapping[str, str]
    blocks: tuple[AttentionBlockRow | LMHeadBlockRow | BlockRow, ...]
    unsplit: tuple[str, ...]
    code: str
    two_d: TwoDSupport
    head_attributes: Mapping[str, Mapping[str, tuple[int, int]]] | None = optional()


@dataclass(frozen=True)
class ParallelizeUnavailable(Record):
    """Why there is no ``parallelize_module`` plan, and what to change."""

    unavailable: str
    fix: str | None


@dataclass(frozen=True)
class TensorParallelPlan(Record):
    """A tensor-parallel split over one group: per device memory, busy and collective time,
    the block splits, the collectives on the timeline."""

    strategy: Strategy
    degree: int
    makespan_s: float
    compute_s: float
    throughput_per_s: float
    throughput_overlapped_per_s: float
    link: LinkRow | None
    devices: tuple[TPDeviceRow, ...]
    over: Mapping[str, int]
    splits: tuple[BlockSplitRow, ...]
    fallbacks: tuple[str, ...]
    collectives: tuple[CollectiveRow, ...]
    notes: TPNotes
    groups: tuple[tuple[str, ...], ...]
    parallelize_module: ParallelizePlan | ParallelizeUnavailable


@dataclass(frozen=True)
class TwoDStageRow(Record):
    """One pipeline stage of a 2-D split: its group, its nodes and its times."""

    stage: int
    group: tuple[str, ...]
    first: str
    last: str
    nodes: int
    compute_s: float
    collective_s: float
    send_bytes: int
    send_s: float
    stage_s: float
    link: LinkRow | None


@dataclass(frozen=True)
class MovedCutRow(Record):
    """A cut moved onto a module boundary: from where, to where, why."""

    between_stages: tuple[int, int]
    planned_after: str
    moved_after: str
    planned_position: int
    moved_position: int
    at: str
    why: str


@dataclass(frozen=True)
class StageModulesRow(Record):
    """What one emitted stage runs (module FQNs) and its ``parallelize_module`` styles."""

    stage: int
    embed: bool
    layers: tuple[int, int]
    head: bool
    modules: tuple[str, ...]
    plan: Mapping[str, str]


@dataclass(frozen=True)
class TwoDLayoutRow(Record):
    """A 2-D split on a Llama-layout decoder's modules, and the code each rank runs."""

    decoder: str
    model_class: str
    layer_count: int
    lm_head: str | None
    stages: tuple[StageModulesRow, ...]
    code: str


@dataclass(frozen=True)
class TwoDPipeline(Record):
    """How the 2-D split's stages run: micro-batches, schedule, sequence parallelism, and what
    is emitted (None: costed only, with why in ``not_emitted``)."""

    micro_batches: int
    schedule: str
    schedule_why: str
    sequence_parallel: bool
    moved_cuts: tuple[MovedCutRow, ...]
    emitted: TwoDLayoutRow | None
    not_emitted: str | None


@dataclass(frozen=True)
class TwoDParallelPlan(Record):
    """A 2-D split: stages in order, each tensor parallel over its group."""

    strategy: Strategy
    degree: int
    groups: tuple[tuple[str, ...], ...]
    makespan_s: float
    throughput_per_s: float
    bottleneck_s: float
    stages: tuple[TwoDStageRow, ...]
    devices: tuple[TwoDDeviceRow, ...]
    over: Mapping[str, int]
    splits: tuple[BlockSplitRow, ...]
    fallbacks: tuple[str, ...]
    collectives: tuple[CollectiveRow, ...]
    notes: TwoDNotes
    pipeline: TwoDPipeline
    parallelize_module: ParallelizePlan | ParallelizeUnavailable
