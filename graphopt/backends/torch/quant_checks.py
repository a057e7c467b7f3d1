"""The tensors of graphopt's low-bit ops, checked as their kernels assume them (issue 30).

Why: torch's low-bit kernels (``_scaled_mm``, ``_int_mm``, ``_weight_int8pack_mm``, the int4
kernels, the INT8 prepack) read a weight and its scales as dense row-major memory of an exact
shape: they ignore strides and trust sizes. A tensor with zero or permuted strides, a short
scale or an int4 group they do not take reads outside its bytes, or gives another answer with
no error. Each check here says what one op's stored tensors must be (dtype, exact shape, row-
major contiguous), for three callers: the op itself before its kernel (:mod:`.quant_ops`,
:mod:`.saved_format`), its fake (the same rules under FakeTensorMode) and ``graphopt.load``
(:func:`check_graph`), which refuses a damaged file naming the tensor instead of failing on
the first call. A bias is added by a stride-aware ``add``, so only its shape is fixed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from operator import attrgetter
from typing import Any

import torch
from torch import fx

from graphopt.backends.torch.quant_kernels import int4_inner_k_tiles
from graphopt.decisions.quantization.torch_kernels import INT4_GROUPS
from graphopt.errors import GraphoptError

__all__ = ["BadTensor", "check_graph", "check_int4", "check_int8_linear", "check_scaled",
           "same_device", "SCALED"]


class BadTensor(RuntimeError):
    """One argument of a low-bit op is not what its kernel reads; ``arg`` names it."""

    def __init__(self, op: str, arg: str, message: str) -> None:
        super().__init__(f"graphopt::{op}: {message}")
        self.arg = arg


#: op name -> (weight dtype, the scale's shape for N): what :func:`check_scaled` asks
SCALED: dict[str, tuple[torch.dtype, Callable[[int], tuple[int, ...]]]] = {
    "fp8_linear": (torch.float8_e4m3fn, lambda n: (n, 1)),
    "int8_dynamic_linear": (torch.int8, lambda n: (n,)),
    "int8_weight_only_linear": (torch.int8, lambda n: (n,)),
}


def _describe(t: torch.Tensor) -> str:
    return f"{t.dtype} {tuple(t.shape)} strides {tuple(t.stride())}"


def _dense(op: str, arg: str, t: torch.Tensor, dtype: torch.dtype | None,
           shape: tuple[int, ...], what: str) -> None:
    """``t`` is ``dtype`` (None: a float of 16 bits or more), exactly ``shape``, row-major."""
    ok_dtype = t.dtype == dtype if dtype is not None else \
        t.dtype.is_floating_point and t.dtype.itemsize >= 2
    if not ok_dtype or tuple(t.shape) != shape or not t.is_contiguous():
        want = str(dtype) if dtype is not None else "a float"
        raise BadTensor(op, arg, f"{arg} must be {what}: {want} {shape}, row-major contiguous "
                                 f"(the kernel reads it as dense memory); got {_describe(t)}")


def _bias(op: str, bias: torch.Tensor | None, n: int) -> None:
    if bias is not None and (tuple(bias.shape) != (n,) or not bias.dtype.is_floating_point):
        raise BadTensor(op, "bias", f"bias must be a float (N,) = ({n},); got "
                                    f"{_describe(bias)}")


def same_device(op: str, x: torch.Tensor, **tensors: torch.Tensor | None) -> None:
    """Every tensor on ``x``'s device, as the real kernels need."""
    for name, t in tensors.items():
        if t is not None and t.device != x.device:
            raise BadTensor(
                op, name, f"{name} is on {t.device} but x is on {x.device}; a quantized "
                "Linear's tensors must all be on one device (move the module with .to(), which "
                "moves its buffers, and its inputs)")


def check_scaled(op: str, weight: torch.Tensor, scale: torch.Tensor,
                 bias: torch.Tensor | None) -> tuple[int, int]:
    """(N, K) of an FP8 / INT8 op's weight (N, K), its per-row scale and bias."""
    dtype, scale_shape = SCALED[op]
    if weight.dim() != 2:
        raise BadTensor(op, "weight", f"weight must be {dtype} (N, K); got {_describe(weight)}")
    n, k = weight.shape
    _dense(op, "weight", weight, dtype, (n, k), "the quantized weight (N, K)")
    _dense(op, "scale", scale, None, scale_shape(n), "one scale per output row")
    _bias(op, bias, n)
    return n, k


def _int4_layout(packed: torch.Tensor, n: int, k: int, saved: bool
                 ) -> tuple[torch.dtype, tuple[int, ...], str]:
    """The dtype, shape and name of the int4 weight's layout for its device."""
    if saved or packed.device.type == "cpu":
        return torch.uint8, (n, k // 2), "saved nibbles" if saved else "cpu int4 layout"
    if packed.device.type == "cuda":
        tiles = int4_inner_k_tiles(k)
        return torch.int32, (n // 8, k // (tiles * 16), 32, tiles // 2), "cuda int4 layout"
    raise RuntimeError(f"no int4 kernel on {packed.device} (CPU and CUDA have one)")


def check_int4(op: str, packed: torch.Tensor, scales_zeros: torch.Tensor, group: int,
               bias: torch.Tensor | None, saved: bool) -> tuple[int, int]:
    """(N, K) of an int4 op's weight (nibbles or a device's pack), scales and zeros
    (K / group, N, 2) and bias; K is the groups' (``scales_zeros.shape[0] * group``)."""
    weight = "nibbles" if saved else "packed"
    if group not in INT4_GROUPS:  # the weight's group: named by the weight
        raise BadTensor(op, weight, f"group {group}: the int4 kernels take groups of "
                                    f"{', '.join(map(str, INT4_GROUPS))}")
    if scales_zeros.dim() != 3 or scales_zeros.shape[2] != 2:
        raise BadTensor(op, "scales_zeros", "scales_zeros must be (K / group, N, 2); got "
                                            f"{_describe(scales_zeros)}")
    groups, n, _ = scales_zeros.shape
    k = groups * group
    if n % 16 or k == 0:
        raise BadTensor(op, "scales_zeros", f"N={n}, K={k}: the int4 kernels need N divisible "
                                            "by 16 and at least one group")
    _dense(op, "scales_zeros", scales_zeros, None, (groups, n, 2), "(K / group, N, 2)")
    dtype, shape, where = _int4_layout(packed, n, k, saved)
    if packed.dtype != dtype or tuple(packed.shape) != shape or not packed.is_contiguous():
        raise BadTensor(
            op, weight, f"the weight is {_describe(packed)}, not "
            f"the {where} {dtype} {shape} (row-major); a packed int4 weight is made for one "
            "device (move the module with move_quantized, or int4_to_saved before moving and "
            "int4_from_saved after)")
    _bias(op, bias, n)
    return n, k


def check_int8_linear(weight: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
                      bias: torch.Tensor | None) -> tuple[int, int]:
    """(N, K) of the saved CPU INT8 Linear (:mod:`.saved_format`): the int8 weight, per-row
    scale and zero point the INT8 prepack reads."""
    op = "int8_linear"
    if weight.dim() != 2:
        raise BadTensor(op, "weight", f"weight must be int8 (N, K); got {_describe(weight)}")
    n, k = weight.shape
    _dense(op, "weight", weight, torch.int8, (n, k), "the quantized weight (N, K)")
    _dense(op, "scale", scale, None, (n,), "one scale per output row")
    _dense(op, "zero_point", zero_point, torch.int64, (n,), "one zero point per output row")
    _bias(op, bias, n)
    return n, k


def _stored(gm: fx.GraphModule, node: fx.Node, schema: Any, where: str, fix: str
            ) -> tuple[dict[str, Any], dict[str, str]]:
    """The op's arguments after ``x``: tensors read from the module, with their names."""
    values: dict[str, Any] = {}
    names: dict[str, str] = {}
    given = dict(zip((a.name for a in schema.arguments), node.args, strict=False))
    for arg, value in {**given, **node.kwargs}.items():
        if arg == "x":
            continue
        if isinstance(value, fx.Node):
            if value.op != "get_attr":
                raise GraphoptError(
                    f"{where}: {node.name} ({schema.name}): its {arg} is computed in the graph "
                    f"({value.name}), not a tensor the file stores; graphopt's quantize pass "
                    "stores every low-bit weight and scale", fix)
            names[arg] = str(value.target)
            value = attrgetter(names[arg])(gm)
        values[arg] = value
    return values, names


def _int4(op: str, saved: bool, scales_zeros: torch.Tensor, group: int,
          bias: torch.Tensor | None, packed: Any = None, nibbles: Any = None) -> Any:
    return check_int4(op, nibbles if saved else packed, scales_zeros, group, bias, saved)


#: graphopt's op -> its check, called with the op's arguments after ``x``
_CHECKS: dict[str, Callable[..., Any]] = {
    **{f"graphopt::{op}": functools.partial(check_scaled, op) for op in SCALED},
    "graphopt::int4_linear": functools.partial(_int4, "int4_linear", False),
    "graphopt::int4_linear_saved": functools.partial(_int4, "int4_linear_saved", True),
    "graphopt::int8_linear": check_int8_linear,
}


def check_graph(gm: fx.GraphModule, where: str, fix: str) -> int:
    """Every call of graphopt's low-bit ops in ``gm``, checked on the tensors the module
    stores (each must be one: a get_attr); the count. A GraphoptError (``where: ...``, then
    ``fix``) names the tensor."""
    count = 0
    for node in gm.graph.nodes:
        schema = getattr(node.target, "_schema", None)
        check = _CHECKS.get(schema.name) if node.op == "call_function" and schema else None
        if check is None:
            continue
        values, names = _stored(gm, node, schema, where, fix)
        try:
            check(**values)
        except RuntimeError as e:  # BadTensor names the argument
            arg = getattr(e, "arg", "weight")
            raise GraphoptError(f"{where}: the tensor {names.get(arg, arg)} ({arg} of "
                                f"{node.name}, {schema.name}) is damaged: {e}", fix) from None
        count += 1
    return count
