"""The plan's ``llm`` section as typed records (the report's ``llm`` object, key for key).

:func:`graphopt.api.llm.plan_llm` fills it on both phase plans (the same record): the model's
cache layout, the batch range, one row per batch and phase, the weight formats the rows are
costed at, the KV cache in memory and the notes. The numbers' meaning is
:mod:`graphopt.api.llm`'s numbered cases; the report renders it with
:mod:`graphopt.report.llm_section`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from graphopt.ir.records import Record

__all__ = ["BatchRange", "DecodeRow", "GemmFormats", "LLMMemory", "LLMModel", "LLMSection",
           "PhaseFormats", "PrefillRow"]


@dataclass(frozen=True, slots=True)
class LLMModel(Record):
    """The decoder's cache layout and size: what the KV bytes and the bound are computed from."""

    layers: int
    kv_heads: int
    head_dim: int
    heads: int
    dtype: str  # the weights' (and the cache's) torch dtype, "bfloat16"
    param_bytes: int
    param_count: int


@dataclass(frozen=True, slots=True)
class BatchRange(Record):
    """The batch range both phases were traced over, and the batch they were decided at."""

    min: int
    opt: int
    max: int


@dataclass(frozen=True, slots=True)
class GemmFormats(Record):
    """One phase's weight GEMMs by format (case 5), and those kept at the weights' dtype."""

    #: format -> how many weight GEMMs are costed at it
    gemm_formats: Mapping[str, int]
    #: node -> why it stays at the weights' dtype although a format was asked for
    kept: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class PhaseFormats(Record):
    """The weight formats of each phase."""

    prefill: GemmFormats
    decode: GemmFormats


@dataclass(frozen=True, slots=True)
class DecodeRow(Record):
    """Decode at one batch (case 2): one token per sequence against the cache."""

    batch: int
    step_s: float
    #: kernel class -> how many weight GEMMs run as it (GEMVs at batch 1)
    weight_gemm_classes: Mapping[str, int]
    #: bottleneck -> how many GEMM-like nodes it bounds
    gemm_bottlenecks: Mapping[str, int]
    launch_s: float  # the launches' share of the step
    tokens_per_s: float
    kv_read_bytes: int
    bound_tokens_per_s: float  # batch / ((weight + KV bytes) / bandwidth)
    cache_append_s: float  # the torch.cat copies of the cache
    tokens_per_s_static_cache: float  # without those copies
    share_of_bound: float
    fits: bool  # within the memory plan's largest batch


@dataclass(frozen=True, slots=True)
class PrefillRow(Record):
    """Prefill at one batch (case 3): the prompt of each sequence; the step is the TTFT."""

    batch: int
    step_s: float
    weight_gemm_classes: Mapping[str, int]
    gemm_bottlenecks: Mapping[str, int]
    launch_s: float
    tokens_per_s: float
    kv_write_bytes: int
    flops: int
    bound_tokens_per_s: float  # the datasheet roofline
    bound_by: str  # "compute" | "bandwidth"
    share_of_bound: float


@dataclass(frozen=True, slots=True)
class LLMMemory(Record):
    """The KV cache beside the decode plan's memory plan (case 4), and the batch advice."""

    kv_bytes_per_sequence: int
    kv_bytes_per_token: int
    kv_bytes_at_max: int
    bytes_per_sequence: int  # the cache and the activations that grow with the batch
    weight_bytes: int  # at the rows' formats
    param_format: str
    required_bytes_at_max: int
    usable_bytes: int
    fits_at_max: bool
    max_batch_size: int
    batch_note: str
    recommended_batch_size: int
    batch_decided_by: str
    batch_advice: str


@dataclass(frozen=True, slots=True)
class LLMSection(Record):
    """Prefill and decode of a causal LM over a batch range on one target."""

    model: LLMModel
    target: str
    bandwidth_bytes_per_s: float
    prompt_len: int
    cache_len: int
    batch: BatchRange
    quantize: str  # "none", "auto" or a format key
    carrier: str  # the format activations are carried in beside a quantized weight
    weight_formats: PhaseFormats
    decode: tuple[DecodeRow, ...]
    prefill: tuple[PrefillRow, ...]
    memory: LLMMemory
    notes: tuple[str, ...]

    def row(self, phase: str, batch: int) -> DecodeRow | PrefillRow:
        """The ``phase`` ("decode" or "prefill") row at ``batch``."""
        rows = {"decode": self.decode, "prefill": self.prefill}[phase]
        for r in rows:
            if r.batch == batch:
                return r
        raise KeyError(f"no {phase} row at batch {batch}: the rows are at "
                       f"{[r.batch for r in rows]}")
