"""Save an optimized torch module as one ``.pt2`` file, and load it where the model never was.

The file is torch.export's own archive (``torch.export.save``): the optimized graph re-exported
over its shape range (one ``torch.export.Dim`` per dynamic dim, shared by every axis it sizes),
its weights, and graphopt's records as JSON extra files (no pickled Python objects):

- ``graphopt_format.json``: the marker (``format``, ``version``) and the graphopt/torch versions;
- ``graphopt_plan.json``: the plan report (``Plan.to_json``);
- ``graphopt_runtime.json``: the runtime settings and the CUDA flags the module sets per call;
- ``graphopt_inputs.json``: input names and shapes, and the shape range (``ShapeRange.to_dict``).

One op of the optimized graph cannot be serialized by torch.export: the INT8 pass's
``quantized::linear_dynamic`` reads a packed-weight torchbind object. Saving writes it as
``graphopt::int8_linear(x, int8 weight, per-channel scale, zero point, bias)``, plain tensors
the archive stores, and :func:`load` packs those once and puts ``linear_dynamic`` back: the
same kernel, the same numbers. :func:`load` reads the archive with graphopt's own reader
(:mod:`graphopt.pt2_reader`) and nothing else: it never unpickles, so a file that reader cannot
read (another writer's, a crafted one) is a GraphoptError, never handed to ``torch.export.load``.
"""

from __future__ import annotations

import copy
import inspect
import json
import logging
import os
import warnings
from operator import attrgetter
from pathlib import Path
from typing import Any

import torch
from torch import fx

from graphopt._io import OutputSet
from graphopt._version import __version__
from graphopt.errors import GraphoptError, first_line

__all__ = ["FORMAT", "load", "save", "stage"]

logger = logging.getLogger(__name__)

#: the marker a graphopt archive carries; ``version`` rises when the layout changes
FORMAT, VERSION = "graphopt.optimized", 1
_MARKER, _PLAN, _RUNTIME, _INPUTS = ("graphopt_format.json", "graphopt_plan.json",
                                     "graphopt_runtime.json", "graphopt_inputs.json")
_LINEAR_DYNAMIC = torch.ops.quantized.linear_dynamic.default
_RESAVE = "save it again with Optimized.save (graphopt.optimize(...).save(path))"


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


def _unpack_int8(gm: fx.GraphModule) -> int:
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


def _repack_int8(gm: fx.GraphModule) -> int:
    """The inverse of :func:`_unpack_int8` on a loaded graph: pack once, call the kernel."""
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


def _flatten_attrs(gm: fx.GraphModule) -> None:
    """Move every weight the graph reads to a top-level name (``lins.7.weight`` ->
    ``_saved_w28``): ``ExportedProgram.module()`` assigns a nested name by scanning its parent's
    children, which is quadratic in a ``ModuleList`` of 1,000 layers (8 s of a 6k-node load)."""
    names: dict[int, str] = {}
    for node in gm.graph.nodes:
        if node.op != "get_attr" or "." not in str(node.target):
            continue
        value = attrgetter(str(node.target))(gm)
        if not isinstance(value, torch.Tensor):
            continue
        if id(value) not in names:  # a tied weight keeps one name
            name = f"_saved_w{len(names)}"
            while hasattr(gm, name):
                name += "_"
            names[id(value)] = name
            if isinstance(value, torch.nn.Parameter):
                gm.register_parameter(name, value)
            else:
                gm.register_buffer(name, value)
        node.target = names[id(value)]
    if names:
        gm.delete_all_unused_submodules()
        gm.recompile()


# --- saving ------------------------------------------------------------------------------------
def _dynamic_shapes(shape_range: Any, names: list[str], args: tuple[Any, ...]) -> Any:
    """torch.export's ``dynamic_shapes`` for ``args``: one Dim per dim name, shared by every
    axis it sizes; an axis sized by an expression (``2*seq``) is left to export (``AUTO``)."""
    if not shape_range:
        return None
    dims: dict[str, Any] = {}
    for d in shape_range.dims:
        top = {} if d.max is None else {"max": d.max}
        ident = d.name if d.name.isidentifier() else f"d_{len(dims)}"
        dims[d.name] = torch.export.Dim(ident, min=d.min, **top)
    spec = []
    for i, a in enumerate(args):
        want = shape_range.inputs.get(names[i]) if i < len(names) else None
        if not isinstance(a, torch.Tensor) or want is None:
            spec.append(None)
            continue
        axes = {ax: dims.get(w, torch.export.Dim.AUTO) for ax, w in enumerate(want)
                if not isinstance(w, int)}
        spec.append(axes or None)
    return tuple(spec)


def _exported(opt: Any) -> torch.export.ExportedProgram:
    from graphopt.rewrites.optimized_module import OptimizedModule

    module = opt.module
    graph = module.graph_module if isinstance(module, OptimizedModule) else module
    gm = copy.deepcopy(graph)
    if isinstance(gm, fx.GraphModule):
        _unpack_int8(gm)
        _flatten_attrs(gm)
    args = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in opt.example_inputs)
    names = _input_names(opt)
    passes = ", ".join(opt.info.get("passes_applied") or []) or "none"
    try:
        ep = torch.export.export(gm, args,
                                 dynamic_shapes=_dynamic_shapes(opt.shape_range, names, args))
    except Exception as e:
        raise GraphoptError(f"torch.export cannot re-export the optimized graph (passes "
                            f"applied: {passes}): {first_line(e)}",
                            "optimize again with the pass that added the failing op turned "
                            "off (e.g. quantize='none', precision='fp32'), then save") from e
    _check_structure(ep.call_spec.in_spec, ep.call_spec.out_spec)
    return ep


def _check_structure(in_spec: Any, out_spec: Any) -> None:
    """What :func:`load` rebuilds, refused here rather than in a file it cannot read: flat
    positional inputs, and outputs in plain tuples, lists and dicts (it imports no class)."""
    def plain(spec: Any) -> bool:
        return spec.is_leaf() or (spec.type in (tuple, list, dict) and
                                  all(plain(c) for c in spec.children()))

    args, kwargs = in_spec.children() if in_spec.num_children == 2 else (None, None)
    if args is None or args.type is not tuple or kwargs.num_children or \
            not all(c.is_leaf() for c in args.children()):
        raise GraphoptError("save writes a model that takes its inputs as positional tensors; "
                            "this one takes nested containers or keywords",
                            "wrap the model so forward takes each tensor as an argument")
    if not plain(out_spec):
        odd = out_spec
        while odd.type in (tuple, list, dict):
            odd = next(c for c in odd.children() if not plain(c))
        raise GraphoptError("the model returns a container other than a tuple, list or dict "
                            f"(a {getattr(odd.type, '__name__', odd.type)}): graphopt.load "
                            "rebuilds only those, and never imports a class a file names",
                            "return a tuple, list or dict of tensors from forward, then "
                            "optimize and save again")


def _input_names(opt: Any) -> list[str]:
    """The model's own input names (the shape range is keyed by them), also for the plain
    copy of the model optimize returns when nothing pays."""
    names = list(getattr(opt, "input_names", None) or
                 getattr(opt.module, "_input_names", None) or [])
    return names or [f"input_{i}" for i in range(len(opt.example_inputs))]


def _records(opt: Any) -> dict[str, str]:
    module = opt.module
    shapes = [list(a.shape) if isinstance(a, torch.Tensor) else None
              for a in opt.example_inputs]
    inputs = {"names": _input_names(opt), "shapes": shapes,
              "shape_range": opt.shape_range.to_dict() if opt.shape_range else None}
    runtime = {"settings": opt.runtime_settings.to_dict(),
               "flags": dict(getattr(module, "_runtime", None) or {})}
    marker = {"format": FORMAT, "version": VERSION, "graphopt": __version__,
              "torch": torch.__version__}
    return {_MARKER: json.dumps(marker), _PLAN: opt.plan.to_json(),
            _RUNTIME: json.dumps(runtime), _INPUTS: json.dumps(inputs)}


def _model_source(opt: Any) -> list[Path]:
    """The Python file the model's class was defined in: a save must never overwrite it."""
    source = getattr(opt, "_source", None)
    if not isinstance(source, tuple):
        return []
    cls = type(source[0])
    try:
        found = inspect.getsourcefile(cls)
    except (TypeError, OSError):  # a class whose module is not in sys.modules: its code knows
        code = getattr(getattr(cls, "forward", None), "__code__", None)
        found = code.co_filename if code is not None else None
    return [Path(found)] if found and Path(found).is_file() else []


def stage(opt: Any, outputs: OutputSet, path: str | os.PathLike[str]) -> Path:
    """Export ``opt`` and stage it in ``outputs`` (written on ``outputs.commit()``)."""
    if opt.module is None:
        raise GraphoptError("save writes an optimized torch module; this result came from an "
                            "ONNX model", "write it with export_onnx(path) instead")
    target = outputs.claim(path, "saved model") if not outputs.claimed(path) else Path(path)
    ep = _exported(opt)
    extra = _records(opt)

    def write(tmp: Path) -> None:
        try:  # a file object: given the temp path, torch warns it does not end in .pt2
            with open(tmp, "wb") as f, warnings.catch_warnings():
                # weights that are views of one storage (a padded weight's slice): torch
                # saves each whole and says so; that is fine on the CPU it saves from
                warnings.filterwarnings("ignore", "No complete tensor found")
                torch.export.save(ep, f, extra_files=extra)
        except OSError:
            raise  # disk full, permissions: OutputSet names the path and cleans up
        except Exception as e:
            raise GraphoptError(f"torch.export.save cannot serialize the optimized graph: "
                                f"{first_line(e)}", "optimize again with quantize='none' "
                                "and precision='fp32', then save") from e
    return outputs.write_with(target, write, "saved model")


def save(opt: Any, path: str | os.PathLike[str],
         protect: list[Path] | tuple[Path, ...] = ()) -> Path:
    """Write ``opt`` to ``path`` whole or not at all, never over ``protect`` or the model's
    own source file."""
    outputs = OutputSet([*protect, *_model_source(opt)])
    outputs.claim(path, "saved model")  # a bad path fails before the export's work
    stage(opt, outputs, path)
    return outputs.commit()[0]


# --- loading -----------------------------------------------------------------------------------
def load(path: str | os.PathLike[str], device: str | torch.device | None = None
         ) -> torch.nn.Module:
    """The module :meth:`Optimized.save` wrote, on ``device`` (default: where it was saved).

    It accepts the same shape range (a GraphoptError outside it), sets the same CUDA flags per
    call, and carries ``plan`` (the report as a dict), ``runtime_settings`` (for
    ``apply_runtime_settings``) and ``shape_range``. Only graphopt's own reader reads the file
    (nothing is unpickled); what it cannot read is a GraphoptError that says what
    (:mod:`graphopt._export_load`).
    """
    from graphopt._export_load import load_saved

    return load_saved(path, device)
