"""Loading what :meth:`Optimized.save` wrote (``graphopt.load``), from anyone's file.

Nothing here unpickles or hands the file to a loader that does (``torch.export.load`` unpickles
members of the archive): the file must carry graphopt's marker, graphopt's own reader
(:mod:`graphopt.backends.torch.pt2_reader`) builds the graph, and graphopt's JSON records are
checked field by
field. Anything else is a GraphoptError that says what the file is or what could not be read.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree

from graphopt._version import __version__
from graphopt.backends.torch import pt2_reader
from graphopt.backends.torch.optimized_module import OptimizedModule
from graphopt.backends.torch.pipeline import strip_unused
from graphopt.backends.torch.pt2_archive import Damaged, Unhandled
from graphopt.backends.torch.quant_checks import check_graph
from graphopt.backends.torch.quant_ops import INT4_LINEAR, int4_from_saved
from graphopt.backends.torch.saved_format import (
    FORMAT,
    INPUTS,
    MARKER,
    OUTPUTS,
    PLAN,
    RESAVE,
    RUNTIME,
    VERSION,
    repack_int8,
    structure_spec,
)
from graphopt.decisions.memory_runtime.runtime import RuntimeSettings, Setting
from graphopt.errors import GraphoptError, first_line
from graphopt.files.read import check_regular
from graphopt.ir.shape_range import ShapeRange

__all__ = ["load"]

logger = logging.getLogger("graphopt.backends.torch.saved")

_MAX_THREADS = 1024  # no machine's plan asks for more (the session config's bound too)

_FOREIGN = ("graphopt.load reads only what Optimized.save writes and never unpickles; if you "
            "trust the file, load it with torch.export.load / torch.load(weights_only=True) "
            "yourself, or " + RESAVE)


def _check_archive(path: Path) -> Any:
    """The archive at ``path`` if graphopt wrote it (its marker read within bounds), else a
    GraphoptError that says what the file is."""
    if not path.is_file():  # a FIFO is never opened (it would block): said from a stat

        check_regular(path, f"the saved model {path}", "give the path Optimized.save wrote",
                      missing=f"no saved model at {path}")
    with open(path, "rb") as f:  # torch writes no zip comment: the archive ends with its
        f.seek(0, os.SEEK_END)  # end record; a cut file may still hold a nested zip's
        f.seek(max(0, f.tell() - 22))
        end = f.read(4)
        f.seek(0)
        zipped = f.read(4) == b"PK\x03\x04"
    if not zipped:
        raise GraphoptError(f"{path} is not a graphopt saved model: not a zip archive "
                            "(a text file, or a truncated or corrupt .pt2)", RESAVE)
    if end != b"PK\x05\x06":
        raise GraphoptError(f"{path} is not a whole graphopt saved model: the zip archive's "
                            "end record is not at the end (a truncated or corrupt .pt2)",
                            RESAVE)
    ar = pt2_reader.open_archive(path)
    marker = next((n for n in sorted(ar.names) if n.endswith(f"/extra/{MARKER}")), None)
    if marker is None:
        kind = ("a torch.save file" if any(n.endswith("/data.pkl") for n in ar.names)
                else "a torch.export archive" if any(n.endswith("/archive_format")
                                                    for n in ar.names)
                else "a zip archive")
        raise GraphoptError(f"{path} is {kind} without graphopt's marker ({MARKER}): not "
                            "written by graphopt", _FOREIGN)
    try:
        data = ar.json(marker)
    except (Damaged, Unhandled) as e:
        raise GraphoptError(f"{path} is a damaged graphopt archive: {e}", RESAVE) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise GraphoptError(f"{path} has a {MARKER} that is not graphopt's", _FOREIGN)
    if data.get("version") != VERSION:
        raise GraphoptError(f"{path} is graphopt archive version {data.get('version')!s:.20} "
                            f"(written by graphopt {data.get('graphopt')!s:.40}); this graphopt "
                            f"({__version__}) reads version {VERSION}",
                            "load it with the graphopt version that wrote it, or " + RESAVE)
    return ar


def _json(extra: dict[str, Any], key: str, path: Path) -> Any:
    try:
        data = json.loads(extra[key])
    except (KeyError, TypeError, ValueError, RecursionError) as e:
        raise GraphoptError(f"{path}: graphopt's record {key} is missing or damaged "
                            f"({first_line(e)})", RESAVE) from None
    if not isinstance(data, dict):
        raise GraphoptError(f"{path}: graphopt's record {key} is not a JSON object", RESAVE)
    return data


def _settings(data: dict[str, Any]) -> Any:
    """A ``RuntimeSettings`` from its ``to_dict`` form (what ``apply_runtime_settings`` takes)."""
    kw: dict[str, Any] = {"target": str(data["target"]), "device": str(data["device"])}
    for f in fields(RuntimeSettings):
        s = data.get(f.name)
        if isinstance(s, dict):
            value = s.get("value")
            if not _plain_value(value):
                raise TypeError(f"runtime setting {f.name} is {str(value)[:40]}")
            if f.name == "num_threads" and value is not None and not (
                    type(value) is int and 1 <= value <= _MAX_THREADS):
                raise TypeError(f"num_threads is {str(value)[:20]}, not 1-{_MAX_THREADS}")
            kw[f.name] = Setting(tuple(value) if isinstance(value, list) else value,
                                 str(s.get("reason", "")))
    return RuntimeSettings(**kw)


def _plain_value(v: Any) -> bool:
    scalar = (type(None), bool, int, float, str)
    return isinstance(v, scalar) or (isinstance(v, list) and all(isinstance(x, scalar)
                                                                 for x in v))


def _inputs(inputs: dict[str, Any]) -> tuple[list[str], list[tuple[int, ...] | None], Any]:
    """Input names, shapes and shape range from their record, each of its own type."""
    names, shapes = inputs["names"], inputs["shapes"]
    if not isinstance(names, list) or not all(n is None or isinstance(n, str) for n in names):
        raise TypeError(f"input names {str(names)[:60]}")
    if not isinstance(shapes, list) or not all(
            s is None or (isinstance(s, list) and all(type(d) is int and d >= 0 for d in s))
            for s in shapes):
        raise TypeError(f"input shapes {str(shapes)[:60]}")
    record = inputs.get("shape_range")
    if record is not None and not isinstance(record, dict):
        raise TypeError(f"shape range {str(record)[:60]}")
    shape_range = ShapeRange.from_dict(record) if record else None
    return names, [None if s is None else tuple(s) for s in shapes], shape_range


def _outputs(ar: Any, path: Path) -> dict[str, Any] | None:
    """The output record (None in a file written before it), after checking that this process
    has every model-library op the graph calls (:func:`.saved._library_ops`)."""
    try:
        name = f"{ar.root}extra/{OUTPUTS}"
        raw = ar.member(name) if name in ar.names else None
    except (Damaged, Unhandled) as e:  # a cut or edited member: the file is damaged
        raise GraphoptError(f"{path} is a damaged graphopt archive: {e}", RESAVE) from None
    if raw is None:
        return None
    data = _json({OUTPUTS: raw.decode("utf-8", "replace")}, OUTPUTS, path)
    ops = data.get("library_ops") or {}
    if not isinstance(ops, dict):
        raise GraphoptError(f"{path}: graphopt's record {OUTPUTS} lists its ops as "
                            f"{str(ops)[:40]}", RESAVE)
    for op, module in ops.items():
        if _registered(str(op)):
            continue
        where = f"import {module}" if isinstance(module, str) else \
            f"import the module that registers the '{str(op).split('::')[0]}' ops"
        raise GraphoptError(f"{path} calls the op {str(op)[:120]}, a model library's op that "
                            "this process has not registered (the file holds no code, and "
                            "graphopt.load never imports a module a file names)",
                            f"{where[:160]} before graphopt.load")
    return data


def _registered(op: str) -> bool:
    """Whether this process has the op ``ns::name[.overload]`` (nothing is imported)."""
    ns, _, rest = op.partition("::")
    name, _, overload = rest.partition(".")
    try:
        packet = getattr(getattr(torch.ops, ns), name)
        return isinstance(getattr(packet, overload or "default"), torch._ops.OpOverload)
    except (AttributeError, RuntimeError):
        return False


def _restructure(gm: torch.fx.GraphModule, record: Any) -> None:
    """The model's own output structure on ``gm``, whose program returns its leaves flat
    (:func:`.saved_format.structure_spec`: the user's class if registered here, else a dict)."""
    from torch.fx.graph import _PyTreeCodeGen, _PyTreeInfo

    spec = structure_spec(record)
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    flat = out.args[0] if isinstance(out.args[0], (tuple, list)) else (out.args[0],)
    if spec.num_leaves != len(flat) or any(isinstance(a, (tuple, list, dict)) for a in flat):
        raise ValueError(f"output structure of {spec.num_leaves} leaves for {len(flat)} "
                         "outputs")
    out.args = (list(flat),)
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    in_spec = pytree.tree_structure((tuple(range(len(names))), {}))
    gm.graph._codegen = _PyTreeCodeGen(_PyTreeInfo(names, in_spec, spec))


def _check_device(device: Any) -> None:
    try:
        torch.empty(0, device=torch.device(device))
    except (RuntimeError, AssertionError, TypeError, ValueError) as e:  # no such device here
        raise GraphoptError(f"cannot move the saved model to {device!r}: {first_line(e)}",
                            "give a device this machine has (torch.cuda.is_available()), or "
                            "device=None") from None


def _pack_low_bit(gm: torch.fx.GraphModule, file: Path) -> None:
    """Every low-bit op's stored tensors checked as its kernel reads them (a damaged file is
    refused here, naming the tensor, never on the first call), then INT8 packed once for the
    CPU's kernel and INT4 in the layout of the device its weights are on."""
    check_graph(gm, f"{file} is a damaged graphopt archive", RESAVE)
    try:
        repack_int8(gm)
        int4_from_saved(gm)
    except GraphoptError:
        raise
    except (RuntimeError, TypeError, ValueError, IndexError) as e:
        raise GraphoptError(f"{file}: a low-bit weight does not pack ({first_line(e)})",
                            RESAVE) from None


def load(path: str | os.PathLike[str], device: str | torch.device | None = None
         ) -> torch.nn.Module:
    """The module :meth:`Optimized.save` wrote, on ``device`` (default: where it was saved).

    It accepts the same shape range (a GraphoptError outside it), sets the same CUDA flags per
    call, and carries ``plan`` (the report as a dict), ``runtime_settings`` (for
    ``apply_runtime_settings``) and ``shape_range``. Only graphopt's own reader reads the file
    (nothing is unpickled); what it cannot read is a GraphoptError that says what.
    """
    file = Path(path)
    if device is not None:
        _check_device(device)
    archive = _check_archive(file)
    outputs = _outputs(archive, file)
    extra: dict[str, Any] = {PLAN: "", RUNTIME: "", INPUTS: ""}
    gm = pt2_reader.build(file, archive, extra, device, compile=False)  # strip_unused compiles
    inputs, runtime = _json(extra, INPUTS, file), _json(extra, RUNTIME, file)
    plan = _json(extra, PLAN, file)
    try:
        names, shapes, shape_range = _inputs(inputs)
        settings, flags = _settings(runtime["settings"]), dict(runtime["flags"])
        if not all(isinstance(k, str) and isinstance(v, bool) for k, v in flags.items()):
            raise TypeError(f"runtime flags {str(flags)[:60]}")
        if outputs is not None and outputs.get("flat") is True:  # else the archive's own
            _restructure(gm, outputs.get("structure"))
    except (KeyError, TypeError, ValueError, AttributeError, GraphoptError) as e:
        raise GraphoptError(f"{file}: graphopt's records are damaged ({first_line(e)})",
                            RESAVE) from None
    if any(n.target is INT4_LINEAR for n in gm.graph.nodes):
        raise GraphoptError(f"{file} holds an INT4 weight packed in one device's layout; "
                            "Optimized.save writes the portable form (int4_linear_saved)",
                            RESAVE)
    _pack_low_bit(gm, file)
    try:
        strip_unused(gm)  # export's guard (the wrapper checks the range), plain calls, portable
        module = OptimizedModule(gm, shapes, flags, shape_range=shape_range, input_names=names)
    except (RuntimeError, TypeError, ValueError, KeyError, IndexError, AttributeError,
            SyntaxError) as e:
        raise GraphoptError(f"{file}: the saved graph does not build with this process's "
                            f"torch {torch.__version__} ({first_line(e)})",
                            "load it where the torch version that saved it is installed, or "
                            + RESAVE) from None
    module.plan = plan
    module.runtime_settings = settings
    logger.info("loaded %s (%d graph nodes)", file, len(gm.graph.nodes))
    return module
