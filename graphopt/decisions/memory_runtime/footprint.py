"""The bytes a planned model occupies: its parameters at a chosen format and its activation peak.

What the model needs, apart from what the target offers (``memory``: reserve, workspace, max
batch). Cases (comments refer back to them; ``memory`` continues the numbering):

1. Parameters are counted once per unique tensor (tied weights are shared), at the chosen format:
   a format applies to the weight matrices (rank >= 2 params) of the nodes it is assigned to;
   1-D params (biases, norm scales) keep their dtype under block-quantized formats (llama.cpp
   keeps norms in f32; torch's quantize_dynamic keeps fp32 biases) and follow plain float casts.
   A tensor given two formats by two nodes is counted at the larger one (conservative).
2. Activation peak, not the sum: walking the nodes in execution order, a tensor is live from its
   producer (graph inputs: from the start) to its last consumer; graph outputs live to the end.
   The peak is the largest sum of live bytes at any step, so it is at least the inputs plus
   outputs of the largest node and at most the sum of all activations.
3. Views (kernel class ``view``: reshapes, torch's aliasing transposes/splits) share their
   input's storage: the alias extends the storage's lifetime and adds no bytes. A view of a
   parameter (``W.t()``) is parameter storage, not an activation. ``Shape``/``Size``/``Constant``
   make new (tiny) tensors and are not aliases.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from graphopt.analysis.kernel_class import KernelClass
from graphopt.decisions.quant_formats import QuantFormat, get_format
from graphopt.errors import GraphoptError
from graphopt.ir.graph import DTYPE_BITS, TensorInfo, dtype_bytes
from graphopt.ir.plan import Decision, Plan

__all__ = ["PrecisionSpec", "activation_peak", "param_bytes"]

_NOT_ALIASES = frozenset({"Shape", "Size", "Constant"})  # case 3

PrecisionSpec = Mapping[str, "str | float | Decision"] | str | None


def _bits_of(value: str | float | Decision) -> tuple[float, bool]:
    """(bits per weight, applies to 1-D params too) for one precision value (case 1)."""
    if isinstance(value, Decision):
        value = value.detail.format
    if isinstance(value, (int, float)):
        if value <= 0:
            raise GraphoptError(f"bits per weight must be positive, got {value}",
                                "pass e.g. 16, 8 or 4.5, or a format name like 'bf16'")
        return float(value), value >= 16
    fmt: QuantFormat = get_format(value)
    return fmt.bits_per_weight, fmt.family == "float"


def param_bytes(plan: Plan, precision: PrecisionSpec) -> tuple[int, int, int, int, str]:
    """(params, param bytes, constant bytes, fp32 param bytes, format label) -- case 1."""
    chosen: dict[str, float] = {}
    tensors: dict[str, TensorInfo] = {}
    for n in plan.nodes:
        spec: str | float | Decision | None
        if precision is None or isinstance(precision, str):
            spec = precision
        else:
            spec = precision.get(n.name)
        for t in n.inputs:
            if t is None or t.kind not in ("param", "constant"):
                continue
            tensors.setdefault(t.name, t)
            if t.kind != "param":
                continue
            own = float(DTYPE_BITS.get(t.dtype or "", 32))
            bits = own
            if spec is not None:
                b, all_ranks = _bits_of(spec)
                if all_ranks or len(t.shape or ()) >= 2:
                    bits = b
            chosen[t.name] = max(chosen.get(t.name, 0.0), bits)
    params = [t for t in tensors.values() if t.kind == "param"]
    count = sum(t.numel for t in params)
    pbytes = sum(math.ceil(t.numel * chosen.get(t.name, 32.0) / 8) for t in params)
    cbytes = sum(t.nbytes for t in tensors.values() if t.kind == "constant")
    if precision is None:
        label = "as traced"
    elif isinstance(precision, str):
        label = get_format(precision).key
    else:
        label = "per-node"
    return count, pbytes, cbytes, 4 * count, label


def _size(t: TensorInfo, activation_dtype: str | None) -> int:
    if activation_dtype and (t.dtype or "fp32").startswith(("fp", "bf", "tf")):
        return math.ceil(t.numel * dtype_bytes(activation_dtype))
    return t.nbytes


def activation_peak(plan: Plan, activation_dtype: str | None
                     ) -> tuple[int, int, str | None, int]:
    """(peak bytes, sum of all activation storages, node at the peak, unknown shapes) -- 2, 3."""
    nodes = plan.nodes
    last = max(0, len(nodes) - 1)
    root: dict[str, str] = {}  # tensor -> the storage it lives in
    size: dict[str, int] = {}
    start: dict[str, int] = {}
    end: dict[str, int] = {}
    unknown = 0
    outputs = set(plan.model.output_names)

    def storage(t: TensorInfo, step: int) -> str | None:
        nonlocal unknown
        if t.kind in ("param", "constant"):
            return None
        r = root.get(t.name)
        if r is None:
            r = root[t.name] = t.name
            size[r], start[r], end[r] = _size(t, activation_dtype), step, step
            unknown += t.shape is None
        return r

    for i, n in enumerate(nodes):
        for t in n.inputs:
            if t is None:
                continue
            r = storage(t, 0)  # first seen as an input: a graph input, live from the start
            if r is not None:
                end[r] = max(end[r], i)
        data = next((t for t in n.inputs if t is not None), None)
        alias = n.analysis.kernel_class is KernelClass.VIEW and n.op_type not in _NOT_ALIASES
        for t in n.outputs:
            if t is None:
                continue
            if alias and data is not None:  # case 3: share the input's storage (or none)
                src = root.get(data.name, data.name) if data.kind not in ("param", "constant") \
                    else None
                if src is None:
                    root[t.name] = t.name
                    size[t.name], start[t.name], end[t.name] = 0, i, i
                else:
                    root[t.name] = src
                continue
            storage(t, i)
    for name in outputs:
        r = root.get(name)
        if r is not None:
            end[r] = last
    delta = [0] * (len(nodes) + 1)
    for r, b in size.items():
        delta[start[r]] += b
        delta[end[r] + 1] -= b
    peak, live, peak_step = 0, 0, 0
    for step in range(max(1, len(nodes))):
        live += delta[step]
        if live > peak:
            peak, peak_step = live, step
    peak_node = nodes[peak_step].name if nodes else None
    return peak, sum(size.values()), peak_node, unknown
