"""Made-up inputs that fit the model: the sizes and values a bare ``optimize`` feeds the guard.

A published model's structure often fixes what its free dims leave open: a text-line
recognizer wants 48-pixel lines, a detector's strides want a side of a multiple of 32, a voice
detector wants a window of at least 256 samples and a sample rate of 8 or 16 kHz. Made-up
inputs at the stated defaults (1 for a leading dim, 128 for any other, 0/1 integers) break
such models, and sent every user to write calibration files for a float optimization.

So when the user gives neither samples nor sizes, the guard's inputs are found by trying,
in ONNX Runtime, on the original model (the one source of truth about what it accepts):

1. the defaults, with a plausible value for an integer scalar input named like a sample rate
   (``sr``, ``sample_rate``: 16000);
2. other values for the integer scalars (rates, then small counts);
3. each free dim the user did not size (batch dims aside), alone, at sizes real inputs have
   (32 ... 1024, 1);
4. all of them together at each of those sizes;
5. one of them at 1 (a recurrent state's batch slot) and another at each of those sizes.

The first that runs is the opt point. A free dim the search moved, and any free dim whose range
end (min 1) does not run, is fixed from below at that size (``source="fitted"``): the range
ends are then checked only where the model runs. At most :data:`MAX_TRIALS` runs in
:data:`TIME_BUDGET_S`; when none fits, the caller's error names the inputs and asks for real
ones.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import onnx

from graphopt.backends.onnx.ort_runner import OrtModel, sample_feeds
from graphopt.errors import GraphoptError
from graphopt.frontends.onnx_range import default_opt, free_input_dims, parse_dim_spec
from graphopt.ir.graph import Graph
from graphopt.ir.shape_range import ShapeRange

__all__ = ["Fit", "MAX_TRIALS", "TIME_BUDGET_S", "fit_for", "fit_from_feed", "fit_inputs"]

logger = logging.getLogger(__name__)

#: sizes real inputs have: feature maps and text lines, image sides, audio windows
SIZE_CANDIDATES = (32, 48, 64, 224, 256, 320, 512, 640, 16, 8, 1024, 1)
#: an integer scalar named like a sample rate gets a rate; any other tries these in turn
RATE_NAMES = frozenset({"sr", "sample_rate", "sampling_rate", "samplerate", "rate", "fs"})
RATE_CANDIDATES = (16000, 8000, 22050, 44100, 48000)
COUNT_CANDIDATES = (1, 2, 16000, 8000)
#: the most model runs one search makes (each on small inputs), and the time it may take
MAX_TRIALS, TIME_BUDGET_S = 64, 30.0
_INTS = frozenset({onnx.TensorProto.INT64, onnx.TensorProto.INT32})


@dataclass
class Fit:
    """What the search found: sizes for the free dims it moved or fixed, values for the
    integer scalar inputs, and what it did (for the report)."""

    spec: dict[str, tuple[int, int, int | None]] = field(default_factory=dict)
    values: dict[str, int] = field(default_factory=dict)
    trials: int = 0
    note: str | None = None
    #: the dims' source in the shape range: found by the search, or read off the user's data
    source: str = "fitted"

    def spec_with(self, user: Any) -> Any:
        """The user's ``dynamic_shapes`` with the fitted dims added (the user's as given)."""
        return {**user, **self.spec} if self.spec and isinstance(user, Mapping) else \
            (dict(self.spec) if self.spec and user is None else user)

    def marked(self, rng: ShapeRange | None) -> ShapeRange | None:
        """``rng`` with the fitted dims' source (``"fitted"`` or ``"calibration"``)."""
        if not rng or not self.spec:
            return rng
        return replace(rng, dims=tuple(replace(d, source=self.source) if d.name in self.spec
                                       else d for d in rng.dims))


def _free_dims(graph: Graph, spec: Mapping[str, Any] | None) -> tuple[dict[str, int], set[str]]:
    """The symbolic input dims the user did not size, at their default opt (onnx_range's),
    and those that lead an input (batch dims: never searched)."""
    dims = free_input_dims(graph)
    free: dict[str, int] = {}
    for _, axis, dim in dims:
        if dim not in (spec or {}):
            free.setdefault(dim, default_opt(axis))
    return free, {dim for _, axis, dim in dims if axis == 0}


def _scalars(model: onnx.ModelProto) -> list[str]:
    """Integer graph inputs of one element: rates, counts, flags."""
    inits = {t.name for t in model.graph.initializer}
    out = []
    for vi in model.graph.input:
        tt = vi.type.tensor_type
        if vi.name in inits or tt.elem_type not in _INTS or not tt.HasField("shape"):
            continue
        if all(d.HasField("dim_value") and d.dim_value == 1 for d in tt.shape.dim):
            out.append(vi.name)
    return out


def _values(scalars: list[str]) -> Iterator[dict[str, int]]:
    """Step 1's values, then step 2's (every scalar at each candidate in turn)."""
    first = {n: RATE_CANDIDATES[0] for n in scalars if n.lower() in RATE_NAMES}
    yield first
    for n in scalars:
        for v in (RATE_CANDIDATES if n.lower() in RATE_NAMES else COUNT_CANDIDATES):
            if first.get(n) != v:
                yield {**first, n: v}


def _sizes(free: dict[str, int], batch: set[str]) -> Iterator[dict[str, int]]:
    """Steps 3-5 over the free non-batch dims."""
    others = [d for d in free if d not in batch]
    for d, size in itertools.product(others, SIZE_CANDIDATES):
        if size != free[d]:
            yield {**free, d: size}
    if len(others) > 1:
        for size in SIZE_CANDIDATES:
            yield {**free, **dict.fromkeys(others, size)}
        for one, d in itertools.permutations(others, 2):  # a state's batch slot, a window
            for size in SIZE_CANDIDATES:
                yield {**free, one: 1, d: size}


def _trials(free: dict[str, int], batch: set[str], scalars: list[str]
            ) -> Iterator[tuple[dict[str, int], dict[str, int]]]:
    """(sizes, values) in the order of the module doc: the likeliest first."""
    values = list(_values(scalars))
    yield from ((free, v) for v in values)
    sizes = list(_sizes(free, batch))
    yield from ((s, values[0]) for s in sizes)
    yield from ((s, v) for v in values[1:] for s in sizes)


def _runs(session: OrtModel, model: onnx.ModelProto, sizes: dict[str, int],
          values: dict[str, int], given: dict[str, int]) -> bool:
    try:
        feed = sample_feeds(model, 1, dims={**given, **sizes}, values=values)[0]
        session.run(feed)
    except GraphoptError as e:
        logger.debug("fitting inputs: %s %s do not run: %s", sizes, values, e.problem)
        return False
    return True


def fit_inputs(session: OrtModel, graph: Graph, spec: Mapping[str, Any] | None,
               given: dict[str, int]) -> Fit:
    """The search (module doc) on ``graph``'s model; ``given`` holds the opt sizes of the dims
    the user sized. An empty Fit when the defaults run at opt and at the range's min."""
    model = graph.source_model
    (free, batch), scalars = _free_dims(graph, spec), _scalars(model)
    trials, deadline = 0, time.monotonic() + TIME_BUDGET_S
    for sizes, values in _trials(free, batch, scalars):
        if trials == MAX_TRIALS or (trials and time.monotonic() > deadline):
            break
        trials += 1
        if not _runs(session, model, sizes, values, given):
            continue
        moved = {d for d in free if sizes[d] != free[d]}
        low = {d: 1 for d in free}
        if free and not _runs(session, model, {**sizes, **low}, values, given):
            moved = set(free)  # the min end (1) does not run: fixed from below
        fit = Fit({d: (sizes[d], sizes[d], None) for d in moved}, values, trials)
        if moved or trials > 1:
            fit.note = (f"inputs fitted to the model after {trials} tr"
                        f"{'y' if trials == 1 else 'ies'}: "
                        + ", ".join([*(f"{d}={sizes[d]} (min {sizes[d]})" for d in moved),
                                     *(f"{n}={v}" for n, v in values.items())]))
        return fit
    return Fit(trials=trials, note=f"no made-up input ran the model in {trials} tries")


def fit_for(session: OrtModel, graph: Graph, spec: Any) -> Fit:
    """:func:`fit_inputs` with the user's sizes read from ``spec``; an empty Fit when ``spec``
    is not a dict of dim sizes (``onnx_range`` then says what is wrong with it)."""
    if spec is not None and not (isinstance(spec, Mapping) and all(isinstance(k, str)
                                                                   for k in spec)):
        return Fit()
    try:
        given = {k: parse_dim_spec(k, v).opt for k, v in (spec or {}).items()}
    except GraphoptError:
        return Fit()
    return fit_inputs(session, graph, spec, given)


def fit_from_feed(graph: Graph, spec: Any, feed: Mapping[str, Any]) -> Fit:
    """The free dims the user did not size, at the sizes ``feed`` (the first calibration batch
    or sample) has, fixed from below: planned where the data is, and never checked at a made-up
    end (min 1) the model may not run."""
    if spec is not None and not isinstance(spec, Mapping):
        return Fit()
    free, _ = _free_dims(graph, spec)
    sizes: dict[str, int] = {}
    for name, axis, dim in free_input_dims(graph):
        array = feed.get(name)
        if dim in free and array is not None and axis < np.ndim(array):
            sizes.setdefault(dim, int(np.shape(array)[axis]))
    return Fit({d: (n, n, None) for d, n in sizes.items() if n >= 1}, source="calibration")
