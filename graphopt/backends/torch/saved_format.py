"""The layout of graphopt's ``.pt2`` archive, shared by the writer (:mod:`.saved`) and the
reader (:mod:`.load`): the marker and record names, and the INT8 linear's saved form.

One op of the optimized graph cannot be serialized by torch.export: the INT8 pass's
``quantized::linear_dynamic`` reads a packed-weight torchbind object. Saving writes it as
``graphopt::int8_linear(x, int8 weight, per-channel scale, zero point, bias)``, plain tensors
the archive stores (:func:`unpack_int8`), and loading packs those once and puts
``linear_dynamic`` back (:func:`repack_int8`): the same kernel, the same numbers.
"""

from __future__ import annotations

import warnings
from operator import attrgetter
from typing import Any

import torch
from torch import fx

from graphopt.errors import GraphoptError

__all__ = ["FORMAT", "INPUTS", "MARKER", "PLAN", "RESAVE", "RUNTIME", "VERSION", "repack_int8",
           "unpack_int8"]

#: the marker a graphopt archive carries; ``version`` rises when the layout changes
FORMAT, VERSION = "graphopt.optimized", 1  # the file marker: fixed, not a module path
MARKER, PLAN, RUNTIME, INPUTS = ("graphopt_format.json", "graphopt_plan.json",
                                     "graphopt_runtime.json", "graphopt_inputs.json")
_LINEAR_DYNAMIC = torch.ops.quantized.linear_dynamic.default
RESAVE = "save it again with Optimized.save (graphopt.optimize(...).save(path))"


# --- the INT8 linear as an op torch.export can serialize -----------------------------------------
@torch.library.custom_op("graphopt::int8_linear", mutates_args=(),
                         schema="(Tensor x, Tensor weight, Tensor scale, Tensor zero_point, "
                                "Tensor? bias) -> Tensor")
def _int8_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                 zero_point: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The saved form of ``quantized::linear_dynamic``; packs per call (load packs once)."""
    return _LINEAR_DYNAMIC(x, _pack(weight, scale, zero_point, bias), True)


@_int8_linear.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
      bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


_INT8_LINEAR = torch.ops.graphopt.int8_linear.default


def _pack(weight: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
          bias: torch.Tensor | None) -> Any:
    q = torch._make_per_channel_quantized_tensor(weight, scale, zero_point, 0)
    return torch.ops.quantized.linear_prepack(q, bias)


def unpack_int8(gm: fx.GraphModule) -> int:
    """``linear_dynamic(x, packed)`` -> ``int8_linear(x, w, scale, zp, b)`` with buffers."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not _LINEAR_DYNAMIC:
            continue
        packed = node.args[1]
        qweight, bias = torch.ops.quantized.linear_unpack(attrgetter(str(packed.target))(gm))
        tensors = {"w": qweight.int_repr(), "scale": qweight.q_per_channel_scales(),
                   "zp": qweight.q_per_channel_zero_points(), "b": bias}
        args: list[Any] = [node.args[0]]
        with gm.graph.inserting_before(node):
            for key, t in tensors.items():
                if t is None:
                    args.append(None)
                    continue
                name = f"_graphopt_int8_{count}_{key}"
                gm.register_buffer(name, t.detach().clone())
                args.append(gm.graph.get_attr(name))
            new = gm.graph.call_function(_INT8_LINEAR, tuple(args))
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        count += 1
    if count:
        gm.graph.eliminate_dead_code()
        gm.delete_all_unused_submodules()
        for name in [k for k, v in vars(gm).items() if isinstance(v, torch.ScriptObject)]:
            delattr(gm, name)  # the packed weights, now in the buffers
        gm.recompile()
    return count


def repack_int8(gm: fx.GraphModule) -> int:
    """The inverse of :func:`unpack_int8` on a loaded graph: pack once, call the kernel."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not _INT8_LINEAR:
            continue
        x, *parts = node.args
        tensors = [None if p is None else attrgetter(str(p.target))(gm) for p in parts]
        if any(t is not None and t.device.type != "cpu" for t in tensors):
            raise GraphoptError("the saved model has dynamic INT8 Linear layers "
                                "(quantized::linear_dynamic), which run on the CPU only",
                                "load it with device='cpu', or optimize with quantize='none' "
                                "for a GPU")
        name = f"_graphopt_int8_packed_{count}"
        with warnings.catch_warnings():  # quantized tensors are deprecated but the CPU path
            warnings.simplefilter("ignore", UserWarning)
            setattr(gm, name, _pack(*tensors))
            with gm.graph.inserting_before(node):
                new = gm.graph.call_function(_LINEAR_DYNAMIC,
                                             (x, gm.graph.get_attr(name), True))
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        count += 1
    return count
