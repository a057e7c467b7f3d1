"""What-if costs: the planner's own cost of one op, from its dims alone.

``estimate_op("gemm", M=4096, N=4096, K=4096, dtype="fp8", target="h100")`` builds a one-node
graph of that op, runs the same analysis (:func:`graphopt.analysis.annotate`) and roofline
(:func:`graphopt.cost.roofline.estimate`) a plan runs, and says what the estimate assumed: the
time, the bound, the fraction of the datasheet peak it used and why, and the unit it runs on. It
is not a second model: change the planner's cost model and these numbers follow.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from graphopt.analysis import annotate
from graphopt.analysis.kernel_class import GEMM_LIKE, KernelClass
from graphopt.cost.attention import attention_kernel
from graphopt.cost.calibrated import measured_matrix_rate
from graphopt.cost.conv_taps import tap_efficiency
from graphopt.cost.efficiency import matrix_efficiency
from graphopt.cost.roofline import efficiency, estimate, tc_alignment
from graphopt.errors import GraphoptError
from graphopt.hardware.profile import HardwareProfile
from graphopt.hardware.registry import resolve_targets
from graphopt.ir.graph import Graph, Node, TensorInfo

__all__ = ["KINDS", "OpEstimate", "estimate_op"]

#: dtype names users write -> (graphopt tensor dtype, roofline peak override)
_DTYPES = {"fp32": ("fp32", None), "tf32": ("fp32", "tf32"), "bf16": ("bf16", None),
           "fp16": ("fp16", None), "fp8": ("fp8_e4m3", None), "fp8_e4m3": ("fp8_e4m3", None),
           "fp8_e5m2": ("fp8_e5m2", None), "int8": ("int8", None)}
_MAX_DIM = 2**40  # one dim
_MAX_NUMEL = 2**48  # one tensor's elements: half a petabyte in bf16
_UNITS = {"tensor_core": "tensor cores", "cuda_core": "CUDA cores", "cpu_matrix": "CPU matrix "
          "unit (AMX)", "cpu_simd": "CPU SIMD units", "none": "no kernel"}


@dataclass(frozen=True)
class OpEstimate:
    """One op's estimated time on one target, and what the estimate assumed."""

    kind: str
    target: str
    dtype: str
    dims: dict[str, int]
    kernel_class: str
    flops: int
    bytes: int
    time_s: float
    bound: str
    #: fraction of the datasheet peak the compute time assumes (efficiency x utilization x
    #: alignment), and of the datasheet bandwidth the memory time assumes
    compute_fraction: float
    memory_fraction: float
    utilization: float
    alignment_efficiency: float
    kernel: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _gemm(d: dict[str, int], dtype: str) -> Graph:
    m, n, k, batch = d["M"], d["N"], d["K"], d.get("batch", 1)
    a_shape = (batch, m, k) if batch > 1 else (m, k)
    out = (batch, m, n) if batch > 1 else (m, n)
    return _one("MatMul", [("a", a_shape, "input"), ("b", (k, n), "param")], out, dtype)


def _gemv(d: dict[str, int], dtype: str) -> Graph:
    return _gemm({"M": d.get("M", 1), **d}, dtype)


def _attention(d: dict[str, int], dtype: str) -> Graph:
    b, h, s, hd = d["batch"], d["heads"], d["seq"], d["head_dim"]
    skv = d.get("seq_kv", s)
    kv = d.get("kv_heads", h)
    ins = [("q", (b, h, s, hd), "input"), ("k", (b, kv, skv, hd), "input"),
           ("v", (b, kv, skv, hd), "input")]
    return _one("Attention", ins, (b, h, s, hd), dtype, is_causal=bool(d.get("causal", 0)),
                scale=None)


def _conv(d: dict[str, int], dtype: str) -> Graph:
    b, ci, co, h, w = d["batch"], d["c_in"], d["c_out"], d["h"], d["w"]
    k, s, g = d.get("kernel", 3), d.get("stride", 1), d.get("groups", 1)
    p = d.get("padding", k // 2)
    if ci % g or co % g:
        raise GraphoptError(f"conv: groups={g} must divide c_in={ci} and c_out={co}",
                            "give groups that divide both channel counts")
    oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    if oh < 1 or ow < 1:
        raise GraphoptError(f"conv: a {k}x{k} kernel with padding {p} does not fit {h}x{w}",
                            "give a larger h/w or a smaller kernel")
    ins = [("x", (b, ci, h, w), "input"), ("w", (co, ci // g, k, k), "param")]
    return _one("Conv", ins, (b, co, oh, ow), dtype, group=g, strides=[s, s],
                pads=[p, p, p, p], dilations=[1, 1], kernel_shape=[k, k])


def _elementwise(d: dict[str, int], dtype: str) -> Graph:
    numel, inputs = d["numel"], d.get("inputs", 2)
    if inputs == 1:
        return _one("Relu", [("x", (numel,), "input")], (numel,), dtype)
    return _one("Add", [("x", (numel,), "input"), ("y", (numel,), "input")], (numel,), dtype)


#: kind -> (graph builder, required dims, optional dims, positional order for the CLI)
KINDS: dict[str, tuple[Callable[[dict[str, int], str], Graph], tuple[str, ...],
                       tuple[str, ...]]] = {
    "gemm": (_gemm, ("M", "N", "K"), ("batch",)),
    "gemv": (_gemv, ("N", "K"), ("M", "batch")),
    "attention": (_attention, ("batch", "heads", "seq", "head_dim"),
                  ("seq_kv", "kv_heads", "causal")),
    "conv": (_conv, ("batch", "c_in", "c_out", "h", "w"),
             ("kernel", "stride", "padding", "groups")),
    "elementwise": (_elementwise, ("numel",), ("inputs",)),
}


def _one(op: str, ins: list[tuple[str, tuple[int, ...], str]], out: tuple[int, ...],
         dtype: str, **attrs: Any) -> Graph:
    tensors = {n: TensorInfo(n, s, dtype, kind) for n, s, kind in ins}  # type: ignore[arg-type]
    tensors["out"] = TensorInfo("out", out, dtype)
    node = Node("op", op, op, [n for n, _, _ in ins], ["out"], attrs)
    return Graph("what-if", "onnx", [node], tensors,
                 [n for n, _, kind in ins if kind == "input"], ["out"])


def _check_dims(kind: str, d: dict[str, int]) -> None:
    """Dims that build no real op: a size beyond any device, a flag that is not 0/1, GQA
    heads that do not divide the query heads, an input count the kind has no op for."""
    big = [f"{k}={v}" for k, v in d.items() if v > _MAX_DIM]
    if big:
        raise GraphoptError(f"{kind}: {', '.join(big)} is larger than {_MAX_DIM:,} (2**40)",
                            "give sizes a device can hold, like M=4096")
    if d.get("causal", 0) not in (0, 1):
        raise GraphoptError(f"{kind}: causal={d['causal']} is neither 0 nor 1",
                            "give causal=1 for a causal mask, causal=0 (the default) for none")
    heads, kv = d.get("heads", 1), d.get("kv_heads")
    if kv is not None and (kv > heads or heads % kv):
        raise GraphoptError(f"{kind}: kv_heads={kv} does not divide heads={heads}",
                            "give kv_heads that divides heads (grouped-query attention: "
                            f"e.g. kv_heads=8 for heads=32), or leave it out for kv_heads={heads}")
    if d.get("inputs", 1) not in (1, 2):
        raise GraphoptError(f"{kind}: inputs={d['inputs']} is neither 1 nor 2",
                            "give inputs=1 (a unary op like Relu) or inputs=2 (a binary op "
                            "like Add)")


def _check_size(kind: str, graph: Graph) -> None:
    for t in graph.tensors.values():
        if math.prod(t.shape) > _MAX_NUMEL:
            shape = "x".join(map(str, t.shape))
            raise GraphoptError(f"{kind}: tensor {t.name} ({shape}) has more than "
                                f"{_MAX_NUMEL:,} (2**48) elements, more than any device holds",
                                "give smaller sizes")


def estimate_op(kind: str, *, dtype: str = "bf16", target: str | HardwareProfile = "h100",
                **dims: int) -> OpEstimate:
    """The planner's estimate for one ``kind`` op (``KINDS``) of ``dims`` in ``dtype``."""
    if kind not in KINDS:
        raise GraphoptError(f"unknown op kind {kind!r}", f"use one of {', '.join(KINDS)}")
    if dtype not in _DTYPES:
        raise GraphoptError(f"unknown dtype {dtype!r}", f"use one of {', '.join(_DTYPES)}")
    build, required, optional = KINDS[kind]
    missing = [d for d in required if d not in dims]
    unknown = [d for d in dims if d not in required + optional]
    if missing or unknown:
        raise GraphoptError(f"{kind} needs {', '.join(required)}"
                            + (f" (optional: {', '.join(optional)})" if optional else "")
                            + (f"; missing {', '.join(missing)}" if missing else "")
                            + (f"; unknown {', '.join(unknown)}" if unknown else ""),
                            f"e.g. graphopt cost {kind} "
                            + " ".join(f"{d}=..." for d in required))
    bad = [f"{k}={v!r}" for k, v in dims.items()
           if not isinstance(v, int) or isinstance(v, bool)
           or v < (0 if k in ("causal", "padding") else 1)]
    if bad:
        raise GraphoptError(f"{kind} dims must be positive integers: {', '.join(bad)}",
                            "give sizes like M=4096")
    _check_dims(kind, dims)
    profiles = resolve_targets(target)
    if len(profiles) != 1:
        raise GraphoptError("estimate_op costs on one target", "give one target name")
    profile = profiles[0]
    tensor_dtype, peak = _DTYPES[dtype]
    graph = build(dict(dims), tensor_dtype)
    _check_size(kind, graph)
    a = annotate(graph)["op"]
    c = estimate(a, profile, peak)
    # the roofline's own factors: datasheet peak x efficiency x utilization x alignment
    eff = efficiency(profile.kind, "matrix" if a.kernel_class in GEMM_LIKE else "vector")
    kernel_eff = 1.0  # attention's softmax and tile losses, a tiny-C conv's padded taps
    if c.unit == "tensor_core":
        eff = matrix_efficiency(profile, c.precision,
                                conv=a.kernel_class is KernelClass.CONV).fraction
        kernel_eff = tap_efficiency(a, profile, 128 // tc_alignment(c.precision))[0]
        if a.kernel_class is KernelClass.ATTENTION:
            kernel_eff = attention_kernel(a, profile)[0]
    measured = measured_matrix_rate(a, profile, c.precision) \
        if not profile.is_gpu and a.kernel_class in GEMM_LIKE else None
    if measured is not None:  # a calibrated CPU: its measured GEMM rate over the table peak
        eff = measured / (profile.peak_flops.get(c.precision)
                          or profile.vector_flops.get(c.precision) or measured)
    factors = eff * c.utilization * c.alignment_efficiency * kernel_eff
    datasheet = c.peak_flops_used / factors if factors else 0.0
    compute_fraction = factors if c.unit != "none" else 0.0
    memory_fraction = c.bandwidth_used / profile.bandwidth_bytes_per_s
    unit = _UNITS.get(c.unit, c.unit)
    kernel = f"{unit}, {c.precision}"
    reason = (f"{c.bottleneck}-bound: compute {c.compute_time_s * 1e6:.3g} us at "
              f"{c.peak_flops_used / 1e12:.4g} TFLOP/s ({compute_fraction:.0%} of the "
              f"{datasheet / 1e12:.4g} TFLOP/s {c.precision} peak of the {unit}: efficiency "
              f"{eff:.2f}{' measured by calibrate' if measured else ''} x utilization "
              f"{c.utilization:.2f} x alignment "
              f"{c.alignment_efficiency:.2f}"
              + (f" x kernel {kernel_eff:.2f}" if kernel_eff != 1.0 else "")
              + f"), memory {c.memory_time_s * 1e6:.3g} us at "
              f"{c.bandwidth_used / 1e9:.4g} GB/s ({memory_fraction:.0%} of "
              f"{profile.bandwidth_bytes_per_s / 1e9:.4g} GB/s), launch "
              f"{c.overhead_s * 1e6:.3g} us" + (f"; {c.note}" if c.note else ""))
    return OpEstimate(kind, profile.name, dtype, dict(a.dims), a.kernel_class.value, a.flops,
                      a.bytes_total, c.est_time_s, c.bottleneck, compute_fraction,
                      memory_fraction, c.utilization, c.alignment_efficiency, kernel, reason)
