"""Running ONNX models in ONNX Runtime for the passes and the guard: sessions, sample inputs,
tensor types, extra outputs, and fp16 made explicit.

fp16 on ORT's CPU EP (measured, ORT 1.31): only a few ops have fp16 kernels; for the others
ORT inserts casts to fp32 and then drops the fp32->fp16->fp32 pairs around them, so a fp16
MatMul whose result exceeds 65504 returns the exact fp32 value instead of inf, and an fp16
graph measures like fp32. The guard would never see fp16 overflow. :func:`emulate_fp16`
therefore measures a fp16 model as an fp32 model in which every tensor the model holds in fp16
is rounded by an explicit ``Cast(fp16) -> Cast(fp32)`` pair, which ORT keeps: each op computes
in fp32 and rounds its result to fp16, as GPU fp16 kernels with fp32 accumulation do.

Sessions are built from the graph's bytes with the large weights handed over in memory
(:mod:`graphopt.files.ort_load`); a model past protobuf's 2 GB limit is written with external
data to a temporary folder first (``_PROTO_LIMIT``). Every ORT failure becomes a GraphoptError
that names the op ORT could not run.
"""

from __future__ import annotations

import logging
import math
import re
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.shape_inference
from onnx import numpy_helper

from graphopt.errors import GraphoptError
from graphopt.files.ort_load import in_memory_session, tensor_nbytes
from graphopt.ir.order import stable_topo_order

__all__ = ["OrtModel", "emulate_fp16", "float_tensors", "quiet_options", "sample_feeds",
           "outer_inputs", "tensor_types", "topological", "with_outputs"]

logger = logging.getLogger(__name__)

_T = onnx.TensorProto
#: serialize through a file above this size (protobuf refuses messages over 2 GiB)
_PROTO_LIMIT = 1_800_000_000
#: shape inference sees initializers up to this many elements (shape-like values); bigger ones
#: become typed graph inputs, so weights are never serialized for inference
_SKELETON_MAX = 256
#: symbolic dims of generated sample inputs (batch, sequence) get this size
_DEFAULT_DIM = 2
_FLOATS = (_T.FLOAT, _T.FLOAT16, _T.BFLOAT16, _T.DOUBLE)


def _nbytes(model: onnx.ModelProto) -> int:
    """The initializers' bytes, from their dims (``tensor_nbytes``: reading ``raw_data`` copied
    it, 0.1 s for GPT-2's token embedding on every session)."""
    return sum(tensor_nbytes(t) for t in model.graph.initializer)


class OrtModel:
    """An ``onnxruntime.InferenceSession`` of a ModelProto, with a GraphoptError on failure."""

    def __init__(self, model: onnx.ModelProto, providers: Sequence[Any] | None = None,
                 what: str = "the model", options: Any = None) -> None:
        import onnxruntime as ort

        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        provs = list(providers or ["CPUExecutionProvider"])
        try:
            if _nbytes(model) > _PROTO_LIMIT:
                self._tmp = tempfile.TemporaryDirectory()
                path = Path(self._tmp.name) / "model.onnx"
                onnx.save_model(model, str(path), save_as_external_data=True,
                                location="model.data")
                self.session = ort.InferenceSession(str(path), options, providers=provs)
            else:  # the weights in memory, not serialized (ort_load)
                self.session = in_memory_session(model, options, provs)
        except Exception as e:  # ORT raises Fail/InvalidGraph/NotImplemented...: one message
            raise GraphoptError(f"ONNX Runtime cannot load {what}: {_ort_message(e)}",
                                _ort_fix(e)) from None
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.what = what

    def run(self, feeds: dict[str, np.ndarray], outputs: Sequence[str] | None = None
            ) -> list[np.ndarray]:
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise GraphoptError(f"no value for input(s) {', '.join(missing)} of {self.what}",
                                "give calibration/sample data with one array per model input")
        try:
            return self.session.run(list(outputs) if outputs else None,
                                    {n: feeds[n] for n in self.input_names})
        except Exception as e:
            raise GraphoptError(f"ONNX Runtime failed running {self.what}: {_ort_message(e)}",
                                _ort_fix(e)) from None


def quiet_options() -> Any:
    """Session options that keep ORT's own error log off stderr: a failed run is a
    GraphoptError that says the same (the input search tries runs that may fail)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4  # fatal only
    return options


def _ort_message(e: Exception) -> str:
    text = " ".join(str(e).split())
    return text[:400]


def _ort_fix(e: Exception) -> str:
    m = re.search(r"implementation for (\w+)\((\d+)\)", str(e))
    if m:
        return (f"ONNX Runtime has no kernel for {m.group(1)} (opset {m.group(2)}) on this "
                "machine's execution providers: replace that op, or export with another "
                "opset")
    return ("check the model with onnx.checker.check_model(path, full_check=True) and run it "
            "in onnxruntime.InferenceSession once; graphopt needs a model ORT can run")


def outer_inputs(node: onnx.NodeProto) -> set[str]:
    """The values ``node``'s subgraphs (``If``/``Loop``/``Scan`` bodies, recursively) read
    from the enclosing graph: inputs of the node as much as its listed ones."""
    names: set[str] = set()
    for a in node.attribute:
        for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else
                  list(a.graphs) if a.type == onnx.AttributeProto.GRAPHS else []):
            inner = {i.name for i in g.input} | {t.name for t in g.initializer} | \
                {o for n in g.node for o in n.output}
            for n in g.node:
                names |= {t for t in (*n.input, *outer_inputs(n)) if t and t not in inner}
            names |= {o.name for o in g.output if o.name not in inner}
    return names


def topological(nodes: list[onnx.NodeProto], available: set[str]) -> list[onnx.NodeProto]:
    """Nodes in a valid order, as close to the given one as possible (Kahn, stable), a
    control-flow node after every value its subgraphs read; the given order where a cycle
    leaves some out."""
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    reads = [[*n.input, *outer_inputs(n)] for n in nodes]
    if all(producer.get(t, -1) < i for i, names in enumerate(reads) for t in names if t):
        return list(nodes)
    order = stable_topo_order([{producer[t] for t in names if t in producer
                                and t not in available} for names in reads])
    return [nodes[i] for i in order] if len(order) == len(nodes) else list(nodes)


def _skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """The graph with big initializers turned into typed inputs: shape inference needs no
    weight values (and never serializes GBs of them)."""
    skel = onnx.ModelProto(ir_version=model.ir_version)
    skel.opset_import.extend(model.opset_import)
    skel.functions.extend(model.functions)
    g, src = skel.graph, model.graph
    g.name = src.name
    g.node.extend(src.node)
    g.input.extend(src.input)
    g.output.extend(src.output)
    g.value_info.extend(src.value_info)
    listed = {i.name for i in src.input}
    for t in src.initializer:
        if math.prod(t.dims) <= _SKELETON_MAX and t.data_location != _T.EXTERNAL:
            g.initializer.append(t)
        elif t.name not in listed:
            g.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, t.dims))
    return skel


def tensor_types(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """Name -> ValueInfoProto (dtype and shape) of every tensor ONNX shape inference can type:
    graph inputs, initializers, node outputs and graph outputs."""
    try:
        inferred = onnx.shape_inference.infer_shapes(_skeleton(model), check_type=False,
                                                     strict_mode=False, data_prop=True)
        graph = inferred.graph
    except Exception as e:  # keep what the model states
        logger.debug("shape inference failed: %s", e)
        graph = model.graph
    types = {vi.name: vi for grp in (graph.input, graph.value_info, graph.output)
             for vi in grp if vi.type.HasField("tensor_type")}
    for t in model.graph.initializer:
        types.setdefault(t.name, onnx.helper.make_tensor_value_info(t.name, t.data_type, t.dims))
    return types


def float_tensors(model: onnx.ModelProto, types: dict[str, onnx.ValueInfoProto]) -> list[str]:
    """Float outputs of the model's nodes (Constant nodes excluded), in graph order."""
    out = []
    for node in model.graph.node:
        if node.op_type == "Constant":
            continue
        for name in node.output:
            vi = types.get(name)
            if name and vi is not None and vi.type.tensor_type.elem_type in _FLOATS:
                out.append(name)
    return out


def with_outputs(model: onnx.ModelProto, names: Sequence[str],
                 types: dict[str, onnx.ValueInfoProto]) -> onnx.ModelProto:
    """A copy of ``model`` that also returns the tensors ``names`` (typed from ``types``)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    have = {o.name for o in out.graph.output}
    for n in names:
        if n not in have and n in types:
            out.graph.output.append(types[n])
            have.add(n)
    return out


def _dims(vi: onnx.ValueInfoProto, sizes: dict[str, int] | None = None) -> list[int]:
    shape = vi.type.tensor_type.shape
    sizes = sizes or {}
    # a static 0 is a real size (ONNX Runtime insists on it); only symbolic dims get sizes
    # (-1 is one, as older exporters write it): by dim_param name, by "<input>_<axis>" for an
    # unnamed one, else the default
    return [d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else
            sizes.get(d.dim_param, sizes.get(f"{vi.name}_{i}", _DEFAULT_DIM))
            for i, d in enumerate(shape.dim)]


def emulate_fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    """The fp32 model that rounds every fp16 tensor of ``model`` explicitly (module doc);
    ``model`` itself when it holds no fp16 tensor. Inputs and outputs keep their types."""
    types = tensor_types(model)
    half = {n for n, vi in types.items() if vi.type.tensor_type.elem_type == _T.FLOAT16}
    if not half:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    for t in g.initializer:
        if t.data_type == _T.FLOAT16:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32),
                                               t.name))
    outputs = {o.name for o in g.output}
    nodes: list[onnx.NodeProto] = []
    renamed: dict[str, str] = {}

    def rounding(acc: str, o: str) -> None:
        mid = f"{o}__graphopt_fp16"
        if o not in outputs:
            nodes.append(onnx.helper.make_node("Cast", [acc], [mid], to=_T.FLOAT16))
            nodes.append(onnx.helper.make_node("Cast", [mid], [o], to=_T.FLOAT))
            return
        # a graph output typed fp16 stays fp16; later readers get the rounded fp32 copy
        wide = f"{o}__graphopt_fp32"
        nodes.append(onnx.helper.make_node("Cast", [acc], [o], to=_T.FLOAT16))
        nodes.append(onnx.helper.make_node("Cast", [o], [wide], to=_T.FLOAT))
        renamed[o] = wide

    for vi in g.input:
        if vi.name in half:  # fp16 graph inputs: widen once, exact
            wide = f"{vi.name}__graphopt_fp32"
            nodes.append(onnx.helper.make_node("Cast", [vi.name], [wide], to=_T.FLOAT))
            renamed[vi.name] = wide
    for node in model.graph.node:
        n = onnx.NodeProto()
        n.CopyFrom(node)
        n.input[:] = [renamed.get(t, t) for t in n.input]
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == _T.FLOAT16:
                a.t.CopyFrom(numpy_helper.from_array(
                    numpy_helper.to_array(a.t).astype(np.float32), a.t.name))
            elif a.name in ("to", "dtype") and a.i == _T.FLOAT16:
                a.i = _T.FLOAT
        late = []
        for j, o in enumerate(n.output):
            if o in half:
                acc = f"{o}__graphopt_acc"
                n.output[j] = acc
                late.append((acc, o))
        nodes.append(n)
        for acc, o in late:
            rounding(acc, o)
    del g.node[:]
    g.node.extend(nodes)
    del g.value_info[:]
    return out


def sample_feeds(model: onnx.ModelProto, count: int = 1, seed: int = 0,
                 dims: dict[str, int] | None = None, values: Mapping[str, int] | None = None
                 ) -> list[dict[str, np.ndarray]]:
    """Seeded inputs for the model's graph inputs: standard normal floats, zeros and ones for
    integers (token ids and masks stay in range), true for bools, ``values[name]`` everywhere
    in the inputs it names (a sample rate: :mod:`.fitting`); symbolic dims at ``dims``
    (name -> size: the plan's opt sizes), else 2.

    Their size is checked before anything is allocated (``SAMPLE_BYTES_LIMIT``), and each is
    made in its own dtype, a chunk of random numbers at a time (the values are those one draw
    of the whole array gives). Real data (``--calibration``) is better: the guard can only
    catch what the inputs trigger.
    """
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    wanted = [(vi, *_sample_type(vi), _dims(vi, dims)) for vi in model.graph.input
              if vi.name not in inits]
    _check_sample_bytes(wanted, count)
    feeds: list[dict[str, np.ndarray]] = []
    for _ in range(count):
        feed: dict[str, np.ndarray] = {}
        for vi, elem, dtype, shape in wanted:
            if values and vi.name in values:
                feed[vi.name] = np.full(shape, values[vi.name], dtype=dtype)
            elif elem == _T.BOOL:
                feed[vi.name] = np.ones(shape, dtype=bool)
            elif elem in _FLOATS:
                feed[vi.name] = _chunked(shape, dtype, rng.standard_normal)
            else:
                feed[vi.name] = _chunked(shape, dtype, lambda n: rng.integers(0, 2, size=n))
        feeds.append(feed)
    return feeds


#: all generated sample inputs together (``count`` feeds) hold at most this many bytes. Real
#: inputs are far smaller (8 images of 224x224x3 in fp32: 4.8 MB; 8 x 4096 token ids: 256 KB),
#: ONNX Runtime needs a multiple of an input's size again for the activations, and the checks at
#: the range's ends add more (``shape_range.CHECK_MAX_ELEMENTS``); an input past this is a typo'd
#: or far too large opt size (seq=1000000000: 477 GiB as float64), refused before allocating
SAMPLE_BYTES_LIMIT = 1 << 30
#: random numbers are drawn (as float64/int64) this many at a time, then cast into the input
_CHUNK = 1 << 20


def _sample_type(vi: onnx.ValueInfoProto) -> tuple[int, np.dtype]:
    elem = vi.type.tensor_type.elem_type
    try:
        return elem, np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem))
    except (KeyError, TypeError, ValueError):
        raise GraphoptError(f"input {vi.name!r} has element type {elem}, which graphopt cannot "
                            "make sample values for",
                            "pass real inputs: calibration=[{input: array}] in the API, or "
                            "--calibration inputs.npz on the CLI") from None


def _check_sample_bytes(wanted: list[tuple[Any, int, np.dtype, list[int]]], count: int) -> None:
    """GraphoptError naming the largest input when the samples would pass the limit."""
    sizes = []
    for vi, _, dtype, shape in wanted:
        sizes.append((math.prod(shape) * dtype.itemsize, vi, dtype, shape))
    total = count * sum(b for b, *_ in sizes)
    if total <= SAMPLE_BYTES_LIMIT:
        return
    nbytes, vi, dtype, shape = max(sizes, key=lambda x: x[0])
    symbolic = [d.dim_param or f"{vi.name}_{i}" for i, d in
                enumerate(vi.type.tensor_type.shape.dim) if not d.HasField("dim_value")]
    fix = (f"give a smaller opt size for {', '.join(symbolic)} (e.g. --dynamic "
           f"{symbolic[0]}=1:64:1024 on the CLI, dynamic_shapes={{{symbolic[0]!r}: (1, 64, "
           "1024)} in the API): the max is costed by the plan, not allocated" if symbolic else
           "pass real inputs: calibration=[{input: array}] in the API, or --calibration "
           "inputs.npz on the CLI")
    raise GraphoptError(
        f"the sample inputs graphopt would generate take {_gib(total)} ({count} batch(es)), "
        f"over the {_gib(SAMPLE_BYTES_LIMIT)} limit: input {vi.name!r} has shape "
        f"{tuple(shape)} ({dtype.name}, {nbytes:,} bytes per batch)", fix)


def _gib(n: int) -> str:
    return f"{n / 2**30:.3g} GiB"


def _chunked(shape: list[int], dtype: np.dtype, draw: Any) -> np.ndarray:
    """An array of ``shape`` in ``dtype`` filled by ``draw(n)`` a chunk at a time (even
    chunks: the values equal one ``draw`` of the whole array)."""
    out = np.empty(shape, dtype=dtype)
    flat = out.reshape(-1)
    for start in range(0, flat.size, _CHUNK):
        stop = min(start + _CHUNK, flat.size)
        np.copyto(flat[start:stop], draw(stop - start), casting="unsafe")  # as astype does
    return out
