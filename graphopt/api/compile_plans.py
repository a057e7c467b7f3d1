"""What ``torch.compile(model, backend="graphopt")`` did, graph by graph: ``graphopt.last_plan()``.

Torch-free on purpose: ``graphopt/__init__`` imports this module at load, so ``last_plan`` and the
cheap registration below cost no torch import (the backend itself lives in
:mod:`graphopt.api.compile_backend`, loaded by torch when it looks the backend up).

A *compile* here is what one top-level call of a compiled model or function captured: dynamo
compiles the frame's first graph, and each graph break's continuation (a
``torch_dynamo_resume_in_...`` frame) while that same call runs. The backend tells the two apart
(:func:`graphopt.api.compile_backend.starts_compile`); :func:`last_plan` returns the graphs of the
latest compile, in capture order. A recompile (new shapes, a guard that failed, another model)
starts a new compile; the earlier one's plans stay on the object :func:`last_plan` returned then.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from graphopt.ir.plan import Plan

__all__ = ["BACKEND_NAME", "CompilePlans", "CompiledGraph", "last_plan", "record_graph",
           "register_dynamo_backend"]

logger = logging.getLogger(__name__)

#: the name ``torch.compile(backend=...)`` takes, and the entry point's (pyproject.toml)
BACKEND_NAME = "graphopt"
_ENTRY = "graphopt.api.compile_backend:graphopt_backend"


@dataclass(frozen=True)
class CompiledGraph:
    """One graph dynamo captured and what graphopt did with it.

    ``plan`` is graphopt's plan with the decisions it applied (None when the graph went to
    Inductor untouched); ``fallback`` says why it did (None when graphopt optimized it);
    ``runtime`` is what runs the graph: "inductor", "eager" (graphopt's module as is) or the
    deploy artifact ("onnxruntime", "openvino").
    """

    compile_id: str
    runtime: str
    plan: Plan | None = None
    fallback: str | None = None
    #: the dims dynamo kept symbolic, as ``input[dim]`` (empty for a static graph)
    dynamic: tuple[str, ...] = ()
    seconds: float = 0.0
    #: how the runtime differs from the one asked for, and why (e.g. Inductor refused the graph)
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"compile_id": self.compile_id, "runtime": self.runtime,
                "fallback": self.fallback, "dynamic": list(self.dynamic),
                "seconds": round(self.seconds, 3), "note": self.note,
                "plan": None if self.plan is None else self.plan.to_dict()}


@dataclass(frozen=True)
class CompilePlans:
    """The graphs of one compile, in capture order (one per graph break's side)."""

    graphs: tuple[CompiledGraph, ...]

    def __len__(self) -> int:
        return len(self.graphs)

    def __iter__(self) -> Iterator[CompiledGraph]:
        return iter(self.graphs)

    def __getitem__(self, i: int) -> CompiledGraph:
        return self.graphs[i]

    @property
    def plans(self) -> tuple[Plan, ...]:
        """The plans of the graphs graphopt optimized (fallbacks have none)."""
        return tuple(g.plan for g in self.graphs if g.plan is not None)

    @property
    def plan(self) -> Plan:
        """The plan, when the compile captured one graph and graphopt optimized it."""
        if len(self.graphs) != 1 or self.graphs[0].plan is None:
            raise ValueError(f"this compile captured {len(self.graphs)} graph(s), "
                             f"{len(self.plans)} optimized: read .graphs or .plans")
        return self.graphs[0].plan

    def to_dict(self) -> dict[str, Any]:
        return {"graphs": [g.to_dict() for g in self.graphs]}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def to_markdown(self) -> str:
        """Each graph's heading (compile id, runtime, fallback reason) and its plan's report."""
        parts = []
        for i, g in enumerate(self.graphs):
            head = f"## Graph {i} (dynamo compile {g.compile_id}): runs in {g.runtime}"
            why = (f"graphopt left it to Inductor: {g.fallback}" if g.fallback else
                   f"optimized by graphopt in {g.seconds:.1f} s"
                   + (f"; symbolic dims {', '.join(g.dynamic)}" if g.dynamic else "")
                   + (f"; {g.note}" if g.note else ""))
            parts.append(f"{head}\n\n{why}\n" + ("" if g.plan is None
                                                 else "\n" + g.plan.to_markdown()))
        return "\n".join(parts)

    def __repr__(self) -> str:
        rows = ", ".join(f"{g.compile_id}:{g.runtime}" + ("(fallback)" if g.fallback else "")
                         for g in self.graphs)
        return f"CompilePlans({rows})"


_lock = threading.Lock()
_current: list[CompiledGraph] = []
_last: CompilePlans | None = None


def record_graph(graph: CompiledGraph, *, new_compile: bool) -> None:
    """Add one graph's record; ``new_compile`` starts a new compile (module doc)."""
    global _last
    with _lock:
        if new_compile:
            _current.clear()
        _current.append(graph)
        _last = CompilePlans(tuple(_current))


def last_plan() -> CompilePlans | None:
    """The graphs the latest ``torch.compile(..., backend="graphopt")`` compile captured and
    what graphopt did with each (:class:`CompilePlans`: ``.plan`` when there was one graph,
    ``.graphs`` / ``.plans`` otherwise, ``.to_markdown()``); None before any."""
    return _last


def register_dynamo_backend() -> bool:
    """Name the backend in dynamo's registry when dynamo is already loaded (else torch finds it
    through the ``torch_dynamo_backends`` entry point, or when the backend module is imported).

    Registered as an entry point object, dynamo's own lazy form: the backend module, and torch
    with it, load only when ``torch.compile`` asks for ``backend="graphopt"``, so ``import
    graphopt`` stays as fast as before. True when registered here.
    """
    registry = sys.modules.get("torch._dynamo.backends.registry")
    backends = getattr(registry, "_BACKENDS", None)
    if not isinstance(backends, dict) or BACKEND_NAME in backends:
        return False
    from importlib.metadata import EntryPoint  # here: torch imported it already, graphopt not

    backends[BACKEND_NAME] = EntryPoint(BACKEND_NAME, _ENTRY, "torch_dynamo_backends")
    logger.debug("registered the %r torch.compile backend", BACKEND_NAME)
    return True
