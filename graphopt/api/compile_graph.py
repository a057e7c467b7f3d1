"""A graph dynamo captured, as a module graphopt can optimize, and back.

Dynamo hands a backend an ``fx.GraphModule`` whose placeholders are the frame's inputs *and*
the model's weights (inlined ``nn.Module`` state: parameters, buffers, scalar attributes), plus,
for a symbolic graph, the sizes it uses as ``SymInt`` inputs. graphopt's decisions need the
weights as constants (BatchNorm folds into the conv weight, a Linear's weight is quantized
once), so :class:`FrozenGraph` binds them: it takes only the frame's tensors, derives each size
input from the tensor dim it names, and calls dynamo's graph. graphopt optimizes that module;
:func:`dynamo_callable` wraps the result in a graph with dynamo's own placeholders again, so
Inductor (or eager) gets the calling convention dynamo expects. Weights are frozen at compile
time, as Inductor's ``freezing`` does: replacing them later needs ``torch._dynamo.reset()``.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from torch._dynamo.source import is_from_unspecialized_nn_module_source
from torch.fx.operator_schemas import normalize_function

__all__ = ["FrozenGraph", "GraphInputs", "cannot_optimize", "dynamo_callable", "graph_inputs"]

#: ops that return a view of their first argument: an in-place op on one writes the input
_VIEWS = {"view", "reshape", "transpose", "permute", "narrow", "select", "unsqueeze", "squeeze",
          "expand", "t", "as_strided", "flatten", "unflatten", "view_as", "contiguous",
          "detach", "__getitem__", "getitem", "split", "chunk", "unbind"}


@dataclass(frozen=True)
class GraphInputs:
    """Dynamo's placeholders sorted: each is a frame input (``"input"``, its position among
    them), a frozen weight (``"state"``) or a size (``"size"``: input position and dim)."""

    kinds: tuple[tuple[str, Any], ...]
    #: the frame inputs' positions in dynamo's argument list
    inputs: tuple[int, ...]
    #: per frame input, the dims dynamo keeps symbolic
    symbolic: tuple[tuple[int, ...], ...]

    @property
    def dynamic(self) -> tuple[str, ...]:
        return tuple(f"input{i}[{d}]" for i, dims in enumerate(self.symbolic) for d in dims)


def _symbol(value: Any) -> str | None:
    """A symbolic size's expression; None for an int, or a SymInt dynamo pinned to one
    (``dynamic=True`` marks every dim, then a Linear's weight fixes the feature dim)."""
    if not isinstance(value, torch.SymInt) or value.node.maybe_as_int() is not None:
        return None
    return str(value.node.expr)


def graph_inputs(gm: fx.GraphModule) -> GraphInputs | str:
    """The placeholders sorted (:class:`GraphInputs`), or why graphopt cannot take them."""
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    kinds: list[tuple[str, Any]] = []
    inputs: list[int] = []
    sizes: list[tuple[int, fx.Node]] = []
    for i, node in enumerate(phs):
        value, arg = node.meta.get("example_value"), node.meta.get("grapharg")
        source = getattr(arg, "source", None)
        if isinstance(value, torch.Tensor) and (
                isinstance(value, torch.nn.Parameter)
                or (source is not None and is_from_unspecialized_nn_module_source(source))):
            kinds.append(("state", None))
        elif isinstance(value, torch.Tensor):
            kinds.append(("input", len(inputs)))
            inputs.append(i)
        elif isinstance(value, torch.SymInt):
            kinds.append(("size", None))
            sizes.append((i, node))
        else:
            return (f"input {node.name} is a {type(value).__name__}: graphopt optimizes graphs "
                    "of tensors and the sizes they carry")
    tensors = [phs[i].meta["example_value"] for i in inputs]
    symbolic = tuple(tuple(d for d, s in enumerate(t.shape) if _symbol(s) is not None)
                     for t in tensors)
    for i, node in sizes:
        want = _symbol(node.meta["example_value"])
        where = next(((k, d) for k, t in enumerate(tensors) for d, s in enumerate(t.shape)
                      if _symbol(s) == want), None)
        if where is None:
            return (f"the symbolic int {node.name} ({want}) is no input tensor's dim: graphopt "
                    "cannot derive it")
        kinds[i] = ("size", where)
    return GraphInputs(tuple(kinds), tuple(inputs), symbolic)


class FrozenGraph(torch.nn.Module):
    """Dynamo's graph taking only the frame's tensors: weights bound as buffers, sizes read
    from the tensors (module doc)."""

    def __init__(self, gm: fx.GraphModule, sorted_inputs: GraphInputs,
                 example_inputs: Sequence[Any]) -> None:
        super().__init__()
        self.graph = gm
        self._kinds = sorted_inputs.kinds
        for i, (kind, _) in enumerate(self._kinds):
            if kind == "state":  # a detached alias: optimize copies before it rewrites
                self.register_buffer(f"state{i}", example_inputs[i].detach())
        self.eval()

    def forward(self, *args: torch.Tensor) -> Any:
        full = [getattr(self, f"state{i}") if kind == "state" else
                args[where] if kind == "input" else args[where[0]].size(where[1])
                for i, (kind, where) in enumerate(self._kinds)]
        return self.graph(*full)


def dynamic_spec(sorted_inputs: GraphInputs) -> Any:
    """torch.export's ``dynamic_shapes`` for :class:`FrozenGraph` (``forward(*args)``: one
    entry, a tuple of per-input specs), keeping dynamo's symbolic dims symbolic; None when
    static. ``Dim.DYNAMIC``: an export that would specialize a dim fails, and the graph goes
    to Inductor as dynamo gave it, instead of baking one size into a symbolic graph."""
    if not any(sorted_inputs.symbolic):
        return None
    dim = torch.export.Dim.DYNAMIC
    return (tuple({d: dim for d in dims} or None for dims in sorted_inputs.symbolic),)


def _training_call(node: fx.Node) -> bool:
    """A dropout or batch norm called with ``training=True`` (a model in training mode)."""
    if node.op != "call_function" or not callable(node.target):
        return False
    try:
        normalized = normalize_function(node.target, tuple(node.args), dict(node.kwargs),
                                        normalize_to_only_use_kwargs=True)
    except Exception:  # noqa: BLE001 - a target torch has no signature for: not one of those
        return False
    return normalized is not None and normalized.kwargs.get("training") is True


def _writes_input(node: fx.Node) -> bool:
    """An in-place op (``add_``, ``copy_``, ``out=``) on a placeholder or a view of one: the
    write must reach the caller's tensor, which graphopt's private copies would drop."""
    name = getattr(node.target, "__name__", str(node.target))
    if node.op not in ("call_function", "call_method"):
        return False
    if not (name.endswith("_") and not name.endswith("__")) and "out" not in node.kwargs:
        return False
    root = node.args[0] if node.args else node.kwargs.get("out")
    while isinstance(root, fx.Node) and root.op != "placeholder":
        target = getattr(root.target, "__name__", str(root.target))
        if target not in _VIEWS or not root.args:
            return False
        root = root.args[0]
    return isinstance(root, fx.Node)


def cannot_optimize(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> str | None:
    """Why graphopt leaves this graph to Inductor as it is, or None: graphopt compiles
    inference graphs (no autograd, no training-mode ops) that return tensors and write none of
    their inputs."""
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                       for t in example_inputs):
        return ("autograd is on and the graph's tensors require grad: graphopt compiles "
                "inference graphs; call the model under torch.no_grad() or "
                "torch.inference_mode()")
    nodes = list(gm.graph.nodes)
    if any(_training_call(n) for n in nodes):
        return "the graph runs dropout or batch norm in training mode: call model.eval() first"
    if any(_writes_input(n) for n in nodes):
        return "the graph writes one of its inputs in place"
    outputs = gm.graph.output_node().args[0]
    outs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    if not all(isinstance(o, fx.Node) and isinstance(o.meta.get("example_value"), torch.Tensor)
               for o in outs):
        return "the graph returns values other than tensors"
    return None


def dynamo_callable(gm: fx.GraphModule, optimized: torch.nn.Module,
                    sorted_inputs: GraphInputs) -> fx.GraphModule:
    """An ``fx.GraphModule`` with ``gm``'s placeholders (names and metadata: Inductor reads
    their fake values) that calls graphopt's ``optimized`` module on the frame's tensors and
    returns its outputs as ``gm`` does: the module dynamo's guards call, directly or compiled
    by Inductor."""
    graph = fx.Graph()
    phs = []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            ph = graph.placeholder(node.name, type_expr=node.type)
            ph.meta = dict(node.meta)
            phs.append(ph)
    root = torch.nn.Module()
    root.graphopt = optimized
    call = graph.call_module("graphopt", tuple(phs[i] for i in sorted_inputs.inputs))
    returned = gm.graph.output_node().args[0]
    many = isinstance(returned, (tuple, list))
    graph.output(tuple(graph.call_function(operator.getitem, (call, i))
                       for i in range(len(returned))) if many else call)
    out = fx.GraphModule(root, graph, class_name="GraphoptGraph")
    out.meta.update(gm.meta)
    return out
