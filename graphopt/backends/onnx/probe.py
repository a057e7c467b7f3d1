"""The accuracy guard's probe: one ONNX model holding a lossy pass's candidate and, beside each
node the pass lowered, that node at the precision it had before, with a switch between them.
One ONNX Runtime session of it runs any set of nodes kept in higher precision, one run per set.

Identity, per lowered node ``n`` with outputs ``o``: the candidate computes ``o`` with its own
nodes (``lo``: fp16 nodes and their casts, the quantizer's Q/DQ or integer ops); the probe
renames that value ``__lo/o`` and adds ``__hi/o``, the node as ``model`` had it (its constants,
its dtype), reading the same tensor names the candidate's consumers read, then

    o = Where(keep_n, __hi/o, __lo/o)

Cases:

1. ``keep`` all false: every tensor is the candidate's, computed by the candidate's own nodes
   on the candidate's values (``Where`` picks one input exactly): the candidate's outputs.
2. ``keep`` all true: every lowered node computes from its inputs at ``model``'s precision,
   and the nodes the pass did not lower are the candidate's, which compute what ``model``'s do.
   Where the candidate feeds such a node a tensor derived from a lowered node's output other
   than by an exact cast to fp32 (a Q/DQ pair), a second switch of that node picks the output
   itself: ``model``'s outputs. Not quite where the candidate feeds such a node a Q/DQ copy of
   a tensor no lowered node produced (ONNX Runtime's static quantizer shares a quantized
   reader's input Q/DQ with a float reader): that copy stays (a difference of 1.5e-4 at the
   output of the zoo's residual CNN; every other zoo model, fp16 and INT8, is exact).
3. A mix: the pass re-run with the kept nodes excluded, approximately (the real pass may also
   move a neighbour, e.g. a follow op after a kept GEMM stays fp32): the guard searches on the
   probe and verifies its final pick on the real re-run.
4. With ``keep`` all true, ``__lo/o`` is the lowered node computed from exact inputs: the
   error it adds by itself (teacher forcing; ONNX Runtime's ``qdq_loss_debug`` compares the
   same pre/post pair for Q/DQ nodes).
5. Not switched (the node stays lowered in every run): a node whose outputs or inputs the
   candidate renamed, and Constant nodes. ``Probe.switched`` lists the switched nodes.

fp16 is measured as :func:`ort_runner.emulate_fp16` rounds it: both models are emulated before
they are joined, so every tensor between nodes is fp32 (or the integer type it was) and the
two sides of a switch share a dtype; a node ``model`` already held in fp16 (quantize after
precision) is copied with the rounding casts emulation put after it. ``keep_n`` is a scalar
bool input of its own. The session runs with graph optimizations off (as ``qdq_loss_debug``
does): the rounding casts stay and no fusion crosses a switch. Cases 1 and 2 hold bit for bit
(``tests/test_guard_sensitivity.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from graphopt.backends.onnx.ort_runner import OrtModel, emulate_fp16
from graphopt.errors import GraphoptError

__all__ = ["HI", "LO", "Probe", "build_probe"]

logger = logging.getLogger(__name__)

_T = onnx.TensorProto
HI, LO, _KEEP = "__hi/", "__lo/", "__graphopt_keep"
_SUBGRAPH = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
_TRUE, _FALSE = np.array(True), np.array(False)


@dataclass
class Probe:
    """The switched model's session; ``switched[node] = its output names``, in graph order."""

    session: OrtModel
    outputs: list[str]
    switched: dict[str, list[str]]
    #: lowered nodes the probe could not switch (case 5), with why
    skipped: dict[str, str] = field(default_factory=dict)
    runs: int = 0
    _binding: Any = field(default=None, repr=False)
    _flags: dict[str, bool] = field(default_factory=dict, repr=False)
    _fed: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    def run(self, feed: dict[str, np.ndarray], keep: Collection[str],
            extra: Sequence[str] = ()) -> list[np.ndarray]:
        """The model's outputs (then ``extra`` tensors) with the nodes in ``keep`` at the
        precision they had before the pass and every other switched node lowered.

        Bound through one IOBinding that only the changed switches are bound on again:
        ``InferenceSession.run`` checks its feed against the inputs in O(inputs^2) Python
        (70 ms a run with 3,000 switches), binding them all anew takes 30-50 ms."""
        keep = keep if isinstance(keep, set | frozenset) else set(keep)
        missing = [n for n in self.session.input_names
                   if not n.startswith(_KEEP) and n not in feed]
        if missing:
            raise GraphoptError(f"no value for input(s) {', '.join(missing)} of the model",
                                "give calibration/sample data with one array per model input")
        if self._binding is None:
            self._binding = self.session.session.io_binding()
        bind = self._binding
        for name in self.session.input_names:
            if not name.startswith(_KEEP):  # the binding reads the array: keep it alive
                self._fed[name] = np.ascontiguousarray(feed[name])
                bind.bind_cpu_input(name, self._fed[name])
        for node in self.switched:
            flag = node in keep
            if self._flags.get(node) is not flag:
                bind.bind_cpu_input(_flag(node), _TRUE if flag else _FALSE)
                self._flags[node] = flag
        bind.clear_binding_outputs()
        for name in (*self.outputs, *extra):
            bind.bind_output(name)
        self.runs += 1
        try:
            self.session.session.run_with_iobinding(bind)
            return bind.copy_outputs_to_cpu()
        except Exception as e:  # ORT raises Fail/InvalidArgument...: one message
            raise GraphoptError(f"ONNX Runtime failed running the guard's probe: "
                                f"{' '.join(str(e).split())[:400]}",
                                "pass precision='fp32' / quantize='none' to skip the pass"
                                ) from None


def _flag(node: str) -> str:
    return f"{_KEEP}/{node}"


def _mentions_fp16(model: onnx.ModelProto) -> bool:
    """Whether any tensor of ``model`` may be fp16 (a cheap scan; emulation is costly)."""
    g = model.graph
    typed = (*g.input, *g.output, *g.value_info)
    if any(vi.type.tensor_type.elem_type == _T.FLOAT16 for vi in typed) or any(
            t.data_type == _T.FLOAT16 for t in g.initializer):
        return True
    return any((a.name in ("to", "dtype") and a.i == _T.FLOAT16)
               or (a.type == onnx.AttributeProto.TENSOR and a.t.data_type == _T.FLOAT16)
               for n in g.node for a in n.attribute)


def _emulated(model: onnx.ModelProto) -> onnx.ModelProto:
    return emulate_fp16(model) if _mentions_fp16(model) else model


def _same(a: onnx.TensorProto, b: onnx.TensorProto) -> bool:
    return (a.data_type == b.data_type and list(a.dims) == list(b.dims)
            and a.SerializeToString() == b.SerializeToString())


class _Joiner:
    """Adds ``model``'s lowered nodes beside the candidate's (cases 1-5)."""

    def __init__(self, model: onnx.ModelProto, cand: onnx.ModelProto) -> None:
        self.model, self.out = model, cand
        g = cand.graph
        self.inits = {t.name: t for t in g.initializer}
        self.names = ({vi.name for vi in g.input} | set(self.inits)
                      | {o for n in g.node for o in n.output if o})
        self.producer = {o: n for n in g.node for o in n.output if o}
        self.m_inits = {t.name: t for t in model.graph.initializer}
        self.m_consts = {n.output[0]: n for n in model.graph.node
                         if n.op_type == "Constant" and n.output}
        self.m_readers: dict[str, list[onnx.NodeProto]] = {}
        for n in model.graph.node:
            for t in n.input:
                self.m_readers.setdefault(t, []).append(n)
        self.added: dict[str, str] = {}  # model constant -> its name in the probe
        self.nodes: list[onnx.NodeProto] = []

    def constant(self, t: str) -> str:
        """The probe's name for ``model``'s constant ``t`` (added once, renamed on a clash)."""
        if t in self.added:
            return self.added[t]
        if t in self.m_inits:
            init, mine = self.m_inits[t], self.inits.get(t)
            # the candidate may name another tensor ``t`` (ONNX Runtime's QDQ quantizer writes
            # a DequantizeLinear output over the float bias's name)
            free = mine is None and t not in self.names
            name = t if free or (mine is not None and _same(init, mine)) else f"{HI}{t}"
            if name != t or free:
                copy = onnx.TensorProto()
                copy.CopyFrom(init)
                copy.name = name
                self.out.graph.initializer.append(copy)
        else:
            name = f"{HI}{t}"
            node = onnx.NodeProto()
            node.CopyFrom(self.m_consts[t])
            node.output[:] = [name]
            node.name = name
            self.nodes.append(node)
        self.added[t] = name
        return name

    def unit(self, node: onnx.NodeProto, outs: list[str]) -> list[onnx.NodeProto] | None:
        """``node`` of the emulated ``model`` and the rounding casts emulation put after it,
        up to its outputs ``outs`` (None where that chain is not plain casts)."""
        unit = [node]
        for x, o in zip(node.output, outs, strict=True):
            while x != o:
                nxt = [c for c in self.m_readers.get(x, []) if c.op_type == "Cast"]
                if len(nxt) != 1:
                    return None
                unit.append(nxt[0])
                x = nxt[0].output[0]
        return unit

    def switch(self, node: onnx.NodeProto, outputs: list[str]) -> str | None:
        """Add the switch for ``node`` (of the emulated ``model``; ``outputs``: its output
        names before emulation); None, or why it cannot be switched (case 5)."""
        if node.op_type == "Constant":
            return "a Constant node"
        if any(a.type in _SUBGRAPH for a in node.attribute):
            return "it has subgraphs"
        outs = [o for o in outputs if o]
        if not outs or any(o not in self.producer for o in outs):
            return "the pass renamed its outputs"
        unit = self.unit(node, outputs)
        if unit is None:
            return "its emulated fp16 rounding is not a chain of casts"
        inner = {o for n in unit for o in n.output if o}
        copies = []
        for n in unit:
            hi = onnx.NodeProto()
            hi.CopyFrom(n)
            hi.name = f"{HI}{n.name or n.output[0]}"
            for i, t in enumerate(n.input):
                if t in inner or not t:
                    hi.input[i] = f"{HI}{t}" if t else t
                elif t in self.m_inits or t in self.m_consts:
                    hi.input[i] = self.constant(t)
                elif t not in self.names:
                    return f"the pass renamed its input {t!r}"
            hi.output[:] = [f"{HI}{o}" if o else "" for o in n.output]
            copies.append(hi)
        self.nodes += copies
        # the node's switch: a scalar bool input (broadcasts to any output shape); one input
        # per node costs the session less than Gathers from one vector (3,000 switches:
        # 3.7-4.1 s against 4.8-6.9 s on the 6,000-node MLP, 2-core EPYC under load)
        flag = _flag(node.name)
        self.out.graph.input.append(onnx.helper.make_tensor_value_info(flag, _T.BOOL, []))
        for o in outs:
            lo = self.producer[o]
            lo.output[:] = [f"{LO}{o}" if x == o else x for x in lo.output]
            self.nodes.append(onnx.helper.make_node(
                "Where", [flag, f"{HI}{o}", f"{LO}{o}"], [o], name=f"{_KEEP}/{node.name}/{o}"))
        return None

    def _widened(self, t: str, source: str) -> bool:
        """``t`` is ``source`` cast to fp32, exact (the precision pass's cast after an fp16
        node; emulated, every float is fp32 already): no switch needed."""
        cast = self.producer.get(t)
        return (cast is not None and cast.op_type == "Cast" and list(cast.input) == [source]
                and any(a.name == "to" and a.i == _T.FLOAT for a in cast.attribute))

    def reroute(self, switched: dict[str, list[str]]) -> None:
        """Case 2 for the nodes the pass did not lower: where the candidate feeds one a tensor
        it derived from a switched output (a Q/DQ pair on a quantized node's output, a cast),
        a switch of the same node picks the output itself when the node is kept."""
        flag_of = {o: _flag(n) for n, outs in switched.items() for o in outs}
        mine = {n.name: n for n in self.model.graph.node if n.name}
        made: dict[tuple[str, str], str] = {}
        for c in self.out.graph.node:
            m = mine.get(c.name)
            if (m is None or c.name in switched or len(m.input) != len(c.input)
                    or any(o.startswith(LO) for o in c.output)):
                continue
            for i, (tc, tm) in enumerate(zip(c.input, m.input, strict=True)):
                if tc == tm or tm not in flag_of or self._widened(tc, tm):
                    continue
                if (tm, tc) not in made:
                    made[tm, tc] = f"{_KEEP}/{tm}/{tc}"
                    self.nodes.append(onnx.helper.make_node(
                        "Where", [flag_of[tm], tm, tc], [made[tm, tc]], name=made[tm, tc]))
                c.input[i] = made[tm, tc]


def build_probe(model: onnx.ModelProto, candidate: onnx.ModelProto,
                lowered: Sequence[str]) -> Probe:
    """The probe of ``candidate`` (``model`` rewritten by a lossy pass) for the ``lowered``
    node names of ``model``. Raises GraphoptError where ONNX Runtime cannot load it."""
    import onnxruntime as ort

    m, cand = _emulated(model), _emulated(candidate)
    if cand is candidate:
        cand = onnx.ModelProto()
        cand.CopyFrom(candidate)
    join = _Joiner(m, cand)
    by_name = {n.name: n for n in m.graph.node}
    plain = {n.name: list(n.output) for n in model.graph.node}
    switched: dict[str, list[str]] = {}
    skipped: dict[str, str] = {}
    for name in lowered:
        node = by_name.get(name)
        why = ("not in the model" if node is None or name not in plain
               else join.switch(node, plain[name]))
        if why is None:
            switched[name] = [o for o in plain[name] if o]
        else:
            skipped[name] = why
    join.reroute(switched)
    g = cand.graph
    outputs = [o.name for o in g.output]
    # ONNX Runtime sorts the nodes itself when it loads a model (Graph::Resolve): the added
    # ones go at the end, and no checker ever reads the probe
    g.node.extend(join.nodes)
    del g.value_info[:]  # the renamed tensors' types are inferred again by ORT
    have = {o.name for o in g.output}
    for o in (x for outs in switched.values() for x in outs):
        for name in (f"{HI}{o}", f"{LO}{o}"):
            if name not in have:
                g.output.append(onnx.ValueInfoProto(name=name))
    _opsets(cand, model)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = OrtModel(cand, what="the guard's probe", options=opts)
    logger.debug("probe: %d nodes switched, %d not (%s)", len(switched), len(skipped),
                 "; ".join(sorted(set(skipped.values()))))
    return Probe(session, outputs, switched, skipped)


def _opsets(out: onnx.ModelProto, other: onnx.ModelProto) -> None:
    """Every domain either model imports, at the higher version of the two."""
    have = {o.domain: o for o in out.opset_import}
    for o in other.opset_import:
        if o.domain not in have:
            out.opset_import.append(o)
        elif have[o.domain].version < o.version:
            have[o.domain].version = o.version
