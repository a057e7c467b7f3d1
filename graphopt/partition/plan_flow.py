"""A plan as a dataflow graph over tensor names, for the tensor-parallel block finder
(:mod:`.tp_blocks`): who produces and who reads each tensor, walks backwards and forwards
through chosen kernel classes, and the weight of a GEMM."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from graphopt.analysis.kernel_class import KernelClass
from graphopt.ir.plan import NodePlan, Plan

__all__ = ["GEMMS", "PlanFlow", "activations", "forward_from_tensors", "gemm_input",
           "gemm_weight_layout", "weight_of"]

GEMMS = frozenset({KernelClass.GEMM, KernelClass.GEMV, KernelClass.QUANT_GEMM,
                   KernelClass.QUANT_DOT})


class PlanFlow:
    """The plan as a dataflow graph over tensor names."""

    def __init__(self, plan: Plan) -> None:
        self.nodes = {n.name: n for n in plan.nodes}
        self.order = {n.name: i for i, n in enumerate(plan.nodes)}
        self.producer: dict[str, str] = {}
        self.consumers: dict[str, list[str]] = {}
        for n in plan.nodes:
            for t in n.outputs:
                if t is not None:
                    self.producer[t.name] = n.name
            for t in activations(n):
                self.consumers.setdefault(t.name, []).append(n.name)
        self.outputs = set(plan.model.output_names)

    def cls(self, name: str) -> KernelClass:
        return self.nodes[name].analysis.kernel_class

    def back(self, tensor: str, through: frozenset[KernelClass]
             ) -> tuple[set[str], set[str], set[str], bool]:
        """Walk producers from ``tensor`` through ``through`` classes: (GEMMs reached, nodes
        passed, graph inputs reached, blocked by another class)."""
        gemms: set[str] = set()
        passed: set[str] = set()
        inputs: set[str] = set()
        blocked = False
        stack, seen = [tensor], set()
        while stack:
            t = stack.pop()
            if t in seen:
                continue
            seen.add(t)
            p = self.producer.get(t)
            if p is None:
                inputs.add(t)
                continue
            c = self.cls(p)
            if c in GEMMS:
                gemms.add(p)
            elif c in through:
                passed.add(p)
                stack.extend(x.name for x in activations(self.nodes[p]))
            else:
                blocked = True
        return gemms, passed, inputs, blocked

    def forward(self, starts: Iterable[str], through: frozenset[KernelClass]) -> set[str]:
        """Nodes reachable from the outputs of ``starts`` through ``through`` classes."""
        return forward_from_tensors(
            self, [t.name for s in starts for t in self.nodes[s].outputs if t is not None],
            through)

    def leaves_block(self, names: Iterable[str], block: set[str]) -> bool:
        """Some output of ``names`` is read outside ``block`` (or is a graph output)."""
        for n in names:
            for t in self.nodes[n].outputs:
                if t is None:
                    continue
                if t.name in self.outputs or any(c not in block
                                                 for c in self.consumers.get(t.name, ())):
                    return True
        return False


def activations(n: NodePlan) -> list[Any]:
    """``n``'s inputs that are activations (not parameters or constants)."""
    return [t for t in n.inputs if t is not None and t.kind not in ("param", "constant")]


def weight_of(n: NodePlan) -> Any:
    """The GEMM's rank-2 weight parameter, or None (a GEMM of two activations)."""
    ws = [t for t in n.inputs if t is not None and t.kind in ("param", "constant")
          and t.shape is not None and len(t.shape) == 2]
    return ws[0] if ws else None


def gemm_weight_layout(n: NodePlan) -> str:
    """``"linear"`` for an ``nn.Linear`` weight (N x K), else ``"k_by_n"`` (addmm, Conv1D,
    MatMul)."""
    w, d = weight_of(n), n.analysis.dims
    return "linear" if w is not None and tuple(w.shape) == (d.get("N"), d.get("K")) \
        and n.op_type == "Linear" else "k_by_n"


def gemm_input(n: NodePlan) -> str | None:
    """The one activation a GEMM with a weight reads, or None."""
    acts = activations(n)
    return acts[0].name if len(acts) == 1 else None


def forward_from_tensors(flow: PlanFlow, tensors: Iterable[str],
                          through: frozenset[KernelClass]) -> set[str]:
    """Nodes reachable from ``tensors`` through nodes of the ``through`` classes."""
    out: set[str] = set()
    stack = list(tensors)
    while stack:
        for c in flow.consumers.get(stack.pop(), ()):
            if c not in out and flow.cls(c) in through:
                out.add(c)
                stack.extend(t.name for t in flow.nodes[c].outputs if t is not None)
    return out
