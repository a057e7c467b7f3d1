"""Measure a torch model per plan node: torch.profiler over an fx Interpreter that names nodes.

Why an Interpreter: the plan's node names are torch.export's fx node names
(``frontends.fx_convert``). Running the traced graph node by node, each under
``record_function("graphopt::node::<name>")``, puts every ATen op a node dispatches inside a
range that carries the plan's name, so nothing has to match op names or call order. A node's
time is the sum of the inclusive CPU times of the ops directly under its range: the
Interpreter's own Python work around them is not counted.

The whole model is timed apart, without the profiler and the Interpreter, the best of ``runs``
runs (on a machine shared with other jobs the slow runs are the neighbours' time; a node's
median over the profiled runs already discounts them): the planned graph as graphopt emits
it (what the plan's estimate describes), and the module as the user calls it (which adds the
Python around the graph). Both run on private copies: of the inputs, and of every tensor the
model reaches but its parameters (:mod:`graphopt.frontends.user_state`), so profiling a model
that writes a cache leaves the user's cache as it was.

On a GPU the same ranges are used with the profiler's CUDA activity as well: a node's time is
then the device time of the kernels its ops launched (``device_time_total``, which counts the
kernels of nested ops too), and the whole model is timed between two synchronizations.
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import torch
from torch import fx
from torch.fx._pytree import tree_flatten_spec
from torch.profiler import ProfilerActivity, record_function
from torch.utils import _pytree as pytree

from graphopt.backends.torch.pipeline import strip_unused
from graphopt.errors import GraphoptError, first_line
from graphopt.files.quiet import library_quiet
from graphopt.frontends.fx_convert import computes_nothing
from graphopt.frontends.user_state import clone_inputs, private_copy, user_state_guard
from graphopt.ir.graph import Graph
from graphopt.measure.stats import Measured

__all__ = ["NODE_RANGE", "intra_op_threads", "measure_torch", "node_times", "per_node"]

logger = logging.getLogger(__name__)

#: prefix of the profiler range around each measured node (``calibrate`` uses it too)
NODE_RANGE = "graphopt::node::"
_CALLS = ("call_function", "call_method", "call_module")


class _Named(fx.Interpreter):
    """Runs each call node inside a profiler range named after it."""

    def run_node(self, n: fx.Node) -> Any:
        if n.op not in _CALLS:
            return super().run_node(n)
        with record_function(NODE_RANGE + n.name):
            return super().run_node(n)


def _runnable(graph: Graph, model: torch.nn.Module, args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> tuple[fx.GraphModule, list[Any]]:
    """The traced graph as a module the Interpreter can run, and its flat inputs."""
    src = graph.source_model
    if isinstance(src, torch.export.ExportedProgram):
        gm = src.module()  # parameters become attributes; call nodes keep their names
        flat = list(tree_flatten_spec((args, kwargs), gm.graph._codegen.pytree_info.in_spec))
    elif isinstance(src, fx.GraphModule):  # the make_fx fallback: (state, inputs) placeholders
        gm = src
        state = [p.detach() for p in model.parameters()]
        state += [b.detach().clone() for b in model.buffers()]
        leaves = [x.detach().clone() for x in pytree.tree_leaves((args, kwargs))
                  if isinstance(x, torch.Tensor)]
        flat = state + leaves
    else:
        raise GraphoptError(f"the torch frontend kept no graph to run ({type(src).__name__})",
                            "profile a torch.nn.Module with its example inputs")
    wanted = sum(1 for n in gm.graph.nodes if n.op == "placeholder")
    if len(flat) != wanted:
        raise GraphoptError(f"the traced graph takes {wanted} inputs but {len(flat)} were "
                            "given", "pass example inputs in forward's order (the ones the "
                            "model was traced with)")
    return gm, flat


def per_node(events: Any, device: str = "cpu") -> dict[str, list[float]]:
    """Node name -> seconds per run, from the profiler's event tree: the ops directly under
    each node's range, their CPU time on the CPU, their kernels' device time on a GPU."""
    field = "cpu_time_total" if device == "cpu" else "device_time_total"
    out: dict[str, list[float]] = defaultdict(list)
    for e in events:
        if e.name.startswith(NODE_RANGE):
            us = sum(getattr(c, field) for c in e.cpu_children)
            out[e.name[len(NODE_RANGE):]].append(us * 1e-6)
    return out


def node_times(prof: Any, device: str = "cpu") -> dict[str, list[float]]:
    """:func:`per_node` of a finished ``torch.profiler.profile``, the same numbers found
    without building torch's ``FunctionEvent`` tree on the CPU: that builder makes a Python
    object of ~40 fields per event and takes ~10x longer than the runs it measures (2.5 s for
    calibrate's 8,500 ranges). Here each thread's events are sorted by (start, -end) and
    nested with a stack, as ``EventList._populate_cpu_children`` nests them, skipping the
    events it skips (profiler bookkeeping, hidden, async, non-CPU ones). A GPU's device times
    (kernels linked by correlation id), or a torch without the raw results, take
    :func:`per_node`'s path."""
    results = getattr(getattr(prof, "profiler", None), "kineto_results", None)
    if device != "cpu" or results is None:
        return per_node(prof.events(), device)
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import _filter_name

    spans = []
    for i, e in enumerate(results.events()):
        name = e.name()
        if _filter_name(name) or getattr(e, "is_hidden_event", lambda: False)() \
                or e.device_type() != DeviceType.CPU or e.is_async() \
                or e.start_thread_id() != e.end_thread_id():
            continue
        spans.append((e.start_thread_id(), e.start_ns(), -e.end_ns(), i, name))
    spans.sort()  # ties stay in the profiler's order, as torch's stable sort keeps them
    out: dict[str, list[float]] = defaultdict(list)
    thread = None
    stack: list[tuple[int, list[float] | None]] = []  # (end, the node's samples or None)
    for tid, start, neg_end, _, name in spans:
        end = -neg_end
        if tid != thread:
            thread, stack = tid, []
        while stack and (start >= stack[-1][0] or end > stack[-1][0]):
            stack.pop()
        if stack and (samples := stack[-1][1]) is not None:  # a direct child of a node
            samples[-1] += (end - start) * 1e-9
        mine = None
        if name.startswith(NODE_RANGE):
            mine = out[name[len(NODE_RANGE):]]
            mine.append(0.0)
        stack.append((end, mine))
    return out


def _on(device: str, model: torch.nn.Module, args: Any) -> None:
    """The model and its inputs must already be where they are measured: graphopt never
    moves a user's module (a copy's parameters may alias the original's)."""
    want = torch.device(device)
    tensors = [*model.parameters(), *model.buffers(),
               *(x for x in pytree.tree_leaves(args) if isinstance(x, torch.Tensor))]
    off = sorted({str(t.device) for t in tensors if t.device.type != want.type})
    if off:
        raise GraphoptError(f"the target is {device} but the model or its inputs are on "
                            f"{', '.join(off)}", f"move both there first: model.to({device!r}) "
                            "and inputs .to(...), or profile on target='cpu'")


def measure_torch(graph: Graph, model: torch.nn.Module, args: tuple[Any, ...],
                  kwargs: dict[str, Any], *, runs: int, warmup: int,
                  threads: int | None = None, device: str = "cpu") -> Measured:
    """Per-node medians under torch.profiler, and the median wall times of the planned graph
    (as graphopt emits it) and of the user's module, on ``threads`` intra-op threads (torch's
    setting when None; restored after)."""
    _on(device, model, (args, kwargs))
    with user_state_guard(model, (args, kwargs), "profiling"):
        return _measure(graph, model, args, kwargs, runs=runs, warmup=warmup, threads=threads,
                        device=device)


def _measure(graph: Graph, model: torch.nn.Module, args: tuple[Any, ...],
             kwargs: dict[str, Any], *, runs: int, warmup: int, threads: int | None,
             device: str) -> Measured:
    """:func:`measure_torch` on private copies of the model's state and of the inputs (the
    parameters shared: nothing writes them, and the model may be large)."""
    args, kwargs = clone_inputs((args, kwargs))
    with contextlib.suppress(GraphoptError):  # not copyable: the caller's guard checks it
        model = private_copy(model, share_parameters=True)
    gpu = device != "cpu"
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    gm, flat = _runnable(graph, model, args, kwargs)
    try:
        with intra_op_threads(threads) as used, torch.no_grad():
            for _ in range(warmup):
                _Named(gm).run(*flat)
            sync()
            with library_quiet(), torch.profiler.profile(activities=activities) as prof:
                for _ in range(runs):
                    _Named(gm).run(*flat)
                sync()
            found = node_times(prof, device)
            emitted = _emitted(graph, gm, model)
            graph_times = _wall_times(lambda: emitted(*args, **kwargs), runs, warmup, sync)
            module_times = _wall_times(lambda: model(*args, **kwargs), runs, warmup, sync)
    except GraphoptError:
        raise
    except Exception as e:  # noqa: BLE001 - the model's own failure, said in one line
        raise GraphoptError(f"running the model to profile it failed: {first_line(e)}",
                            f"check that the model runs on its example inputs on {device} "
                            "(graphopt.plan traces it without running it)"
                            ) from None
    logger.info("profiled %d nodes over %d runs on %s", len(found), runs, device)
    what = "CPU" if device == "cpu" else f"{device} kernels"
    return Measured({k: statistics.median(v) for k, v in found.items()},
                    min(graph_times), runs, warmup,
                    f"torch.profiler ({what}), per fx node via record_function ranges (median "
                    "of the runs); whole graph and the user's module timed without the "
                    "profiler (best of the runs)", used,
                    module_s=min(module_times))


@contextlib.contextmanager
def intra_op_threads(threads: int | None) -> Iterator[int]:
    """torch's intra-op threads set to ``threads`` (its own when None), restored after;
    yields the count in use."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads or before)
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def _emitted(graph: Graph, gm: fx.GraphModule, model: torch.nn.Module) -> Any:
    """The plan's nodes as one module, called like the user's: a copy of the traced module
    without export's shape guard and pytree wrapping (``rewrites.pipeline.strip_unused``, as
    graphopt emits it) and without the shape/metadata asserts no plan node stands for
    (``fx_convert.computes_nothing``; ~9 us each here). A make_fx fallback graph takes its state as
    inputs, so there the user's module stands in."""
    if not isinstance(graph.source_model, torch.export.ExportedProgram):
        return model

    with library_quiet(stderr=False):  # torch's own deprecation in copying a pytree spec
        emitted = private_copy(gm)
    strip_unused(emitted)
    for node in list(emitted.graph.nodes):
        if node.op == "call_function" and not node.users and computes_nothing(node.target):
            emitted.graph.erase_node(node)
    emitted.recompile()
    return emitted


def _wall_times(call: Any, runs: int, warmup: int, sync: Any) -> list[float]:
    """Seconds of each of ``runs`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(runs):
        sync()
        t = time.perf_counter()
        call()
        sync()
        times.append(time.perf_counter() - t)
    return times
