"""The quantized Linear as graph ops (issue 22): what the torch quantize pass puts in place of
``aten.linear``, with the packed tensors as buffers of the GraphModule. Each op is a
``torch.library`` custom op, so ``torch.export`` keeps it as one node over plain tensors (no
subclass, nothing pickled) and the archive loads wherever this module is imported first
(``import graphopt.backends.torch.quant_ops`` before ``torch.export.load``).

The ops, all ``y = x @ W.T + b`` in ``x``'s dtype for ``x`` of any leading shape; the formats and
their error are :mod:`.quant_kernels`'s:

1. ``graphopt::fp8_linear(x, weight, scale, bias?)``: e4m3 weight (N, K), fp32 scale (N, 1);
   ``x`` quantized per token to e4m3 on every call, ``_scaled_mm`` with a bf16 output (CUDA's
   row-wise FP8 kernel writes only bf16), cast to ``x``'s dtype. Same code on CPU and CUDA.
2. ``graphopt::int8_dynamic_linear(x, weight, scale, bias?)``: W8A8. int8 weight (N, K)
   symmetric per row, fp32 scale (N,); ``x`` per token to int8 on every call; ``_int_mm``
   (int32) dequantized by ``x_scale * w_scale``. CUDA's ``_int_mm`` wants more than 16 rows
   (padded here) and K, N multiples of 8 (``kernel_refuses(..., device="cuda")``).
3. ``graphopt::int8_weight_only_linear(x, weight, scale, bias?)``: ``_weight_int8pack_mm``;
   on a CUDA torch without that kernel (it came with pytorch PR #159325), a dequantized
   ``F.linear``.
4. ``graphopt::int4_linear(x, packed, scales_zeros, group, bias?)``: 4-bit group-wise,
   ``W ~= (q - 8) * scale + zero``, scales_zeros (K / group, N, 2); ``packed`` is in its device's
   layout (CPU: ``_weight_int4pack_mm_for_cpu``'s; CUDA: tinygemm's, bf16 math). Neither layout
   is portable (the CPU's depends on the ISA), so this op is never saved:
5. ``graphopt::int4_linear_saved(x, nibbles, scales_zeros, group, bias?)``: the saved form,
   uint8 (N, K/2) nibbles; it packs for ``x``'s device on every call (slow, correct).
   :func:`int4_to_saved` / :func:`int4_from_saved` convert a graph between 4 and 5.

A fake (meta) kernel per op gives the output's shape, dtype and device, and refuses tensors on
different devices as the real kernels would (FakeTensorMode does not check custom ops). The op
and its fake both check each stored tensor as its kernel reads it (:mod:`.quant_checks`: dtype,
exact shape, row-major memory), since the kernels ignore strides and trust sizes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from operator import attrgetter
from typing import Any, TypeVar

import torch
from torch import fx

from graphopt.backends.torch import quant_checks as qc
from graphopt.backends.torch import quant_kernels as qk
from graphopt.decisions.quantization.torch_kernels import kernel_refuses
from graphopt.errors import GraphoptError
from graphopt.frontends.aten_ops import TORCH_DTYPES

__all__ = ["INT4_LINEAR", "INT4_LINEAR_SAVED", "QUANT_OPS", "has_quantized", "int4_from_saved",
           "int4_to_saved", "move_quantized", "pack_linear", "quantize_rows_int8"]

logger = logging.getLogger(__name__)
quantize_rows_int8 = qk.quantize_rows_int8  # the one per-row symmetric int8 quantizer
_T = TypeVar("_T")


def _check_linear(op: str, x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                  bias: torch.Tensor | None) -> int:
    """N, after the checks the real kernels need (devices, then :func:`.quant_checks.
    check_scaled`: dtypes, exact shapes, row-major memory), and x's K."""
    qc.same_device(op, x, weight=weight, scale=scale, bias=bias)
    n, k = qc.check_scaled(op, weight, scale, bias)
    if x.shape[-1] != k:
        raise qc.BadTensor(op, "x", f"x has {x.shape[-1]} features; the weight takes K={k}")
    return n


def _out(x: torch.Tensor, n: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], n))


# --- 1.-3. FP8, INT8 dynamic, INT8 weight-only: (x, weight, scale, bias) ---------------------
_LINEAR_SCHEMA = "(Tensor x, Tensor weight, Tensor scale, Tensor? bias) -> Tensor"


def _scaled_linear_op(name: str, kernel: Callable[..., torch.Tensor]) -> Any:
    """``graphopt::<name>(x, weight, scale, bias)`` over ``kernel`` (``quant_kernels``), with
    a fake that makes the real kernels' checks."""
    def run(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
            bias: torch.Tensor | None) -> torch.Tensor:
        _check_linear(name, x, weight, scale, bias)
        return kernel(x, weight, scale, bias)

    def fake(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
             bias: torch.Tensor | None) -> torch.Tensor:
        return _out(x, _check_linear(name, x, weight, scale, bias))

    op = torch.library.custom_op(f"graphopt::{name}", run, mutates_args=(),
                                 schema=_LINEAR_SCHEMA)
    op.register_fake(fake)
    return op


_scaled_linear_op("fp8_linear", qk.fp8_linear)
_scaled_linear_op("int8_dynamic_linear", qk.int8_dynamic_linear)
# the CUDA kernel or the fallback: :func:`.quant_kernels.int8_weight_only_linear`
_scaled_linear_op("int8_weight_only_linear", qk.int8_weight_only_linear)


# --- 4. and 5. INT4 ------------------------------------------------------------------------------
def _check_int4(op: str, x: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor,
                group: int, bias: torch.Tensor | None, saved: bool) -> int:
    """N, after the checks the real kernels need (devices, then :func:`.quant_checks.
    check_int4`: the group, the layout for the device, row-major memory), and x's K."""
    qc.same_device(op, x, packed=packed, scales_zeros=scales_zeros, bias=bias)
    n, k = qc.check_int4(op, packed, scales_zeros, group, bias, saved)
    if x.shape[-1] != k:
        raise qc.BadTensor(op, "x", f"x has {x.shape[-1]} features; scales_zeros has "
                                    f"{k // group} groups of {group} (K={k})")
    return n


@torch.library.custom_op("graphopt::int4_linear", mutates_args=(),
                         schema="(Tensor x, Tensor packed, Tensor scales_zeros, int group, "
                                "Tensor? bias) -> Tensor")
def _int4_linear(x: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor, group: int,
                 bias: torch.Tensor | None) -> torch.Tensor:
    _check_int4("int4_linear", x, packed, scales_zeros, group, bias, saved=False)
    return qk.int4_linear(x, packed, scales_zeros, group, bias)


@_int4_linear.register_fake
def _(x: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor, group: int,
      bias: torch.Tensor | None) -> torch.Tensor:
    return _out(x, _check_int4("int4_linear", x, packed, scales_zeros, group, bias, False))


@torch.library.custom_op("graphopt::int4_linear_saved", mutates_args=(),
                         schema="(Tensor x, Tensor nibbles, Tensor scales_zeros, int group, "
                                "Tensor? bias) -> Tensor")
def _int4_linear_saved(x: torch.Tensor, nibbles: torch.Tensor, scales_zeros: torch.Tensor,
                       group: int, bias: torch.Tensor | None) -> torch.Tensor:
    """Packs for x's device on every call; :func:`int4_from_saved` packs once instead."""
    _check_int4("int4_linear_saved", x, nibbles, scales_zeros, group, bias, saved=True)
    return qk.int4_linear(x, qk.int4_pack(nibbles), scales_zeros, group, bias)


@_int4_linear_saved.register_fake
def _(x: torch.Tensor, nibbles: torch.Tensor, scales_zeros: torch.Tensor, group: int,
      bias: torch.Tensor | None) -> torch.Tensor:
    return _out(x, _check_int4("int4_linear_saved", x, nibbles, scales_zeros, group, bias,
                               True))


#: kernel key (the plan's format) -> the op that runs it
QUANT_OPS: dict[str, torch._ops.OpOverload] = {
    "fp8_e4m3": torch.ops.graphopt.fp8_linear.default,
    "int8_dynamic": torch.ops.graphopt.int8_dynamic_linear.default,
    "int8_weight_only": torch.ops.graphopt.int8_weight_only_linear.default,
    "int4_weight_only": torch.ops.graphopt.int4_linear.default,
}
INT4_LINEAR = QUANT_OPS["int4_weight_only"]
INT4_LINEAR_SAVED: torch._ops.OpOverload = torch.ops.graphopt.int4_linear_saved.default
_ALL_OPS = (*QUANT_OPS.values(), INT4_LINEAR_SAVED)


def pack_linear(kernel: str, weight: torch.Tensor, act_dtype: torch.dtype,
                group: int | None = None) -> tuple[torch.Tensor, ...]:
    """The tensors of ``QUANT_OPS[kernel]`` after ``x`` and before ``bias``, for a CPU weight
    (N, K): packed for the CPU. For int4 the op's ``group`` (an int) follows them.

    Raises:
        ValueError: the CPU kernel cannot run this shape or dtype
            (:func:`~graphopt.decisions.quantization.torch_kernels.kernel_refuses`' reason); asked
            here too because one of these kernels crashes the process instead of raising.
    """
    n, k = weight.shape
    reason = kernel_refuses(kernel, k, n, TORCH_DTYPES.get(act_dtype, str(act_dtype)), group)
    if reason is not None:
        raise ValueError(f"{kernel} cannot run this Linear: {reason}")
    if kernel == "fp8_e4m3":
        return qk.pack_fp8(weight)
    if kernel == "int8_dynamic":
        return quantize_rows_int8(weight)
    if kernel == "int8_weight_only":
        return qk.pack_int8_weight_only(weight, act_dtype)
    assert group is not None  # kernel_refuses takes no other
    return qk.pack_int4(weight.cpu(), group, act_dtype)


# --- the graph: int4's saved form, moving a module -----------------------------------------------
def _set_tensor(gm: fx.GraphModule, target: str, value: torch.Tensor) -> None:
    prefix, _, name = target.rpartition(".")
    owner = gm.get_submodule(prefix)
    if name in owner._buffers:
        owner._buffers[name] = value
    else:
        setattr(owner, name, value)


def _swap_int4(gm: fx.GraphModule, source: torch._ops.OpOverload,
               target: torch._ops.OpOverload,
               convert: Callable[[torch.Tensor], torch.Tensor]) -> int:
    """Every ``source`` node becomes ``target``, its weight buffer converted (each buffer
    once, however many nodes read it), under the same name."""
    done: set[str] = set()
    count = 0
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not source:
            continue
        weight = node.args[1]
        if not isinstance(weight, fx.Node) or weight.op != "get_attr":
            raise GraphoptError(f"{node.name}: the int4 weight of {source} is not a module "
                                "buffer (a get_attr node)", "run this on the GraphModule the "
                                "quantize pass made or ExportedProgram.module(), not a lifted "
                                "graph")
        name = str(weight.target)
        if name not in done:
            _set_tensor(gm, name, convert(attrgetter(name)(gm)))
            done.add(name)
        node.target = target
        count += 1
    if count:
        gm.recompile()
        logger.debug("%d %s -> %s", count, source, target)
    return count


def int4_to_saved(gm: fx.GraphModule) -> int:
    """Every ``int4_linear`` -> ``int4_linear_saved``, its packed buffer -> nibbles; the count.

    A CPU pack is read back through the nibble order learned on this process
    (:func:`.quant_kernels.int4_unpack`); a CUDA pack by running the kernel on the identity,
    which needs the GPU it lives on.
    """
    return _swap_int4(gm, INT4_LINEAR, INT4_LINEAR_SAVED, qk.int4_unpack)


def int4_from_saved(gm: fx.GraphModule, device: torch.device | str | None = None) -> int:
    """Every ``int4_linear_saved`` -> ``int4_linear``, its nibbles packed once for ``device``
    (default: where the nibbles are); the count. Only the weight moves: the scales and the bias
    stay where they are (move the whole module with :func:`move_quantized`)."""
    def pack(nibbles: torch.Tensor) -> torch.Tensor:
        if nibbles.dtype != torch.uint8 or nibbles.dim() != 2:
            raise RuntimeError(f"int4 saved weight: {nibbles.dtype} {tuple(nibbles.shape)}, "
                               "not the uint8 (N, K/2) nibbles a save writes")
        to = nibbles.device if device is None else torch.device(device)
        if to.type != nibbles.device.type or to.index not in (None, nibbles.device.index):
            nibbles = nibbles.to(to)  # "cuda" is any CUDA device: a tensor there stays
        return qk.int4_pack(nibbles)

    return _swap_int4(gm, INT4_LINEAR_SAVED, INT4_LINEAR, pack)


def has_quantized(gm: fx.GraphModule) -> bool:
    """Whether ``gm`` calls any of these ops (moving it then needs :func:`move_quantized`)."""
    return any(n.op == "call_function" and n.target in _ALL_OPS for n in gm.graph.nodes)


def move_quantized(gm: fx.GraphModule, move: Callable[[], _T]) -> _T:
    """``move()`` (a ``Module._apply`` of ``gm``: ``.to``, ``.cuda``, ``.half``) with the
    quantized state kept valid; its result.

    Before: int4 weights to their saved form (a pack is one device's layout). After: the
    quantized weights and scales get their own dtypes back (``.half()`` would cast an e4m3
    weight as a float, and ``.to(bf16)`` round an fp32 scale), only their device follows
    ``move``; then int4 is packed for its new device. If ``move`` raises, int4 stays in its
    saved form, which runs anywhere. Use in ``OptimizedModule._apply``::

        def _apply(self, fn, recurse=True):
            apply = super()._apply
            return move_quantized(self.gm, lambda: apply(fn, recurse))
    """
    int4_to_saved(gm)
    kept: dict[str, torch.Tensor] = {}
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in _ALL_OPS:
            for arg, spec in zip(node.args, node.target._schema.arguments, strict=False):
                if spec.name not in ("x", "bias") and isinstance(arg, fx.Node) \
                        and arg.op == "get_attr":
                    kept[str(arg.target)] = attrgetter(str(arg.target))(gm)
    result = move()
    for name, before in kept.items():
        after = attrgetter(name)(gm)
        if after.dtype != before.dtype:
            _set_tensor(gm, name, before.to(after.device))
    int4_from_saved(gm)
    return result
