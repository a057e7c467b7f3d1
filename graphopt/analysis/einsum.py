"""What an ``Einsum`` computes: a GEMM when it is one, else elementwise, a reduction or a view.

An equation names each operand's dims by a letter (``"bij,bjk->bik"``; ``...`` for broadcast
dims, right-aligned as numpy does; no ``->``: the output is the letters used once, sorted).
Both frameworks contract the operands pairwise, left to right (torch does unless ``opt_einsum``
is installed; ONNX Runtime too), so each step of two operands is read as a GEMM:

* ``batch``: letters in both operands and kept (in the output or a later operand);
* ``M``: letters only in the first and kept; ``N``: only in the second and kept;
* ``K``: letters in both and summed here (in neither the output nor a later operand).

A step with a ``K`` is a GEMM of ``2 * batch * M * N * K`` FLOPs (a GEMV when ``M`` or ``N`` is
1). A letter only one operand has and nobody keeps is summed out of that operand first (one add
per element of it). With no ``K`` anywhere the einsum is a broadcast product (``"i,j->ij"``,
one multiply per output element: elementwise) or, when letters are summed, a reduction (a
multiply and an add per term). One operand: a reduction when letters are summed
(``"ij->i"``), else a permutation or a diagonal, which torch returns as a view.
"""

from __future__ import annotations

import math
import string
from dataclasses import dataclass

from graphopt.analysis.kernel_class import KernelClass

__all__ = ["EinsumWork", "einsum_work"]

#: stand-ins for the dims ``...`` covers (letters an equation cannot use)
_ELLIPSIS = "".join(chr(0x3B1 + i) for i in range(16))


@dataclass(frozen=True, slots=True)
class EinsumWork:
    """Kernel class, dims and FLOPs of one einsum (dims of its biggest GEMM step)."""

    kernel_class: KernelClass
    dims: dict[str, int]
    flops: int


def _terms(equation: str, ranks: list[int]) -> tuple[list[str], str] | None:
    """Each operand's letters and the output's, ``...`` expanded; None if malformed."""
    eq = equation.replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        return None
    spans = [rank - (len(t) - 3) if "..." in t else 0 for t, rank in zip(terms, ranks,
                                                                         strict=True)]
    if any(s < 0 for s in spans) or max(spans) > len(_ELLIPSIS):
        return None
    most = max(spans)
    full = [t.replace("...", _ELLIPSIS[most - s:most]) for t, s in zip(terms, spans,
                                                                       strict=True)]
    if any(len(t) != r for t, r in zip(full, ranks, strict=True)):
        return None
    if arrow:
        out = out.replace("...", _ELLIPSIS[:most])
    else:  # implicit output: broadcast dims, then the letters used once, sorted
        once = [c for c in sorted(set(lhs)) if c in string.ascii_letters and lhs.count(c) == 1]
        out = _ELLIPSIS[:most] + "".join(once)
    return full, out


def _sizes(terms: list[str], shapes: list[tuple[int, ...]]) -> dict[str, int]:
    """Size of each letter: the largest of its dims (a size-1 dim broadcasts)."""
    sizes: dict[str, int] = {}
    for term, shape in zip(terms, shapes, strict=True):
        for c, d in zip(term, shape, strict=True):
            sizes[c] = max(sizes.get(c, 1), d)
    return sizes


def _prod(letters: set[str] | str, sizes: dict[str, int]) -> int:
    return math.prod(sizes[c] for c in set(letters))


def einsum_work(equation: str, shapes: list[tuple[int, ...]]) -> EinsumWork | None:
    """The einsum's work, or None when the equation does not fit the operands' ranks."""
    parsed = _terms(equation, [len(s) for s in shapes])
    if parsed is None or not shapes:
        return None
    terms, out = parsed
    sizes = _sizes(terms, shapes)
    if not set(out) <= set(sizes):  # an output letter no operand has
        return None
    if len(terms) == 1:
        summed = set(terms[0]) - set(out)
        if summed:
            return EinsumWork(KernelClass.REDUCTION, {"numel": _prod(out, sizes),
                                                      "input_numel": math.prod(shapes[0])},
                              math.prod(shapes[0]))
        return EinsumWork(KernelClass.VIEW, {"numel": _prod(out, sizes)}, 0)
    flops, best, best_flops, summed_any = 0, None, -1, False
    left = terms[0]
    for i, right in enumerate(terms[1:], start=1):
        later = set(out).union(*terms[i + 1:])
        a, b = set(left), set(right)
        for own, other in ((a, b), (b, a)):
            dropped = own - other - later
            if dropped:  # summed out of this operand alone before the product
                flops += _prod(own, sizes)
                own -= dropped
                summed_any = True
        keep = (a | b) & later
        d = {"M": _prod((a - b) & keep, sizes), "N": _prod((b - a) & keep, sizes),
             "K": _prod((a & b) - keep, sizes), "batch": _prod(a & b & keep, sizes)}
        contracted = bool((a & b) - keep)
        step = 2 * d["M"] * d["N"] * d["K"] * d["batch"] if contracted else _prod(keep, sizes)
        flops += step
        if contracted and step > best_flops:
            best, best_flops = d, step
        left = "".join(sorted(keep))
    numel = _prod(out, sizes)
    if best is not None:
        vector = best["M"] == 1 or best["N"] == 1
        return EinsumWork(KernelClass.GEMV if vector else KernelClass.GEMM, best, flops)
    if summed_any:
        return EinsumWork(KernelClass.REDUCTION, {"numel": numel}, flops)
    return EinsumWork(KernelClass.ELEMENTWISE, {"numel": numel}, flops)
