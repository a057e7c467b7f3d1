"""Measure a torch model per plan node: torch.profiler over an fx Interpreter that names nodes.

Why an Interpreter: the plan's node names are torch.export's fx node names
(``frontends.fx_convert``). Running the traced graph node by node, each under
``record_function("graphopt::node::<name>")``, puts every ATen op a node dispatches inside a
range that carries the plan's name, so nothing has to match op names or call order. A node's
time is the sum of the inclusive CPU times of the ops directly under its range: the
Interpreter's own Python work around them is not counted.

The whole model is timed apart, without the profiler and the Interpreter: the module as the
user calls it, median of ``runs`` runs.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections import defaultdict
from typing import Any

import torch
from torch import fx
from torch.fx._pytree import tree_flatten_spec
from torch.profiler import ProfilerActivity, record_function
from torch.utils import _pytree as pytree

from graphopt.errors import GraphoptError, first_line
from graphopt.ir import Graph
from graphopt.profiling.stats import Measured

__all__ = ["measure_torch"]

logger = logging.getLogger(__name__)

_PREFIX = "graphopt::node::"
_CALLS = ("call_function", "call_method", "call_module")


class _Named(fx.Interpreter):
    """Runs each call node inside a profiler range named after it."""

    def run_node(self, n: fx.Node) -> Any:
        if n.op not in _CALLS:
            return super().run_node(n)
        with record_function(_PREFIX + n.name):
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


def _per_node(events: Any) -> dict[str, list[float]]:
    """Node name -> seconds per run, from the profiler's event tree."""
    out: dict[str, list[float]] = defaultdict(list)
    for e in events:
        if e.name.startswith(_PREFIX):
            us = sum(c.cpu_time_total for c in e.cpu_children)
            out[e.name[len(_PREFIX):]].append(us * 1e-6)
    return out


def measure_torch(graph: Graph, model: torch.nn.Module, args: tuple[Any, ...],
                  kwargs: dict[str, Any], *, runs: int, warmup: int,
                  threads: int | None = None) -> Measured:
    """Per-node medians under torch.profiler and the whole model's median wall time, on
    ``threads`` intra-op threads (torch's setting when None; restored after)."""
    gm, flat = _runnable(graph, model, args, kwargs)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads or before)
        with torch.no_grad():
            for _ in range(warmup):
                _Named(gm).run(*flat)
            with torch.profiler.profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(runs):
                    _Named(gm).run(*flat)
            per_node = _per_node(prof.events())
            for _ in range(warmup):
                model(*args, **kwargs)
            times = []
            for _ in range(runs):
                t = time.perf_counter()
                model(*args, **kwargs)
                times.append(time.perf_counter() - t)
    except GraphoptError:
        raise
    except Exception as e:  # noqa: BLE001 - the model's own failure, said in one line
        raise GraphoptError(f"running the model to profile it failed: {first_line(e)}",
                            "check that the model runs on its example inputs on this "
                            "machine's CPU (graphopt.plan traces it without running it)"
                            ) from None
    finally:
        torch.set_num_threads(before)
    logger.info("profiled %d nodes over %d runs", len(per_node), runs)
    return Measured({k: statistics.median(v) for k, v in per_node.items()},
                    statistics.median(times), runs, warmup,
                    "torch.profiler (CPU), per fx node via record_function ranges; whole "
                    "model timed without the profiler", threads or before)
