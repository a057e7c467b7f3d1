"""The node data embedded in the HTML report, with every distinct value stored once.

A 50k-node plan repeats the same reason strings, decision sets and cost notes on almost every
node (one per layer and op kind), and the same tensor records twice (as one node's output and the
next node's input). Embedding one array per node wrote all of that out each time: ~1 KB a node,
50 MB for 50k nodes. Here each distinct value goes into a table once and the rows refer to it by
index, and the page script (``_html_js``) expands the tables back into the same per-node records.

The tables, every string in them an index into ``strings``:

1. ``strings``: every distinct text (names, ops, dims, reasons, field texts).
2. ``tensors``: ``[name, shape, dtype]``.
3. ``decisions``: ``[kind, short value, reason, [[field, text]...], applied 1/0/null, head 1/0]``.
4. ``dsets``: one node's decisions on one target: ``[head text, [decision...]]``.
5. ``costs``: the cost notes as ``[[key, text]...]``.
6. ``profiles``: what a node is and costs, without its name, tensors and decisions (see
   ``PROFILE``); ``per`` holds one ``[est, bottleneck, compute, memory, peak, cost]`` per
   target (``null`` where the target lacks the node), plus ``flops, ai`` only where they differ
   from the node's (they never do on one target).
7. ``nodes``: ``[name, profile, [input tensor...], [output tensor...], [dset per target],
   [fusion group label per target]]`` in table order. Decisions stay out of the profile: a
   split plan gives every node its own ``device`` decision (start and finish), which would
   otherwise make every profile distinct.

Decoded (``decode`` here, ``decode()`` in the page), a node is the record of ``FIELDS``, with one
``TFIELDS`` array per target in ``per``. Profiles, decisions and cost notes are formatted once per
distinct value: formatting every node's decisions was most of the 50k-node render time (~10 s of
~13 s). A profile is found by the exact bytes of the node fields it reads (``_key``), a tensor and
a decision by value (they are frozen records, hashed and compared field by field).
"""

from __future__ import annotations

import json
import marshal
import math
import operator
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from graphopt.cost.roofline import NodeCost
from graphopt.ir.graph import TensorInfo
from graphopt.report.format import (
    HEAD_KINDS,
    decision_head,
    decision_texts,
    finite,
    fmt_dims,
    fmt_shape,
    ordered_kinds,
)

if TYPE_CHECKING:  # ir.plan imports the report package (its emitters): no import at run time
    from graphopt.ir.plan import Decision, NodePlan

__all__ = ["FIELDS", "PROFILE", "TFIELDS", "Tables", "ai", "decode", "encode", "payload", "points",
           "r6"]

FIELDS = ("name", "op", "op_type", "kernel_class", "dims", "dtype", "flops", "bytes",
          "bytes_read", "bytes_written", "ai", "params", "pattern", "flags", "inputs", "outputs",
          "per")
TFIELDS = ("est_time_s", "bottleneck", "compute_time_s", "memory_time_s", "peak_flops_used",
           "flops", "ai", "decisions", "cost", "dhead", "fusion_group")
PROFILE = FIELDS[1:14] + ("per",)  # a profile: FIELDS without name and tensors


def r6(value: Any) -> float | None:
    """Six significant digits: keeps the JSON small; enough to order nodes and plot them."""
    v = finite(value)
    return None if v is None else float(f"{v:.6g}")


def ai(node: NodePlan) -> float | None:
    """FLOP per byte: the node's own figure as the JSON report rounds it, else FLOPs / bytes."""
    a = node.analysis
    v = round(a.arithmetic_intensity, 6)
    if v > 0:
        return v
    flops, nbytes = finite(a.flops), finite(a.bytes_total)
    return flops / nbytes if flops and nbytes else None


def _clean(value: Any) -> Any:
    """JSON-safe copy: non-finite floats become null (JSON.parse rejects NaN/Infinity)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def _key(value: Any) -> bytes | None:
    """An exact key for a plan value (equal bytes, equal value), or None for a foreign type.

    ``marshal`` is a C walk over the JSON-like values a plan holds and keeps types apart
    (``1``, ``1.0`` and ``True`` differ); ``json.dumps(sort_keys=True)`` costs ~3x as much.
    Version 2 writes no back-references, whose table costs more than these small values.
    """
    try:
        return marshal.dumps(value, 2)
    except ValueError:  # e.g. a numpy scalar: formatted every time, never cached
        return None


class Tables:
    """The interned tables; ``add`` gives a value's index, appending it the first time."""

    def __init__(self) -> None:
        self.tables: dict[str, list[Any]] = {k: [] for k in (
            "strings", "tensors", "decisions", "dsets", "costs", "profiles")}
        self.uses: list[int] = []  # nodes per profile (the roofline counts points with it)
        self._index: dict[str, dict[Hashable, int]] = {k: {} for k in self.tables}
        self._by_key: dict[tuple[str, Hashable], int] = {}
        self._strings = self._index["strings"]
        self._kinds: dict[tuple[Any, ...], tuple[str, ...]] = {}
        self._tensor_ids: dict[tuple[Any, ...], int] = {}
        self._decision_ids: dict[Hashable, int] = {}

    def add(self, table: str, value: Hashable) -> int:
        index = self._index[table]
        i = index.get(value)
        if i is None:
            i = index[value] = len(self.tables[table])
            self.tables[table].append(value)
        return i

    def cached(self, table: str, key: Hashable | None, make: Callable[[], Any]) -> int:
        """The index of ``make()``, called once per distinct ``key`` (every time if None)."""
        i = self._by_key.get((table, key)) if key is not None else None
        if i is None:
            value = make()
            try:
                i = self.add(table, value)
            except TypeError:  # unhashable: a list where a number belongs; stored as it is
                i = len(self.tables[table])
                self.tables[table].append(value)
            if key is not None:
                self._by_key[table, key] = i
        return i

    def s(self, value: Any) -> int | None:
        """A string's index (anything else is stored as its ``str``); None stays None."""
        if value is None:
            return None
        if type(value) is not str:
            value = str(value)
        i = self._strings.get(value)  # add() inlined: most of the calls are for strings
        if i is None:
            i = self._strings[value] = len(self._strings)
            self.tables["strings"].append(value)
        return i

    def tensors(self, tensors: Sequence[TensorInfo | None]) -> tuple[int, ...]:
        """Tensor indices; a tensor is one node's output and the next one's input, stored once."""
        out, ids = [], self._tensor_ids
        for t in tensors:
            if t is None:  # an absent optional input
                continue
            key = (t.name, t.shape, t.dtype)  # what is shown; a plain tuple hashes in C
            i = ids.get(key)  # cached() inlined: a 50k-node plan has ~130k tensor records
            if i is None:
                i = ids[key] = self.add("tensors", self._tensor(t))
            out.append(i)
        return tuple(out)

    def _tensor(self, t: TensorInfo) -> tuple[int | None, ...]:
        shape = t.shape
        text = self.cached("strings", ("shape", shape), lambda: fmt_shape(shape))
        return self.s(t.name), text, self.s(t.dtype or "")

    def dset(self, decisions: Mapping[str, Decision]) -> int:
        """One node's decisions on one target: the rows of its decisions (each distinct one
        formatted once) and its head text. A split plan gives every node its own ``device``
        decision (its start and finish), so sets rarely repeat there, but the precision and path
        decisions still do."""
        names = tuple(decisions)
        kinds = self._kinds.get(names)
        if kinds is None:
            kinds = self._kinds[names] = tuple(ordered_kinds(decisions))
        ids = tuple(self._decision_id(k, decisions[k]) for k in kinds)
        # a decision's row holds every field's text, so its index fixes the head text too
        head_key = ("head", tuple(i for k, i in zip(kinds, ids, strict=True) if k in HEAD_KINDS))
        head = self.cached("strings", head_key, lambda: decision_head(decisions))
        return self.add("dsets", (head, ids))

    def _decision_id(self, kind: str, d: Decision) -> int:
        """The row of one decision, formatted the first time its value is met."""
        ids, key = self._decision_ids, (kind, d)
        try:
            i = ids.get(key)  # frozen records: hashed and compared by value
        except TypeError:  # a detail holding a dict (padding's dims): its JSON's bytes
            key = _key((kind, d.to_dict()))
            i = ids.get(key) if key is not None else None
        if i is None:
            summary, fields = decision_texts(d)
            s = self.s
            i = self.add("decisions", (s(kind), s(summary), s(d.reason),
                                       tuple((s(k), s(text)) for k, text in fields),
                                       int(d.applied), int(kind in HEAD_KINDS)))
            if key is not None:
                ids[key] = i
        return i

    def cost(self, cost: NodeCost) -> int:
        values = _COST_OF(cost)
        return self.cached("costs", _key(values), lambda: tuple(
            (self.s(k), self.s(v)) for k, v in _pairs(zip(_COST, values, strict=True))))


#: the fields of a node's cost notes (its JSON ``cost`` object), in name order
_COST = ("alignment_efficiency", "bandwidth_used", "note", "overhead_s", "precision", "unit",
         "utilization")
_COST_OF = operator.attrgetter(*_COST)


def _pairs(fields: Iterable[tuple[str, Any]]) -> list[tuple[str, str]]:
    """(key, value) pairs as (key, text); empty values are dropped."""
    out = []
    for k, v in fields:
        if v is None or v == "":
            continue
        if isinstance(v, float):
            text = f"{v:.4g}"  # utilization 0.030303030303 -> 0.0303
        else:
            text = v if isinstance(v, str) else json.dumps(_clean(v), sort_keys=True, default=str)
        out.append((k, text))
    return out


def _per(x: NodePlan | None, flops: int, node_ai: float | None,
         tb: Tables) -> tuple[Any, ...] | None:
    """One target's part of a profile; flops and ai only where they differ from the node's."""
    if x is None:
        return None
    c = x.cost
    part = (r6(c.est_time_s), tb.s(c.bottleneck), r6(c.compute_time_s), r6(c.memory_time_s),
            r6(c.peak_flops_used), tb.cost(c))
    own = (x.analysis.flops, r6(ai(x)))
    return part if own == (flops, node_ai) else part + own


def _profile(records: Sequence[NodePlan | None], tb: Tables) -> tuple[Any, ...]:
    n = next(x for x in records if x is not None)
    a, s = n.analysis, tb.s
    flops, node_ai = a.flops, r6(ai(n))
    return (s(n.op or n.op_type or ""), s(n.op_type or ""), s(a.kernel_class.value),
            s(fmt_dims(a.dims)), s(a.dtype), flops, a.bytes_total, a.bytes_read,
            a.bytes_written, node_ai, a.param_count, s(a.pattern), tuple(s(f) for f in a.flags),
            tuple(_per(x, flops, node_ai, tb) for x in records))


#: every field a profile reads (one C call), so that equal fields mean an equal profile; the
#: kernel class as its value (``marshal`` writes no enums)
_READS = operator.attrgetter(
    "op", "op_type", "analysis.kernel_class.value", "analysis.dims", "analysis.dtype",
    "analysis.flops", "analysis.bytes_read", "analysis.bytes_written", "analysis.param_count",
    "analysis.pattern", "analysis.flags", "cost.est_time_s", "cost.bottleneck",
    "cost.compute_time_s", "cost.memory_time_s", "cost.peak_flops_used",
    *(f"cost.{k}" for k in _COST))


def encode(joined: Sequence[tuple[str, Sequence[NodePlan | None]]],
           labels: Sequence[Mapping[str, str]] = ()) -> Tables:
    """Intern every joined node (one record per target, or None): profile, name, tensors,
    decisions and fusion group. Nodes of repeated layers share a profile, so it is formatted
    once per distinct one. ``labels``: per target, node name -> the label of its fusion group
    (``report.fusion.node_labels``); a node's group is its own, so it stays out of the profile.
    """
    tb = Tables()
    rows, uses = [], tb.uses
    for name, records in joined:
        raw = [None if x is None else _READS(x) for x in records]
        pid = tb.cached("profiles", _key(raw), lambda records=records: _profile(records, tb))
        if pid == len(uses):
            uses.append(0)
        uses[pid] += 1
        n = next(x for x in records if x is not None)
        rows.append((tb.s(name), pid, tb.tensors(n.inputs), tb.tensors(n.outputs),
                     tuple(None if x is None else tb.dset(x.decisions) for x in records),
                     tuple(None if x is None or t >= len(labels) else tb.s(labels[t].get(x.name))
                           for t, x in enumerate(records))))
    tb.tables["nodes"] = rows
    return tb


def points(tb: Tables, t: int) -> list[tuple[float, float, int]]:
    """Target ``t``'s roofline points (FLOP/byte, attained FLOP/s, how many nodes sit there).

    Nodes with no FLOPs, no time or no intensity have no place on log-log axes and are left out.
    """
    out = []
    for profile, count in zip(tb.tables["profiles"], tb.uses, strict=True):
        per = profile[-1][t]
        if per is None:
            continue
        est, (flops, x) = per[0], per[6:8] if len(per) > 6 else (profile[5], profile[9])
        flops = r6(flops)
        if flops and flops > 0 and est and est > 0 and x and x > 0:
            out.append((x, flops / est, count))
    return out


def decode(data: Mapping[str, Any]) -> list[list[Any]]:
    """The embedded tables back as one ``FIELDS`` row per node, as the page script reads them.

    The page's ``decode()`` in ``_html_js`` does the same in JS; tests compare this with the plan.
    """
    strings = data["strings"]

    def text(i: int | None) -> str | None:
        return None if i is None else strings[i]

    def pairs(ps: Sequence[Sequence[int]]) -> list[list[str | None]]:
        return [[text(k), text(v)] for k, v in ps]

    tensors = [[text(i) for i in t] for t in data["tensors"]]
    decs = [[text(d[0]), text(d[1]), text(d[2]), pairs(d[3]), d[4], d[5]]
            for d in data["decisions"]]
    dsets = [(text(head), [decs[k] for k in ks]) for head, ks in data["dsets"]]
    costs = [pairs(c) for c in data["costs"]]

    def target(q: Sequence[Any] | None, p: Mapping[str, Any], d: int | None,
               g: int | None) -> list[Any] | None:
        if q is None or d is None:
            return None
        head, decisions = dsets[d]
        flops, x = (q[6], q[7]) if len(q) > 6 else (p["flops"], p["ai"])
        t = {"est_time_s": q[0], "bottleneck": text(q[1]), "compute_time_s": q[2],
             "memory_time_s": q[3], "peak_flops_used": q[4], "flops": flops, "ai": x,
             "decisions": decisions, "cost": costs[q[5]], "dhead": head,
             "fusion_group": text(g)}
        return [t[f] for f in data["tfields"]]

    profiles = []
    for a in data["profiles"]:
        p = dict(zip(data["profile"], a, strict=True))
        for f in ("op", "op_type", "kernel_class", "dims", "dtype", "pattern"):
            p[f] = text(p[f])
        p["flags"] = [text(f) for f in p["flags"]]
        profiles.append(p)
    rows = []
    for name, pid, ins, outs, ds, gs in data["nodes"]:
        p = profiles[pid]
        r = {**p, "name": text(name), "inputs": [tensors[k] for k in ins],
             "outputs": [tensors[k] for k in outs],
             "per": [target(q, p, d, g) for q, d, g in zip(p["per"], ds, gs, strict=True)]}
        rows.append([r[f] for f in data["fields"]])
    return rows


def payload(tb: Tables, extra: Mapping[str, Any]) -> str:
    """The embedded JSON text: the tables, the node rows and ``extra`` (targets, colours...)."""
    data = {**extra, "fields": FIELDS, "tfields": TFIELDS, "profile": PROFILE, **tb.tables}
    opts: dict[str, Any] = {"ensure_ascii": True, "sort_keys": True, "separators": (",", ":"),
                            "allow_nan": False, "default": str}
    try:  # the tables hold finite numbers and strings; clean only where a NaN or inf slipped in
        text = json.dumps(data, **opts)
    except ValueError:
        text = json.dumps(_clean(data), **opts)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
