"""Multi-node patterns that run as one kernel in an optimized runtime.

Each matcher starts at an anchor node and walks a bounded number of producer/consumer steps, so
matching is linear in the graph size. A node joins at most one pattern; matchers run in the
order below and skip nodes already taken. Patterns recognized:

1. ``attention``: MatMul(Q, K^T) -> [scale, mask, cast]* -> Softmax -> [dropout, cast]* ->
   MatMul(P, V). Both MatMuls read activations (not weights).
2. ``rmsnorm``: x -> Pow(x, 2) | Mul(x, x) -> ReduceMean -> [Add eps] -> Rsqrt | Sqrt ->
   (Reciprocal | Div) -> Mul(x, .) -> [Mul weight]. Casts anywhere on the way are included.
3. ``layernorm`` (class norm): the same chain whose x is Sub(y, ReduceMean(y)).
4. ``rope``: Concat(Neg(Slice(x)), Slice(x)) (rotate_half) -> Mul(., sin), with
   Add(Mul(x, cos), .) when present.
5. ``silu``: Mul(x, Sigmoid(x)); ``swiglu``: Mul(silu(a), b).
6. ``qdq_gemm`` (class quant_gemm/quant_dot): a GEMM whose weight comes from DequantizeLinear.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from graphopt.analysis.kernel_class import KernelClass
from graphopt.analysis.metrics import gemm_dims
from graphopt.ir.graph import Graph, Node, TensorInfo

__all__ = ["PatternMatch", "find_patterns"]

logger = logging.getLogger(__name__)

_PASS_THROUGH = frozenset({"Cast", "Identity", "Copy"})
_SCORE_OPS = frozenset({"Add", "Sub", "Mul", "Div", "Where", "Cast", "Identity", "Max", "Min",
                        "Copy"})
_PROB_OPS = frozenset({"Dropout", "Cast", "Identity", "Where", "Copy"})
_MAX_STEPS = 8


@dataclass
class PatternMatch:
    """One instance of a pattern: its nodes share ``kernel_class`` and ``dims``."""

    name: str
    index: int
    kernel_class: KernelClass
    nodes: list[str]
    dims: dict[str, int] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.name}:{self.index}"


class _Matcher:
    def __init__(self, graph: Graph) -> None:
        self.g = graph
        self.producer = graph.producer
        self.consumers = graph.consumers
        self.taken: dict[str, PatternMatch] = {}
        self.counts: dict[str, int] = {}

    # -- helpers --------------------------------------------------------------------------
    def prod(self, tensor: str) -> Node | None:
        p = self.producer.get(tensor) if tensor else None
        return None if p is None or p.name in self.taken else p

    def sole_consumer(self, tensor: str) -> Node | None:
        cs = self.consumers.get(tensor, [])
        if len(cs) != 1 or cs[0].name in self.taken:
            return None
        return cs[0]

    def root(self, tensor: str, path: list[Node] | None = None) -> str:
        """Walk back through casts/identities; the walked nodes are appended to ``path``."""
        for _ in range(_MAX_STEPS):
            p = self.prod(tensor)
            if p is None or p.op_type not in _PASS_THROUGH:
                return tensor
            if path is not None:
                path.append(p)
            tensor = p.inputs[0]
        return tensor

    def is_activation(self, tensor: str) -> bool:
        t = self.g.tensor(tensor)
        return t is not None and t.kind in ("activation", "input")

    def is_scalar_like(self, node: Node, index: int) -> bool:
        """Input ``index`` is a constant/param scalar or broadcast vector, or a folded scalar."""
        if index >= len(node.inputs):
            return "scalar" in node.attrs or "other" in node.attrs
        t = self.g.tensor(node.inputs[index])
        return t is not None and (t.kind in ("constant", "param") or t.numel <= 1)

    def other_input(self, node: Node, tensor: str) -> str | None:
        rest = [t for t in node.inputs if t != tensor]
        return rest[0] if rest else None

    def record(self, name: str, kc: KernelClass, nodes: list[Node], dims: dict[str, int]) -> None:
        names = list(dict.fromkeys(n.name for n in nodes))
        if any(n in self.taken for n in names):
            return
        idx = self.counts.get(name, 0)
        self.counts[name] = idx + 1
        match = PatternMatch(name, idx, kc, names, dims)
        for n in names:
            self.taken[n] = match
        logger.debug("pattern %s: %s", match.id, names)

    def shape(self, tensor: str) -> tuple[int, ...]:
        t = self.g.tensor(tensor)
        if t is None or t.shape is None:
            return ()
        return tuple(d if isinstance(d, int) else 1 for d in t.shape)

    def numel_dims(self, tensor: str) -> dict[str, int]:
        t: TensorInfo | None = self.g.tensor(tensor)
        s = self.shape(tensor)
        cols = s[-1] if s else 1
        numel = t.numel if t is not None else 0
        return {"numel": numel, "rows": numel // cols if cols else 0, "cols": cols}

    # -- 1. attention ---------------------------------------------------------------------
    def attention(self, sm: Node) -> None:
        path: list[Node] = [sm]
        score = sm.inputs[0]
        qk = None
        for _ in range(_MAX_STEPS):
            p = self.prod(score)
            if p is None:
                return
            if p.op_type == "MatMul":
                qk = p
                break
            if p.op_type not in _SCORE_OPS:
                return
            path.append(p)
            same = [t for t in p.inputs if t and self.shape(t) == self.shape(p.outputs[0])
                    and self.is_activation(t) and self.producer.get(t) is not None]
            if not same:
                return
            score = same[-1] if p.op_type == "Where" else same[0]
        if qk is None or not all(self.is_activation(t) for t in qk.inputs[:2]):
            return
        probs = sm.outputs[0]
        pv = None
        for _ in range(_MAX_STEPS):
            c = self.sole_consumer(probs)
            if c is None:
                return
            if c.op_type == "MatMul" and c.inputs[0] == probs:
                pv = c
                break
            if c.op_type not in _PROB_OPS:
                return
            path.append(c)
            probs = c.outputs[0]
        if pv is None or not self.is_activation(pv.inputs[1]):
            return
        q = self.shape(qk.inputs[0])
        scores = self.shape(qk.outputs[0])
        lead = scores[:-2]
        dims = {"batch": lead[0] if lead else 1,
                "heads": lead[1] if len(lead) > 1 else 1,
                "seq_q": scores[-2] if len(scores) >= 2 else 1,
                "seq_kv": scores[-1] if scores else 1,
                "head_dim": q[-1] if q else 1}
        self.record("attention", KernelClass.ATTENTION, [qk, *reversed(path), pv], dims)

    # -- 2/3. rmsnorm and decomposed layernorm ----------------------------------------------
    def rms_or_layer_norm(self, mean: Node) -> None:
        path: list[Node] = []
        sq = self.prod(self.root(mean.inputs[0], path))
        if sq is None:
            return
        if sq.op_type == "Pow" and self.is_scalar_like(sq, 1):
            x = sq.inputs[0]
        elif sq.op_type == "Mul" and len(sq.inputs) == 2 and sq.inputs[0] == sq.inputs[1]:
            x = sq.inputs[0]
        else:
            return
        path += [sq, mean]
        x_root = self.root(x, path)
        kind, kc = "rmsnorm", KernelClass.RMSNORM
        centre = self.prod(x_root)
        if centre is not None and centre.op_type == "Sub":
            mean0 = self.prod(centre.inputs[1])
            if mean0 is not None and mean0.op_type == "ReduceMean" \
                    and self.root(mean0.inputs[0]) == self.root(centre.inputs[0]):
                kind, kc = "layernorm", KernelClass.NORM
                path += [mean0, centre]
        cur = mean.outputs[0]
        nxt = self.sole_consumer(cur)
        if nxt is not None and nxt.op_type == "Add" and self.is_scalar_like(
                nxt, 1 if nxt.inputs[0] == cur else 0):
            path.append(nxt)
            cur = nxt.outputs[0]
            nxt = self.sole_consumer(cur)
        if nxt is None:
            return
        if nxt.op_type == "Rsqrt":
            path.append(nxt)
            cur = nxt.outputs[0]
        elif nxt.op_type == "Sqrt":
            path.append(nxt)
            cur = nxt.outputs[0]
            inv = self.sole_consumer(cur)
            if inv is not None and inv.op_type == "Reciprocal":
                path.append(inv)
                cur = inv.outputs[0]
            elif inv is not None and inv.op_type == "Div" and inv.inputs[1] == cur:
                if self.root(inv.inputs[0]) == x_root:  # x / sqrt(...): normalized already
                    path.append(inv)
                    self._norm_tail(kind, kc, path, inv.outputs[0], x_root)
                    return
                path.append(inv)
                cur = inv.outputs[0]
            else:
                return
        else:
            return
        scale = self.sole_consumer(cur)
        if scale is None or scale.op_type != "Mul":
            return
        other = self.other_input(scale, cur)
        if other is None or self.root(other) != x_root:
            return
        path.append(scale)
        self._norm_tail(kind, kc, path, scale.outputs[0], x_root)

    def _norm_tail(self, kind: str, kc: KernelClass, path: list[Node], cur: str,
                   x_root: str) -> None:
        """Optional cast, weight multiply (and bias add for layernorm) after normalization."""
        for _ in range(3):
            c = self.sole_consumer(cur)
            if c is None:
                break
            if c.op_type in _PASS_THROUGH:
                path.append(c)
            elif c.op_type == "Mul" and self.is_scalar_like(c, 1 if c.inputs[0] == cur else 0):
                path.append(c)
            elif kind == "layernorm" and c.op_type == "Add" and self.is_scalar_like(
                    c, 1 if c.inputs[0] == cur else 0):
                path.append(c)
            else:
                break
            cur = c.outputs[0]
        self.record(kind, kc, path, self.numel_dims(x_root))

    # -- 4. rotary embedding ----------------------------------------------------------------
    def rope(self, cat: Node) -> None:
        if len(cat.inputs) != 2:
            return
        neg = self.prod(cat.inputs[0])
        s1 = self.prod(cat.inputs[1])
        if neg is None or s1 is None or neg.op_type != "Neg" or s1.op_type != "Slice":
            return
        s2 = self.prod(neg.inputs[0])
        if s2 is None or s2.op_type != "Slice" or s2.inputs[0] != s1.inputs[0]:
            return
        x = s1.inputs[0]
        path = [s1, s2, neg, cat]
        mul_sin = self.sole_consumer(cat.outputs[0])
        if mul_sin is not None and mul_sin.op_type == "Mul":
            path.append(mul_sin)
            add = self.sole_consumer(mul_sin.outputs[0])
            if add is not None and add.op_type == "Add":
                other = self.prod(self.other_input(add, mul_sin.outputs[0]) or "")
                if other is not None and other.op_type == "Mul" and x in other.inputs:
                    path += [other, add]
        dims = self.numel_dims(x)
        self.record("rope", KernelClass.ROPE, path,
                    {"numel": dims["numel"], "head_dim": dims["cols"]})

    # -- 5. silu and swiglu -----------------------------------------------------------------
    def silu(self, mul: Node) -> None:
        if len(mul.inputs) != 2:
            return
        for i in (0, 1):
            sig = self.prod(mul.inputs[i])
            if sig is not None and sig.op_type == "Sigmoid" and sig.inputs[0] == mul.inputs[1 - i]:
                self.record("silu", KernelClass.SILU, [sig, mul], self.numel_dims(mul.outputs[0]))
                return

    def swiglu(self, mul: Node) -> None:
        if len(mul.inputs) != 2 or mul.name in self.taken:
            return
        for i in (0, 1):
            p = self.producer.get(mul.inputs[i])
            if p is None:
                continue
            prior = self.taken.get(p.name)
            gate_nodes: list[str] | None = None
            if p.op_type == "Silu" and prior is None:
                gate_nodes = [p.name]
            elif prior is not None and prior.name == "silu" and prior.nodes[-1] == p.name:
                gate_nodes = prior.nodes
            if gate_nodes is None or not self.is_activation(mul.inputs[1 - i]):
                continue
            if self.shape(mul.inputs[0]) != self.shape(mul.inputs[1]):
                continue
            for n in gate_nodes:
                self.taken.pop(n, None)
            nodes = [self.g.node_by_name[n] for n in gate_nodes] + [mul]
            self.record("swiglu", KernelClass.SILU, nodes, self.numel_dims(mul.outputs[0]))
            return

    # -- 6. QDQ GEMM ------------------------------------------------------------------------
    def qdq_gemm(self, gemm: Node) -> None:
        if len(gemm.inputs) < 2:
            return
        dq_w = self.producer.get(gemm.inputs[1])
        if dq_w is None or dq_w.op_type != "DequantizeLinear":
            return
        # a weight's DequantizeLinear may feed several GEMMs: it joins the first one's group
        path = [dq_w] if dq_w.name not in self.taken else []
        dq_x = self.prod(gemm.inputs[0])
        if dq_x is not None and dq_x.op_type == "DequantizeLinear":
            path.append(dq_x)
        d = gemm_dims(gemm, self.g.input_infos(gemm))
        vector = d["M"] == 1 or d["N"] == 1
        kc = KernelClass.QUANT_DOT if vector else KernelClass.QUANT_GEMM
        self.record("qdq_gemm", kc, [*path, gemm], d)


def find_patterns(graph: Graph) -> dict[str, PatternMatch]:
    """Node name -> the pattern instance it belongs to."""
    m = _Matcher(graph)
    by_op: dict[str, list[Node]] = {}
    for n in graph.nodes:
        by_op.setdefault(n.op_type, []).append(n)
    for n in by_op.get("Softmax", []):
        m.attention(n)
    for n in by_op.get("ReduceMean", []):
        if n.name not in m.taken:
            m.rms_or_layer_norm(n)
    for n in by_op.get("Concat", []):
        if n.name not in m.taken:
            m.rope(n)
    for n in by_op.get("Mul", []):
        if n.name not in m.taken:
            m.silu(n)
    for n in by_op.get("Mul", []):
        m.swiglu(n)
    for op in ("MatMul", "Gemm", "Linear"):
        for n in by_op.get(op, []):
            if n.name not in m.taken:
                m.qdq_gemm(n)
    return _renumber(graph, m.taken)


def _renumber(graph: Graph, taken: dict[str, PatternMatch]) -> dict[str, PatternMatch]:
    """Number each pattern's instances 0, 1, ... in graph order (stable across matchers)."""
    seen: set[int] = set()
    counts: dict[str, int] = {}
    for n in graph.nodes:
        match = taken.get(n.name)
        if match is not None and id(match) not in seen:
            seen.add(id(match))
            match.index = counts.get(match.name, 0)
            counts[match.name] = match.index + 1
    return taken
