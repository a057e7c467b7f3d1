"""The layout of graphopt's ``.pt2`` archive, shared by the writer (:mod:`.saved`) and the
reader (:mod:`.load`): the marker and record names, and the INT8 linear's saved form.

One op of the optimized graph cannot be serialized by torch.export: the INT8 pass's
``quantized::linear_dynamic`` reads a packed-weight torchbind object. Saving writes it as
``graphopt::int8_linear(x, int8 weight, per-channel scale, zero point, bias)``, plain tensors
the archive stores (:func:`unpack_int8`), and loading packs those once and puts
``linear_dynamic`` back (:func:`repack_int8`): the same kernel, the same numbers.
"""

from __future__ import annotations

import json
import warnings
from operator import attrgetter
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import fx

from graphopt.backends.torch.quant_checks import BadTensor, check_int8_linear
from graphopt.errors import GraphoptError

__all__ = ["FORMAT", "INPUTS", "MARKER", "OUTPUTS", "PLAN", "RESAVE", "RUNTIME", "VERSION",
           "repack_int8", "structure_record", "structure_spec", "unpack_int8"]

#: the marker a graphopt archive carries; ``version`` rises when the layout changes
FORMAT, VERSION = "graphopt.optimized", 1  # the file marker: fixed, not a module path
MARKER, PLAN, RUNTIME, INPUTS = ("graphopt_format.json", "graphopt_plan.json",
                                     "graphopt_runtime.json", "graphopt_inputs.json")
OUTPUTS = "graphopt_outputs.json"  # the output structure (structure_record), field names kept
_LINEAR_DYNAMIC = torch.ops.quantized.linear_dynamic.default
RESAVE = "save it again with Optimized.save (graphopt.optimize(...).save(path))"


# --- the INT8 linear as an op torch.export can serialize -----------------------------------------
@torch.library.custom_op("graphopt::int8_linear", mutates_args=(),
                         schema="(Tensor x, Tensor weight, Tensor scale, Tensor zero_point, "
                                "Tensor? bias) -> Tensor")
def _int8_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                 zero_point: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The saved form of ``quantized::linear_dynamic``; packs per call (load packs once)."""
    _check_int8(x, weight, scale, zero_point, bias)
    return _LINEAR_DYNAMIC(x, _pack(weight, scale, zero_point, bias), True)


@_int8_linear.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
      bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], _check_int8(x, weight, scale, zero_point, bias)))


def _check_int8(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                zero_point: torch.Tensor, bias: torch.Tensor | None) -> int:
    """N, after what the INT8 prepack reads is checked (:func:`.quant_checks.
    check_int8_linear`) and x's K."""
    n, k = check_int8_linear(weight, scale, zero_point, bias)
    if x.shape[-1] != k:
        raise BadTensor("int8_linear", "x", f"x has {x.shape[-1]} features; the weight takes "
                                            f"K={k}")
    return n


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


# --- the output structure as graphopt's own JSON (record OUTPUTS) --------------------------------
def _fields(spec: Any) -> list[Any]:
    """A container's field names: a dict's keys, a ModelOutput's or named tuple's fields, else
    the positions as text."""
    n, ctx, typ = spec.num_children, spec.context, spec.type
    if typ is dict or (isinstance(ctx, (list, tuple)) and len(ctx) == n and
                       all(isinstance(k, str) for k in ctx)):
        return [k if type(k) in (str, int) else str(k) for k in ctx]
    names = list(getattr(ctx, "_fields", None) or getattr(typ, "_fields", None) or
                 [f.name for f in getattr(typ, "__dataclass_fields__", {}).values()])
    return names if len(names) == n else [str(i) for i in range(n)]


def structure_record(spec: Any) -> Any:
    """A pytree spec as JSON: None for a leaf, else the container's serialized type name, its
    field names (None for a tuple or list), its context as pytree's JSON (None if it has none
    JSON can hold) and its children. :func:`structure_spec` reads it back."""
    if spec.is_leaf():
        return None
    typ = spec.type
    node = pytree.SUPPORTED_SERIALIZED_TYPES.get(typ)
    name = node.serialized_type_name if node is not None and \
        node.serialized_type_name != pytree.NO_SERIALIZED_TYPE_NAME_FOUND else \
        f"{typ.__module__}.{typ.__qualname__}"
    if isinstance(spec.context, type) and hasattr(spec.context, "_fields"):  # a named tuple
        name = f"{spec.context.__module__}.{spec.context.__qualname__}"
    context = None
    if typ not in (tuple, list, dict):
        try:
            dump = getattr(node, "to_dumpable_context", None)
            context = dump(spec.context) if dump is not None else json.dumps(spec.context)
        except Exception:  # noqa: BLE001 - a context pytree cannot write: loads as a dict
            context = None
    return {"type": name, "fields": None if typ in (tuple, list) else _fields(spec),
            "context": context, "children": [structure_record(c) for c in spec.children()]}


def structure_spec(record: Any) -> Any:
    """The pytree spec a :func:`structure_record` describes, in this process: a container type
    this process has registered (the user imported it) comes back as itself; any other is a
    dict of the same field names, in order. No module the record names is imported."""
    if record is None:
        return pytree.tree_structure(0)
    if not isinstance(record, dict) or not isinstance(record.get("children"), list):
        raise TypeError(f"output structure {str(record)[:60]}")
    children = [structure_spec(c) for c in record["children"]]
    name, fields = record.get("type"), record.get("fields")
    if name in ("builtins.tuple", "builtins.list"):
        return pytree.TreeSpec(tuple if name == "builtins.tuple" else list, None, children)
    if not isinstance(fields, list) or len(fields) != len(children) or \
            any(type(k) not in (str, int) for k in fields):
        raise TypeError(f"output fields {str(fields)[:60]}")
    typ = pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE.get(name) if isinstance(name, str) else None
    context = record.get("context")
    if typ is not None and typ in pytree.SUPPORTED_NODES and isinstance(context, str):
        load = getattr(pytree.SUPPORTED_SERIALIZED_TYPES.get(typ), "from_dumpable_context",
                       None)
        try:
            ctx = load(context) if load is not None else json.loads(context)
            spec = pytree.TreeSpec(typ, ctx, children)
            pytree.tree_unflatten([0] * spec.num_leaves, spec)  # it rebuilds, or a dict
            return spec
        except Exception:  # noqa: BLE001 - a type of the same name that differs: a dict
            pass
    return pytree.TreeSpec(dict, list(fields), children)
