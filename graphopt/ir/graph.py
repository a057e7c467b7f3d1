"""The one annotated graph that both frontends produce and every analysis reads.

A :class:`Graph` holds compute nodes in topological order and a table of tensors. Graph inputs,
parameters and constants are tensors, not nodes. Node ``op_type`` is a canonical op name from
:mod:`graphopt.ir.ops` (ONNX operator names, plus a few that ONNX lacks); ``source_op`` is the op as
the model spelled it (``aten.linear.default``, ``MatMul``, ``com.microsoft::FusedMatMul``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

__all__ = ["DTYPE_BITS", "Graph", "Node", "TensorInfo", "TensorKind", "dtype_bytes"]

TensorKind = Literal["input", "activation", "param", "constant"]

# Canonical dtype names and their widths in bits. Both frontends map to these names.
DTYPE_BITS: dict[str, int] = {
    "fp64": 64,
    "fp32": 32,
    "tf32": 32,  # stored as fp32
    "fp16": 16,
    "bf16": 16,
    "fp8_e4m3": 8,
    "fp8_e5m2": 8,
    "fp4": 4,
    "int64": 64,
    "int32": 32,
    "int16": 16,
    "int8": 8,
    "uint8": 8,
    "int4": 4,
    "uint4": 4,
    "bool": 8,
    "complex64": 64,
    "complex128": 128,
    "string": 0,
}


def dtype_bytes(dtype: str | None) -> float:
    """Bytes per element; unknown dtypes count as 4 bytes (fp32) so costs stay conservative."""
    if dtype is None or dtype not in DTYPE_BITS:
        return 4.0
    return DTYPE_BITS[dtype] / 8


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """Shape and dtype of one tensor.

    ``shape`` is ``None`` when the rank is unknown; a ``str`` entry is a dynamic dimension (its
    symbol, e.g. ``"batch"``). ``dtype`` is a key of :data:`DTYPE_BITS` or ``None`` if unknown.
    """

    name: str
    shape: tuple[int | str, ...] | None
    dtype: str | None
    kind: TensorKind = "activation"
    #: element count with dynamic dimensions taken as 1 (plan with what is known)
    numel: int = field(init=False, repr=False, compare=False)
    is_static: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # computed once: analysis reads these for every node, often several times
        numel, static = 1, self.shape is not None
        for d in self.shape or ():
            if type(d) is int:
                numel *= d
            else:
                static = False
        object.__setattr__(self, "is_static", static)
        object.__setattr__(self, "numel", numel)

    @property
    def nbytes(self) -> int:
        return math.ceil(self.numel * dtype_bytes(self.dtype))

    def dim(self, i: int, default: int = 1) -> int:
        """Dimension ``i`` (negative allowed); dynamic or missing dims give ``default``."""
        if self.shape is None or not -len(self.shape) <= i < len(self.shape):
            return default
        d = self.shape[i]
        return d if isinstance(d, int) else default

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": None if self.shape is None else list(self.shape),
                "dtype": self.dtype}


@dataclass(slots=True)
class Node:
    """One compute node; ``inputs``/``outputs`` are tensor names ('' = absent optional input)."""

    name: str
    op_type: str
    source_op: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)


class Graph:
    """Nodes in topological order plus the tensor table, with producer and consumer maps."""

    def __init__(
        self,
        name: str,
        source: Literal["torch", "onnx"],
        nodes: list[Node],
        tensors: dict[str, TensorInfo],
        inputs: list[str],
        outputs: list[str],
        warnings: list[str] | None = None,
        source_model: Any = None,
        shape_range: Any = None,
    ) -> None:
        self.name = name
        self.source = source
        self.nodes = nodes
        self.tensors = tensors
        self.inputs = inputs
        self.outputs = outputs
        self.warnings = warnings if warnings is not None else []
        #: the traced ``torch.fx.GraphModule`` / ``ExportedProgram`` or the ``onnx.ModelProto``,
        #: kept for the rewrite passes; analysis never reads it.
        self.source_model = source_model
        #: the dynamic dimensions and their ranges (a ``graphopt.ir.shape_range.ShapeRange``), or
        #: None for a model traced at static shapes
        self.shape_range = shape_range

    def __len__(self) -> int:
        return len(self.nodes)

    def tensor(self, name: str) -> TensorInfo | None:
        return self.tensors.get(name) if name else None

    def input_infos(self, node: Node) -> list[TensorInfo | None]:
        return [self.tensor(t) for t in node.inputs]

    def output_infos(self, node: Node) -> list[TensorInfo | None]:
        return [self.tensor(t) for t in node.outputs]

    @cached_property
    def node_by_name(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes}

    @cached_property
    def producer(self) -> dict[str, Node]:
        """Tensor name -> the node that writes it (graph inputs and params have none)."""
        return {t: n for n in self.nodes for t in n.outputs if t}

    @cached_property
    def consumers(self) -> dict[str, list[Node]]:
        """Tensor name -> nodes that read it, in topological order."""
        out: dict[str, list[Node]] = {}
        for n in self.nodes:
            for t in dict.fromkeys(n.inputs):
                if t:
                    out.setdefault(t, []).append(n)
        return out
