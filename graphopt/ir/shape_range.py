"""Shape ranges: one plan for every size between a dynamic dimension's min and max.

TensorRT calls this an optimization profile (min/opt/max per input), torch.export gives each
dynamic dimension a ``Dim`` with a range, ONNX names it with a ``dim_param``. Graphopt plans at the
opt point (the example's size, or the one the user names) and costs the same graph at min and
max, so the report shows the estimate over the whole range. Every decision must be legal at every
point: padding touches weight channels only, never a dynamic dimension.

Graph shapes spell a dynamic dimension as a string: its name (``"batch"``) or an expression of
names (``"2*seq"``, ``"seq - 1"``). :func:`bind` turns them into numbers for one point.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from graphopt.errors import GraphoptError
from graphopt.ir.graph import Graph, TensorInfo
from graphopt.ir.records import Record, optional

__all__ = ["CHECK_BUDGET", "CHECK_MAX_ELEMENTS", "MAX_DIM_VALUE", "POINTS", "DimRange",
           "ShapeRange", "bind", "bind_shape", "dim_expression", "evaluate"]

#: the points of a range the plan is costed at, in order
POINTS = ("min", "opt", "max")
#: a check point's inputs may hold at most this many times the opt inputs' elements
CHECK_BUDGET = 16
#: ... and at most this many elements in all (256 MiB of fp32) when opt holds fewer: a max of
#: 10**9 is costed by the plan, never materialized for a numeric check
CHECK_MAX_ELEMENTS = 2**26


@dataclass(frozen=True, slots=True)
class DimRange(Record):
    """One dynamic dimension: its name, the sizes it may take, and the size planned for.

    ``max`` is None when nothing bounds it (``Dim.DYNAMIC`` without ``max``): the module accepts
    any size, and the max point is costed at ``opt`` (the report says so).
    """

    name: str
    min: int
    opt: int
    max: int | None
    #: where the numbers came from ("dynamic_shapes", "example", "default", ...)
    source: str = ""
    #: torch's own name for it (``s77``), which graphs re-read from fx carry; JSON leaves out
    #: an empty one
    symbol: str = optional("")

    def at(self, point: str) -> int:
        if point == "min":
            return self.min
        if point == "max" and self.max is not None:
            return self.max
        return self.opt

    def contains(self, size: int) -> bool:
        return size >= self.min and (self.max is None or size <= self.max)

    @property
    def bounds(self) -> str:
        return f"[{self.min}, {'inf' if self.max is None else self.max}]"

    def describe(self) -> str:
        return f"{self.name} in {self.bounds}"


@dataclass(frozen=True, slots=True)
class ShapeRange(Record):
    """The dynamic dimensions of a model and where they sit in its inputs.

    ``inputs`` maps each graph input to its shape, a dynamic dimension spelled by its name.
    """

    dims: tuple[DimRange, ...]
    inputs: Mapping[str, tuple[int | str, ...]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.dims)

    def dim(self, name: str) -> DimRange | None:
        return next((d for d in self.dims if d.name == name), None)

    def values(self, point: str = "opt") -> dict[str, int]:
        """Dim name (and torch symbol) -> size at ``point``."""
        return self._with_symbols({d.name: d.at(point) for d in self.dims})

    def check(self, shapes: Mapping[str, tuple[int, ...] | None]) -> str | None:
        """None if ``shapes`` (input name -> shape) lie in the range, else what is wrong."""
        seen: dict[str, int] = {}
        derived: list[tuple[str, int, str, int]] = []
        for name, want in self.inputs.items():
            got = shapes.get(name)
            if got is None:
                continue
            if len(got) != len(want):
                return f"input {name!r} has {len(got)} dims {tuple(got)}, expected {len(want)}"
            for i, (w, g) in enumerate(zip(want, got, strict=True)):
                if isinstance(w, int):
                    if w != g:
                        return f"input {name!r} dim {i} is {g}; it is static at {w}"
                    continue
                r = self.dim(w)
                if r is None:  # an expression of dims (4*t, t+1): once they are all known
                    derived.append((name, i, w, g))
                    continue
                if not r.contains(g):
                    return f"input {name!r} dim {i} ({w}) is {g}, outside {r.bounds}"
                if seen.setdefault(w, g) != g:
                    return f"dim {w} is {seen[w]} in one input and {g} in {name!r}"
        values = self._with_symbols(seen)
        for name, i, w, g in derived:
            want_size = evaluate(w, values)
            if want_size is not None and want_size != g:
                given = ", ".join(f"{k} = {v}" for k, v in seen.items())
                return f"input {name!r} dim {i} is {g}; it is {w}, which is {want_size} " \
                       f"with {given}"
        return None

    def describe(self) -> str:
        return ", ".join(d.describe() for d in self.dims)

    def check_values(self, point: str, budget: int = CHECK_BUDGET) -> dict[str, int]:
        """The sizes to check ``point`` at: its own, with the dims above opt scaled down (the
        same factor each) until the inputs hold at most ``budget`` x the opt inputs' elements
        (a numeric check at a 64 x 4096 max would take longer than the whole optimization),
        and at most ``CHECK_MAX_ELEMENTS`` (or the opt inputs' own count, if more)."""
        def size(sizes: dict[str, int]) -> int:
            v = self._with_symbols(sizes)
            return sum(math.prod(d for d in bind_shape(shape, v) or () if isinstance(d, int))
                       for shape in self.inputs.values())

        sizes = {d.name: d.at(point) for d in self.dims}
        at_opt = size({d.name: d.opt for d in self.dims})
        limit = min(budget * at_opt, max(at_opt, CHECK_MAX_ELEMENTS))
        while size(sizes) > limit:
            shrunk = {d.name: max(d.opt, sizes[d.name] * 3 // 4) for d in self.dims}
            if shrunk == sizes:
                break
            sizes = shrunk
        return self._with_symbols(sizes)

    def end_points(self) -> list[tuple[str, dict[str, int]]]:
        """(point, the sizes to check it at) for min and max, where they differ from opt: the
        ends every numeric check covers besides the example."""
        opt = self.values("opt")
        return [(p, v) for p in ("min", "max") if (v := self.check_values(p)) != opt]

    def _with_symbols(self, sizes: dict[str, int]) -> dict[str, int]:
        return {**sizes, **{d.symbol: sizes[d.name] for d in self.dims if d.symbol}}

    def sized_inputs(self, values: Mapping[str, int], arrays: Mapping[str, Any],
                     tile: Any) -> dict[str, Any]:
        """``arrays`` (input name -> example array) tiled (``tile(array, reps)``) or cropped
        along each dynamic dim to the sizes ``values`` give: ids stay ids, masks stay masks."""
        out = {}
        for name, a in arrays.items():
            shape = bind_shape(self.inputs.get(name), values)
            if shape is None or not all(isinstance(d, int) for d in shape) or \
                    len(shape) != len(a.shape):
                out[name] = a
                continue
            reps = [-(-want // have) if want > have else 1
                    for want, have in zip(shape, a.shape, strict=True)]
            grown = tile(a, reps) if any(r > 1 for r in reps) else a
            out[name] = grown[tuple(slice(0, d) for d in shape)]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"dims": [d.to_json() for d in self.dims],
                "inputs": {k: list(v) for k, v in self.inputs.items()}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ShapeRange:
        try:
            dims = tuple(DimRange(d["name"], int(d["min"]), int(d["opt"]),
                                  None if d["max"] is None else int(d["max"]),
                                  d.get("source", ""), d.get("symbol", ""))
                         for d in data["dims"])
            inputs = {k: tuple(v) for k, v in data["inputs"].items()}
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            raise GraphoptError(f"a shape range record is malformed ({str(e)[:200]})",
                                "write it with ShapeRange.to_dict") from None
        return cls(dims, inputs)


# --- evaluating dimension expressions ---------------------------------------------------------
# A dim expression comes from a model file (an ONNX ``dim_param``) as much as from torch's sympy
# printer, so it is evaluated within limits: ``9**9**9**9`` is refused, not computed for ever.
#: longest expression evaluated (torch's printer writes a few dozen characters)
MAX_EXPR_CHARS = 1000
#: most AST nodes, and the deepest nesting, in one expression
MAX_EXPR_NODES, MAX_EXPR_DEPTH = 400, 60
#: largest magnitude of any value along the way (a dim is an int64), and of a power's exponent
MAX_DIM_VALUE, MAX_EXPONENT = 2**62, 64

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.Pow: operator.pow}
# the functions torch's sympy printer writes into size expressions
_CALLS = {"Max": max, "Min": min, "max": max, "min": min, "FloorDiv": operator.floordiv,
          "CeilDiv": lambda a, b: -(-a // b), "Mod": operator.mod, "PythonMod": operator.mod,
          "floor": math.floor, "ceiling": math.ceil, "CeilToInt": math.ceil,
          "FloorToInt": math.floor, "TruncToInt": int, "IntTrueDiv": operator.truediv}


class _TooBig(ValueError):
    """An expression past the limits above: not evaluated."""


def evaluate(expr: str, values: Mapping[str, int]) -> int | None:
    """The integer value of a dimension expression at ``values``, or None if it names an
    unknown symbol, is not plain arithmetic, or goes past the limits above (too long, too
    deep, a value above ``MAX_DIM_VALUE`` or an exponent above ``MAX_EXPONENT``)."""
    if expr in values:
        return values[expr]
    if not isinstance(expr, str) or len(expr) > MAX_EXPR_CHARS:
        return None
    try:
        tree = ast.parse(expr, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # ValueError: a NUL byte
        return None
    try:
        if sum(1 for _ in ast.walk(tree)) > MAX_EXPR_NODES:
            return None
        out = _eval(tree, values, 0)
    except (KeyError, TypeError, ValueError, ZeroDivisionError, OverflowError, RecursionError):
        return None
    return int(out) if isinstance(out, (int, float)) and float(out).is_integer() else None


def _bounded(v: Any) -> float:
    """``v`` if it is a finite number within ``MAX_DIM_VALUE``, else _TooBig."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(type(v).__name__)
    if not (isinstance(v, int) or math.isfinite(v)) or abs(v) > MAX_DIM_VALUE:
        raise _TooBig(v)
    return v


def _power(base: float, exp: float) -> float:
    """``base ** exp``, refused before it is computed when the result would pass the bounds."""
    if isinstance(exp, int) and (exp < 0 or exp > MAX_EXPONENT) and abs(base) > 1:
        raise _TooBig(exp)
    if abs(exp) > MAX_EXPONENT:  # a float exponent (or a huge one on 0/1): keep it small too
        raise _TooBig(exp)
    if abs(base) > 1 and exp > 0 and exp * math.log2(abs(base)) > math.log2(MAX_DIM_VALUE):
        raise _TooBig(base)
    return base ** exp


def _eval(node: ast.AST, values: Mapping[str, int], depth: int) -> float:
    if depth > MAX_EXPR_DEPTH:
        raise _TooBig(depth)
    depth += 1
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return _bounded(node.value)
    if isinstance(node, ast.Name):
        return _bounded(values[node.id])
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        a, b = _eval(node.left, values, depth), _eval(node.right, values, depth)
        if isinstance(node.op, ast.Pow):
            return _bounded(_power(a, b))
        return _bounded(_BINOPS[type(node.op)](a, b))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _eval(node.operand, values, depth)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
            node.func.id in _CALLS and not node.keywords and node.args:
        args = [_eval(a, values, depth) for a in node.args]
        return _bounded(_CALLS[node.func.id](*args))
    raise ValueError(ast.dump(node)[:200])


def bind_shape(shape: tuple[int | str, ...] | None, values: Mapping[str, int]
               ) -> tuple[int | str, ...] | None:
    """``shape`` with every dimension expression that ``values`` decides replaced by its size."""
    if shape is None or all(type(d) is int for d in shape):
        return shape
    out = []
    for d in shape:
        v = d if type(d) is int else evaluate(str(d), values)
        out.append(d if v is None else v)
    return tuple(out)


def bind(graph: Graph, values: Mapping[str, int]) -> Graph:
    """A copy of ``graph`` whose tensor shapes are sized at ``values`` (dim name -> size); the
    copy is one point of the range, so it has no range of its own.

    Nodes and attributes are shared, not copied: a rewrite reads the symbolic attributes (a
    reshape's target stays ``[batch, seq, 4, 72]``), the cost model reads the sized tensors.
    """
    if not values:
        return graph
    tensors: dict[str, TensorInfo] = {}
    sized: dict[tuple[int | str, ...], tuple[int | str, ...] | None] = {}  # shapes repeat
    for name, t in graph.tensors.items():
        if t.is_static or t.shape is None:
            tensors[name] = t
            continue
        shape = sized.get(t.shape)
        if shape is None:
            shape = sized[t.shape] = bind_shape(t.shape, values)
        tensors[name] = TensorInfo(t.name, shape, t.dtype, t.kind)
    out = Graph(graph.name, graph.source, graph.nodes, tensors, graph.inputs, graph.outputs,
                warnings=graph.warnings, source_model=graph.source_model)
    for structure in ("producer", "consumers", "node_by_name"):  # the same nodes: share them
        setattr(out, structure, getattr(graph, structure))
    return out


_DIM_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def dim_expression(expr: str, dims: Mapping[str, Any]) -> Any:
    """``expr`` (``t``, ``4*t``, ``t + 1``) built from ``dims`` (name -> ``torch.export.Dim``,
    which supports ``*``, ``+`` and ``-`` with ints): a derived Dim torch.export checks and
    keeps; None for anything it cannot derive."""
    def build(node: ast.AST) -> Any:
        if isinstance(node, ast.Name):
            return dims[node.id]
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _DIM_OPS:
            return _DIM_OPS[type(node.op)](build(node.left), build(node.right))
        raise ValueError(expr)

    if expr in dims:
        return dims[expr]
    if len(expr) > MAX_EXPR_CHARS:
        return None
    try:
        out = build(ast.parse(expr, mode="eval").body)
    except (SyntaxError, ValueError, KeyError, TypeError, RecursionError):
        return None
    return None if isinstance(out, int) else out
