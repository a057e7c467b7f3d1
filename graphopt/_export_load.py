"""``torch.export.load`` and ``ExportedProgram.module()``, fast enough for a 7k-node graph.

torch 2.13 turns the archive's JSON into its schema dataclasses with ``_dict_to_dataclass``,
which calls ``typing.get_type_hints`` for every object (~360k objects for a 7k-node graph: 60%
of the load). :func:`export_load` runs the same conversion with the type hints and dataclass
fields looked up once per class, then torch's own deserializer; the result is the same
ExportedProgram. If torch's internals differ from what this expects, it is plain
``torch.export.load``. :func:`plain_module` unlifts the weights in place instead of
``ep.module()``'s copy.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import logging
import os
import types
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Annotated, Any

import torch
from torch import fx

__all__ = ["export_load", "plain_module"]

logger = logging.getLogger(__name__)


def _serde() -> Any:
    try:
        from torch._export.serde import serialize
    except ImportError:
        return None
    needed = ("_dict_to_dataclass", "_resolve_schema_cls", "_Union", "schema")
    return serialize if all(hasattr(serialize, n) for n in needed) else None


def _fast_converter(ser: Any) -> Callable[[Any, Any], Any]:
    """torch's ``_dict_to_dataclass`` (same branches, same order), with each class's branch,
    type hints and fields worked out once instead of per object."""
    schema_ns = vars(ser.schema)
    resolve, union_base = ser._resolve_schema_cls, ser._Union

    @functools.cache
    def converter(cls: Any) -> Callable[[Any], Any]:
        cls = resolve(cls)
        if isinstance(cls, str):
            raise AssertionError(f"Unresolved class type: '{cls}'.")
        origin, args = typing.get_origin(cls), typing.get_args(cls)
        if origin is Annotated:
            return converter(cls.__origin__)
        if origin in (typing.Union, types.UnionType) and type(None) in args:
            return lambda data: None if data is None else converter(args[0])(data)
        if isinstance(cls, type) and issubclass(cls, union_base):
            hints = typing.get_type_hints(cls, globalns=schema_ns)

            def union(data: dict[str, Any]) -> Any:
                ((key, value),) = data.items()
                return cls.create(**{key: converter(hints[key])(value)})
            return union
        if dataclasses.is_dataclass(cls):
            hints = typing.get_type_hints(cls, globalns=schema_ns)
            names = [f.name for f in dataclasses.fields(cls)]
            fields: list[tuple[str, Callable[[Any], Any]]] = []  # filled on first use

            def record(data: dict[str, Any]) -> Any:
                if not fields:  # not at definition: the schema's types are recursive
                    fields.extend((n, converter(hints[n])) for n in names)
                return cls(**{n: conv(data[n]) for n, conv in fields if n in data})
            return record

        def other(data: Any) -> Any:
            if isinstance(data, list):
                if not data:
                    return data
                item = converter(args[0])
                return [item(d) for d in data]
            if isinstance(data, dict):
                value = converter(args[1])
                return {k: value(v) for k, v in data.items()}
            return float(data) if cls is float else data
        return other

    return lambda cls, data: converter(cls)(data)


@contextmanager
def _fast_decoding() -> Iterator[None]:
    ser = _serde()
    if ser is None:
        yield
        return
    original = ser._dict_to_dataclass
    ser._dict_to_dataclass = _fast_converter(ser)  # the recursion goes through the global
    enabled = gc.isenabled()
    gc.disable()  # ~10^6 small objects that all live on: nothing for the collector to find
    try:
        yield
    finally:
        ser._dict_to_dataclass = original
        if enabled:
            gc.enable()


def export_load(f: str | os.PathLike[str] | IO[bytes], extra_files: dict[str, Any]
                ) -> torch.export.ExportedProgram:
    """``torch.export.load(f, extra_files=extra_files)``, decoded faster."""
    try:
        with _fast_decoding():
            return torch.export.load(f, extra_files=extra_files)
    except Exception as e:  # torch's own load decides, and its error is the one raised
        logger.debug("fast torch.export.load failed (%s): loading the plain way", e)
        if hasattr(f, "seek"):
            f.seek(0)
        return torch.export.load(f, extra_files=extra_files)


def plain_module(ep: torch.export.ExportedProgram) -> fx.GraphModule:
    """The program as the optimizer itself holds it: weights as attributes, no per-call input
    hooks (the wrapper checks the shape range), ``eval()`` allowed.

    Done on ``ep``'s own graph when it only lifts weights and returns plain tensors (what
    :func:`save` writes): ``ep.module()`` deep-copies the graph and compiles it twice more,
    a third of a 7k-node load.
    """
    from torch.export.graph_signature import InputKind, OutputKind

    sig, gm = ep.graph_signature, ep.graph_module
    kinds = {InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR,
             InputKind.USER_INPUT}
    out_spec = ep.call_spec.out_spec
    plain_out = out_spec is not None and (out_spec.is_leaf() or (
        out_spec.type is tuple and all(c.is_leaf() for c in out_spec.children())))
    if not plain_out or any(s.kind not in kinds for s in sig.input_specs) or \
            any(s.kind is not OutputKind.USER_OUTPUT for s in sig.output_specs):
        module = ep.module(check_guards=False)
        module._forward_pre_hooks.clear()
        module._forward_hooks.clear()
        for name in ("train", "eval"):
            vars(module).pop(name, None)
        return module
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    first_op = next(n for n in gm.graph.nodes if n.op != "placeholder")
    for node, spec in zip(placeholders, sig.input_specs, strict=True):
        if spec.kind is InputKind.USER_INPUT:
            continue
        persistent = spec.kind is InputKind.PARAMETER or (
            spec.kind is InputKind.BUFFER and spec.persistent)
        value = ep.state_dict[spec.target] if persistent else ep.constants[spec.target]
        name = "_".join(str(spec.target).split("."))
        if isinstance(value, torch.nn.Parameter):
            gm.register_parameter(name, value)
        else:
            gm.register_buffer(name, value, persistent=persistent)
        with gm.graph.inserting_before(first_op):
            attr = gm.graph.get_attr(name)
        attr.meta = node.meta
        node.replace_all_uses_with(attr)
        gm.graph.erase_node(node)
    if out_spec.is_leaf():  # the model returns one tensor, not a 1-tuple
        output = next(n for n in gm.graph.nodes if n.op == "output")
        output.args = (output.args[0][0],)
    return gm  # strip_unused recompiles it
