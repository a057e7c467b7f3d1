"""Each decision kind's own data, as a typed record: what ``Decision.detail`` holds.

A node's decisions are keyed by kind (``padding``, ``layout``, ``precision`` ...). Each kind has
its record here, whose fields are the keys its JSON object has always had, so a reader finds
every writer of a field by its class, and a misspelt key is an error, not a silent ``None``.

A kind whose JSON comes in more than one shape has one record per shape, tried in the order of
:data:`DETAILS` when a plan is read back (each refuses the keys of the others):

1. ``padding``: :class:`PaddingDetail` when the cost model was asked (sizes, gain, waste), else
   :class:`PaddingSkip` (an illegal site: no sizes; a depthwise conv that carries the padding
   instead: its old and new dims).
2. ``padding_carry``: :class:`PaddingCarryDetail` (channels carried through a node), or
   :class:`GroupsCarryDetail` (a depthwise conv's groups grown to the padded channels).
3. ``quantize``: :class:`WeightQuantDetail` (torch's weight-only guard, every key present,
   None included), else :class:`QuantizeDetail`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any, ClassVar

from graphopt.errors import GraphoptError
from graphopt.ir.records import Record, optional, read_json

__all__ = ["DETAILS", "Detail", "DeviceDetail", "DropDetail", "ExecPath", "ExecPathDetail",
           "FoldDetail", "GemmEdge", "GroupsCarryDetail", "Launch", "LayoutDetail",
           "LayoutFormat", "PaddingCarryDetail", "PaddingDetail", "PaddingSkip",
           "PaddingSliceDetail", "PrecisionDetail", "PrecisionRole", "QuantizeDetail", "RunsOn",
           "Sensitivity", "Tile", "WeightQuantDetail", "read_detail"]


class ExecPath(StrEnum):
    """A kernel's execution path (``decisions.kernels.exec_path``'s numbered GPU paths, the CPU
    ISA paths, and ``none`` for nodes that launch no kernel)."""

    NONE = "none"
    STANDARD = "standard"
    TMA = "tma"
    WGMMA = "wgmma"
    TMA_WGMMA = "tma_wgmma"
    TCGEN05 = "tcgen05"
    TMA_TCGEN05 = "tma_tcgen05"
    FP4_CLUSTER = "fp4_cluster"
    AMX = "amx"
    VNNI = "vnni"
    AVX512 = "avx512"
    AVX2 = "avx2"
    NEON = "neon"
    GENERIC = "generic"


class LayoutFormat(StrEnum):
    """A conv's memory format: NHWC (``torch.channels_last``) or the default NCHW."""

    CHANNELS_LAST = "channels_last"
    NCHW = "nchw"


class RunsOn(StrEnum):
    """Who applies a precision: torch's passes, ONNX Runtime's quantizers, or nobody here (a
    format torch has no kernel for: the plan counts it, a deployment runtime runs it)."""

    TORCH = "torch"
    ONNX = "onnx"
    PLAN_ONLY = "plan-only"


class PrecisionRole(StrEnum):
    """What a precision pass does with a node (``decisions.precision.roles`` assigns them; the
    values are the strings the passes always wrote)."""

    LOW = "low"  # runs in the reduced format
    ISLAND = "island"  # fp32: numerically sensitive, or an edit this backend cannot make
    WIDE = "wide"  # fp32 for another reason (an fp32 input, a constant that does not fit)
    KEEP = "keep"  # no fp32 result: reads its inputs at their original dtypes
    FIXED = "fixed"  # torch: an explicit cast, or one this pass inserted
    ITEM = "item"  # torch: getitem, at its producer's dtype
    WEAK = "weak"  # torch: a parameter/constant, converted to what its readers need
    ASSERT = "assert"  # torch: export's dtype check, updated to the new dtypes
    SKIP = "skip"  # torch: inputs, outputs, shape queries
    ANY = "any"  # ONNX: casts and shape queries read any dtype
    TF32 = "tf32"  # torch: an fp32 GEMM-like node on tf32 tensor cores (recorded only)


class GemmEdge(StrEnum):
    """The first or last weight GEMM of a model: its quantization error is not averaged out."""

    FIRST = "first"
    LAST = "last"


class Detail(Record):
    """Base of a decision's own data; ``KIND`` is its key among a node's decisions."""

    __slots__ = ()
    KIND: ClassVar[str] = ""


@dataclass(frozen=True)
class Tile(Record):
    """A kernel's tile: its MMA instruction and, where it has them, the tile's dims and the
    pipeline that feeds it (``decisions.kernels.config.KernelConfig``)."""

    instruction: str
    m: int | None = optional()
    n: int | None = optional()
    k: int | None = optional()
    stages: int | None = optional()
    k_iters: int | None = optional()
    swizzle_bytes: int | None = optional()
    waves: int | None = optional()
    efficiency: float | None = optional()
    swap_ab: bool | None = optional()  # present only when the operands are swapped


@dataclass(frozen=True)
class Launch(Record):
    """A kernel's launch geometry: what of it the template fixes."""

    grid: tuple[int, int, int] | None = optional()
    block: tuple[int, int, int] | None = optional()
    cluster: tuple[int, int, int] | None = optional()
    smem_bytes: int | None = optional()
    vector_width: int | None = optional()
    threads: int | None = optional()


@dataclass(frozen=True)
class ExecPathDetail(Detail):
    """Which engine and data mover the node's kernel uses; no tile for a node with no kernel."""

    KIND: ClassVar[str] = "exec_path"
    path: ExecPath
    tile: Tile | None = optional()
    launch: Launch | None = optional()
    instruction: str | None = optional()
    tma: bool | None = optional()


@dataclass(frozen=True)
class LayoutDetail(Detail):
    """A conv's memory format, its channels_last region (None: in none) and the region's
    predicted gain; ``backend``: why the backend runs it otherwise."""

    KIND: ClassVar[str] = "layout"
    format: LayoutFormat
    region: int | None
    predicted_gain_s: float | None
    backend: str | None = optional()


@dataclass(frozen=True)
class PaddingDetail(Detail):
    """Case 1 of the module doc: the dims before and after, the multiple padded to (None: the
    target asks for none), the FLOPs wasted on zeros and the predicted speedup; ``candidate``:
    the dims a declined pad would have had."""

    KIND: ClassVar[str] = "padding"
    old: Mapping[str, int]
    new: Mapping[str, int]
    multiple: int | None
    waste_pct: float
    predicted_gain: float
    candidate: Mapping[str, int] | None = optional()


@dataclass(frozen=True)
class PaddingSkip(Detail):
    """Case 1 of the module doc: a padding the cost model was not asked about."""

    KIND: ClassVar[str] = "padding"
    old: Mapping[str, int] | None = optional()
    new: Mapping[str, int] | None = optional()


@dataclass(frozen=True)
class PaddingCarryDetail(Detail):
    """Case 2: a node that runs on padded channels; ``clean``: its padding stays zero."""

    KIND: ClassVar[str] = "padding_carry"
    real: int
    padded: int
    clean: bool


@dataclass(frozen=True)
class GroupsCarryDetail(Detail):
    """Case 2: a depthwise conv whose groups grow with the padded channels."""

    KIND: ClassVar[str] = "padding_carry"
    old: Mapping[str, int]
    new: Mapping[str, int]


@dataclass(frozen=True)
class PaddingSliceDetail(Detail):
    """Padded channels sliced to the real ones before a node that cannot carry them."""

    KIND: ClassVar[str] = "padding_slice"


@dataclass(frozen=True)
class Sensitivity(Record):
    """What the ONNX guard measured for a lowered node (``backends.onnx.sensitivity``): an
    infinite error is written ``"overflow"`` (it starts there) or ``"inf"``."""

    local: float | str
    cumulative: float | str
    contribution: float | str | None
    rank: int
    kept: bool


@dataclass(frozen=True)
class PrecisionDetail(Detail):
    """The format a node runs at, and the facts that chose it: who applies it, the carrier it
    was weighed against, the torch kernel, the format a sensitive edge GEMM is measured at
    (``candidate*``), the backend's role for the node, and the guard's measurement."""

    KIND: ClassVar[str] = "precision"
    format: str  # a ``quant_formats`` key, "tf32", or a pre-quantized model's own dtype
    runs_on: RunsOn | None = optional()
    edge: GemmEdge | None = optional()
    baseline: str | None = optional()
    speedup: float | None = optional()
    method: str | None = optional()
    kernel: str | None = optional()
    group: int | None = optional()
    candidate: str | None = optional()
    candidate_kernel: str | None = optional()
    candidate_group: int | None = optional()
    island: bool | None = optional()
    role: PrecisionRole | None = optional()
    sensitivity: Sensitivity | None = optional()


@dataclass(frozen=True)
class QuantizeDetail(Detail):
    """A quantization pass's edit of a node: its format and method (None: not named)."""

    KIND: ClassVar[str] = "quantize"
    format: str | None = optional()
    method: str | None = optional()
    sensitivity: Sensitivity | None = optional()


@dataclass(frozen=True)
class WeightQuantDetail(Detail):
    """torch's weight-only lowering of a GEMM, measured by its guard: the kernel and group,
    the node's own error, its estimated share of the output's (None: not measured)."""

    KIND: ClassVar[str] = "quantize"
    format: str
    kernel: str | None
    group: int | None
    local: float | None
    contribution: float | None
    share: float | None


@dataclass(frozen=True)
class FoldDetail(Detail):
    """A BatchNorm folded ``into`` a GEMM, or the GEMM that ``absorbed`` it (neither: kept)."""

    KIND: ClassVar[str] = "fold"
    into: str | None = optional()
    absorbed: str | None = optional()


@dataclass(frozen=True)
class DropDetail(Detail):
    """An eval-mode dropout removed (or kept, in training mode)."""

    KIND: ClassVar[str] = "drop"


@dataclass(frozen=True)
class DeviceDetail(Detail):
    """Where a partitioned node runs and when; a tensor-parallel node's ``devices`` group and
    its ``share`` of the work; ``stage``: its pipeline stage."""

    KIND: ClassVar[str] = "device"
    device: str
    start_s: float
    finish_s: float
    devices: tuple[str, ...] | None = optional()
    share: str | None = optional()
    stage: int | None = optional()


#: kind -> its records, in the order a plan's JSON is read (module doc)
DETAILS: Mapping[str, tuple[type[Detail], ...]] = MappingProxyType({
    "exec_path": (ExecPathDetail,), "layout": (LayoutDetail,),
    "padding": (PaddingDetail, PaddingSkip),
    "padding_carry": (PaddingCarryDetail, GroupsCarryDetail),
    "padding_slice": (PaddingSliceDetail,), "precision": (PrecisionDetail,),
    "quantize": (WeightQuantDetail, QuantizeDetail), "fold": (FoldDetail,),
    "drop": (DropDetail,), "device": (DeviceDetail,)})


def read_detail(kind: str, data: Any, path: str = "") -> Detail:
    """The record of a ``kind`` decision's JSON object (its ``applied`` and ``reason`` apart);
    an unknown kind, or an object no record of the kind reads, is a GraphoptError."""
    classes = DETAILS.get(kind)
    if classes is None:
        raise GraphoptError(f"plan JSON: {path or 'a decision'} is of kind {kind!r}, which this "
                            f"graphopt does not know (it knows {sorted(DETAILS)}); write the "
                            "file again with this version")
    errors = []
    for cls in classes:
        try:
            return read_json(cls, data, path)
        except GraphoptError as e:
            errors.append(e)
    raise errors[0] if len(errors) == 1 else GraphoptError(
        f"plan JSON: {path or 'a decision'} fits no {kind} record: "
        + "; ".join(str(e) for e in errors))
