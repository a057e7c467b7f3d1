"""Save an optimized torch module as one ``.pt2`` file that loads where the model never was.

The file is torch.export's own archive (``torch.export.save``): the optimized graph re-exported
over its shape range (one ``torch.export.Dim`` per dynamic dim, shared by every axis it sizes),
its weights, and graphopt's records as JSON extra files (no pickled Python objects):

- ``graphopt_format.json``: the marker (``format``, ``version``) and the graphopt/torch versions;
- ``graphopt_plan.json``: the plan report (``Plan.to_json``);
- ``graphopt_runtime.json``: the runtime settings and the CUDA flags the module sets per call;
- ``graphopt_inputs.json``: input names and shapes, and the shape range (``ShapeRange.to_dict``).
- ``graphopt_outputs.json``: the output structure with its field names (a ModelOutput's program
  returns its leaves flat; ``load`` rebuilds the class if registered there, else a dict), and the
  model-library ops left in the graph with the module that registers each (:func:`_library_ops`).

The INT8 linear's saved form and the record names are in :mod:`.saved_format`; :mod:`.load`
reads the file back with graphopt's own reader (:mod:`.pt2_reader`) and nothing else: it never
unpickles, so a file that reader cannot read (another writer's, a crafted one) is a
GraphoptError, never handed to ``torch.export.load``.
"""

from __future__ import annotations

import inspect
import json
import logging
import operator
import os
import warnings
from operator import attrgetter
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import fx

from graphopt._version import __version__
from graphopt.backends.torch.optimized_module import OptimizedModule
from graphopt.backends.torch.quant_ops import int4_to_saved
from graphopt.backends.torch.saved_format import (
    FORMAT,
    INPUTS,
    MARKER,
    OUTPUTS,
    PLAN,
    RUNTIME,
    VERSION,
    structure_record,
    unpack_int8,
)
from graphopt.errors import GraphoptError, first_line
from graphopt.files.outputs import OutputSet
from graphopt.frontends.user_state import private_copy
from graphopt.ir.shape_range import dim_expression

__all__ = ["save", "stage"]

logger = logging.getLogger(__name__)

_GRAD_WRAP = torch.ops.higher_order.wrap_with_set_grad_enabled
# op namespaces every process with torch and graphopt has (graphopt's own ops register on import)
_OWN = frozenset({"aten", "prims", "graphopt", "quantized", "_quantized", "higher_order"})


def _inline_grad_wraps(gm: fx.GraphModule) -> int:
    """A ``torch.no_grad()`` block's body inline (Llama's rotary embedding is one): the module
    runs without autograd, so its wrapper (``wrap_with_set_grad_enabled``) is a no-op, and
    :mod:`.load`'s reader builds one flat graph of ops. Returns how many were inlined."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not _GRAD_WRAP or not all(
                u.target is operator.getitem for u in node.users):
            continue
        sub = attrgetter(str(node.args[1].target))(gm)
        env: dict[fx.Node, Any] = dict(zip(
            [p for p in sub.graph.nodes if p.op == "placeholder"], node.args[2:], strict=True))
        outs: Any = ()
        with gm.graph.inserting_before(node):
            for s in sub.graph.nodes:
                if s.op == "output":
                    outs = fx.node.map_arg(s.args[0], env.__getitem__)
                elif s.op == "get_attr":
                    name = f"_inlined_{count}_{str(s.target).replace('.', '_')}"
                    setattr(gm, name, attrgetter(str(s.target))(sub))
                    env[s] = gm.graph.get_attr(name)
                elif s.op != "placeholder":
                    env[s] = gm.graph.node_copy(s, env.__getitem__)
        for user in list(node.users):
            user.replace_all_uses_with(outs[user.args[1]])
            gm.graph.erase_node(user)
        gm.graph.erase_node(node)
        count += 1
    if count:
        gm.graph.eliminate_dead_code()
        gm.delete_all_unused_submodules()
        gm.recompile()
        count += _inline_grad_wraps(gm)  # a block nested in one
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
    axis it sizes; an axis sized by an expression is that derived Dim (``2*seq``, ``t + 1``),
    or left to export (``AUTO``) where torch cannot derive it."""
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
        axes = {ax: dim_expression(str(w), dims) or torch.export.Dim.AUTO
                for ax, w in enumerate(want) if not isinstance(w, int)}
        spec.append(axes or None)
    return tuple(spec)


def _exported(opt: Any) -> tuple[torch.export.ExportedProgram, Any]:
    module = opt.module
    graph = module.graph_module if isinstance(module, OptimizedModule) else module
    gm = private_copy(graph)
    if isinstance(gm, fx.GraphModule):
        unpack_int8(gm)
        _inline_grad_wraps(gm)
        int4_to_saved(gm)  # a CPU pack is this CPU's ISA's layout: save the nibbles
        _flatten_attrs(gm)
    args = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in opt.example_inputs)
    names = _input_names(opt)
    passes = ", ".join(opt.info.passes_applied) or "none"
    shapes = _dynamic_shapes(opt.shape_range, names, args)
    try:
        ep = torch.export.export(gm, args, dynamic_shapes=shapes)
        if not isinstance(gm, fx.GraphModule) and any(
                n.target is _GRAD_WRAP for n in ep.graph_module.graph.nodes):
            flat = ep.module()  # the plain model's no_grad blocks, inlined as an optimized
            _inline_grad_wraps(flat)  # graph's are: the reader builds one flat graph
            ep = torch.export.export(flat, args, dynamic_shapes=shapes)
    except Exception as e:
        raise GraphoptError(f"torch.export cannot re-export the optimized graph (passes "
                            f"applied: {passes}): {first_line(e)}",
                            "optimize again with the pass that added the failing op turned "
                            "off (e.g. quantize='none', precision='fp32'), then save") from e
    _check_structure(ep.call_spec.in_spec, ep.call_spec.out_spec)
    ep, ops = _library_ops(ep)
    return ep, {**_flat_outputs(ep), "library_ops": ops}


def _check_structure(in_spec: Any, out_spec: Any) -> None:
    """What :func:`load` rebuilds, refused here rather than in a file it cannot read: flat
    positional inputs. Any output structure is kept (:func:`_flat_outputs`)."""
    args, kwargs = in_spec.children() if in_spec.num_children == 2 else (None, None)
    if args is None or args.type is not tuple or kwargs.num_children or \
            not all(c.is_leaf() for c in args.children()):
        raise GraphoptError("save writes a model that takes its inputs as positional tensors; "
                            "this one takes nested containers or keywords",
                            "wrap the model so forward takes each tensor as an argument")


def _foreign(ep: torch.export.ExportedProgram) -> dict[str, Any]:
    """The ops of a model library (``transformers::grouped_mm_fallback``) in the program, by
    qualified name: a loading process has them only if it imported their module."""
    return {n.target.name(): n.target for n in ep.graph.nodes if n.op == "call_function" and
            isinstance(n.target, torch._ops.OpOverload) and n.target.namespace not in _OWN}


def _registrar(op: Any) -> str | None:
    """The Python module that registers ``op`` (its ``custom_op`` function's), if known."""
    from torch._library.custom_ops import OPDEFS

    fns = [getattr(OPDEFS.get(op.name()), "_init_fn", None), *op.py_kernels.values()]
    return next((f.__module__ for f in fns if isinstance(getattr(f, "__module__", None), str)
                 and not f.__module__.startswith("torch.")), None)


def _library_ops(ep: torch.export.ExportedProgram
                 ) -> tuple[torch.export.ExportedProgram, dict[str, str | None]]:
    """Each model-library op decomposed to aten where its Python implementation traces (1);
    the ones that do not (2: a data-dependent loop, numpy) stay, with a warning that names the
    module registering them, which the loading process must import (recorded for ``load``)."""
    from torch._library.custom_ops import OPDEFS

    ops = _foreign(ep)
    table = {op: OPDEFS[name]._init_fn for name, op in ops.items()
             if getattr(OPDEFS.get(name), "_init_fn", None) is not None}
    for op, fn in table.items():  # one at a time: an op that does not trace keeps the rest
        try:
            ep = ep.run_decompositions({op: fn})
            logger.debug("decomposed %s to aten for save", op.name())
        except Exception as e:  # noqa: BLE001 - case 2: whatever tracing its code raised
            logger.debug("%s does not decompose: %s", op.name(), first_line(e))
    left = {name: _registrar(op) for name, op in _foreign(ep).items()}
    for name, module in left.items():
        where = f"module {module}" if module else \
            f"module that registers the '{name.split('::')[0]}' ops"
        warnings.warn(f"the saved graph calls {name}, a model library's op whose Python code "
                      f"does not trace to aten ops; a process that loads the file must import "
                      f"the {where} first", UserWarning, stacklevel=4)
    return ep, left


def _flat_outputs(ep: torch.export.ExportedProgram) -> dict[str, Any]:
    """The program's output structure as graphopt's JSON record (:data:`OUTPUTS`). Outputs in
    containers other than tuple, list and dict (a ModelOutput) are made one flat tuple
    (``flat``): torch's own record of such a class needs it registered to load, graphopt's
    needs nothing. Plain containers stay in the program, as before."""
    spec = ep.call_spec.out_spec

    def plain(s: Any) -> bool:
        return s.is_leaf() or (s.type in (tuple, list, dict) and
                               all(plain(c) for c in s.children()))

    if plain(spec):
        return {"flat": False, "structure": structure_record(spec)}
    flat = pytree.tree_structure(tuple(range(spec.num_leaves)))
    for entry in ep.module_call_graph:
        if entry.fqn == "" and entry.signature is not None:
            entry.signature.out_spec = flat
    return {"flat": True, "structure": structure_record(spec)}


def _input_names(opt: Any) -> list[str]:
    """The model's own input names (the shape range is keyed by them), also for the plain
    copy of the model optimize returns when nothing pays."""
    names = list(getattr(opt, "input_names", None) or
                 getattr(opt.module, "_input_names", None) or [])
    return names or [f"input_{i}" for i in range(len(opt.example_inputs))]


def _records(opt: Any, outputs: Any) -> dict[str, str]:
    module = opt.module
    shapes = [list(a.shape) if isinstance(a, torch.Tensor) else None
              for a in opt.example_inputs]
    inputs = {"names": _input_names(opt), "shapes": shapes,
              "shape_range": opt.shape_range.to_dict() if opt.shape_range else None}
    runtime = {"settings": opt.runtime_settings.to_json(),
               "flags": dict(getattr(module, "_runtime", None) or {})}
    marker = {"format": FORMAT, "version": VERSION, "graphopt": __version__,
              "torch": torch.__version__}
    return {MARKER: json.dumps(marker), PLAN: opt.plan.to_json(),
            RUNTIME: json.dumps(runtime), INPUTS: json.dumps(inputs),
            OUTPUTS: json.dumps(outputs)}


def _model_source(opt: Any) -> list[Path]:
    """The Python file the model's class was defined in: a save must never overwrite it."""
    model = getattr(opt, "source_model", None)
    if model is None:
        return []
    cls = type(model)
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
    target = outputs.hold(path, "saved model")  # a report claimed on this path is refused
    ep, structure = _exported(opt)
    extra = _records(opt, structure)

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
    with OutputSet([*protect, *_model_source(opt)]) as outputs:
        outputs.claim(path, "saved model")  # a bad path fails before the export's work
        stage(opt, outputs, path)
        return outputs.commit()[0]
