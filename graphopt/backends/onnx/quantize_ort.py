"""Thin calls into ``onnxruntime.quantization`` for the quantize passes (:mod:`.quantize`).

graphopt chooses the nodes; ONNX Runtime's own quantizers do the arithmetic, except dynamic
INT8 MatMuls, which :mod:`.int8_matmul` writes as ``quantize_dynamic`` would, without its
per-channel Python loop; :func:`ort_dynamic_int8` stays as the reference its tests and
``benchmarks/bench_quantize_call.py`` compare with. Each function
takes a model and the node names to quantize, works on a copy in a temporary folder (the
quantizers write files) and returns the quantized model. Facts about onnxruntime 1.31 they
rely on (checked on this project's CPU host):

* ``quantize_dynamic`` quantizes MatMul (DynamicQuantizeLinear -> MatMulInteger) and Conv
  (ConvInteger); its IntegerOps registry has no Gemm. Activations are always uint8.
* ``quantize_static`` with ``QuantType.QFLOAT8E4M3FN`` requires ``CalibrationMethod.Distribution``
  ("Only Distribution calibration method is supported for float quantization") and raises the
  model to opset 19. The CPU EP runs the FP8 Q/DQ nodes with graph optimizations up to
  ``ORT_ENABLE_BASIC``; at ``ENABLE_EXTENDED``/``ALL`` it fuses DQ->MatMul->Q into
  ``QLinearMatMul``, which has no float8 kernel, and the session fails to load.
* ``MatMulNBitsQuantizer(nodes_to_include=...)`` ADDS nodes to its default op types rather than
  restricting them, so the nodes not chosen are passed as ``nodes_to_exclude``.
* An empty ``nodes_to_quantize`` means "every node": callers never pass an empty list.
* ``quantize_static`` quantizes a Conv/Gemm bias to int32 only when it is an initializer
  ("Expected bias ... to be an initializer" otherwise), once per initializer. torch's
  TorchScript exporter shares one bias initializer between convs whose folded biases are equal,
  the first conv reading it and the others an ``Identity`` of it; those others keep a float
  bias and ORT's QDQ fusion leaves them as DequantizeLinear -> fp32 Conv -> QuantizeLinear
  (on ``examples/resnet_like.py``: 12 of 15 QDQ convs unfused, the model 1.2x faster than fp32
  instead of 1.9x, ``benchmarks/bench_conv_int8.py``). So :func:`ort_static_qdq` first gives
  each chosen node its weight and bias as initializers of its own (:func:`_own_constants`:
  exact, the same values).
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import onnx

from graphopt.files.quiet import library_quiet

__all__ = ["FP8_CPU_GRAPH_OPTIMIZATION", "INT4_BLOCK_SIZE", "ort_dynamic_int8", "ort_int4",
           "ort_static_qdq"]

logger = logging.getLogger(__name__)

#: the highest ORT graph optimization level at which the CPU EP loads an FP8 QDQ model
FP8_CPU_GRAPH_OPTIMIZATION = "ORT_ENABLE_BASIC"
#: MatMulNBits block: 32 weights share a scale (llama.cpp's Q4_0 block; ORT's builder default
#: for LLMs). Measured on random Gaussian weights: max error 9-11% of the output range with
#: 32, 12% with 128.
INT4_BLOCK_SIZE = 32
_LARGE = 1_800_000_000  # bytes: above this, protobuf's 2 GB limit needs external data


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def _large(model: onnx.ModelProto) -> bool:
    return sum(len(t.raw_data) for t in model.graph.initializer) > _LARGE


def _load(path: Path) -> onnx.ModelProto:
    return onnx.load(str(path), load_external_data=True)


def _reader(batches: list[dict[str, np.ndarray]], names: Iterable[str]) -> object:
    from onnxruntime.quantization import CalibrationDataReader

    wanted = set(names)

    class _Batches(CalibrationDataReader):
        def __init__(self) -> None:
            self._it = iter([{k: v for k, v in b.items() if k in wanted} for b in batches])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._it, None)

    return _Batches()


def _own_constants(model: onnx.ModelProto, nodes: Iterable[str]) -> onnx.ModelProto:
    """``model`` with each of ``nodes``' weight (input 1) read straight from its initializer
    rather than through an ``Identity``, and its bias (input 2) an initializer of its own where
    it came through an ``Identity`` or is shared with another node (module docstring)."""
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    via = {n.output[0]: n.input[0] for n in g.node
           if n.op_type == "Identity" and n.input and n.input[0] in inits}
    readers: dict[str, int] = {}
    for n in g.node:
        for i in n.input:
            readers[i] = readers.get(i, 0) + 1
    chosen = set(nodes)
    for n in g.node:
        if n.name not in chosen:
            continue
        if len(n.input) > 1 and n.input[1] in via:
            n.input[1] = via[n.input[1]]
        if len(n.input) > 2 and n.input[2] and (n.input[2] in via or readers[n.input[2]] > 1):
            src = inits.get(via.get(n.input[2], n.input[2]))
            if src is None:
                continue
            own = onnx.TensorProto()
            own.CopyFrom(src)
            own.name = f"{src.name}__graphopt_{n.name}"
            g.initializer.append(own)
            n.input[2] = own.name
    read = {i for n in g.node for i in n.input} | {o.name for o in g.output}
    subgraphs = any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                    for n in g.node for a in n.attribute)
    if not subgraphs and any(o not in read for o in via):  # the Identities nothing reads
        kept = [n for n in g.node if not (n.op_type == "Identity" and n.output[0] in via
                                          and n.output[0] not in read)]
        del g.node[:]
        g.node.extend(kept)
    return model


#: an initializer at least this large that no quantized node reads is set aside during the
#: dynamic quantizer (:func:`_set_aside`)
_ASIDE_BYTES = 1 << 20


def _set_aside(model: onnx.ModelProto, nodes: Iterable[str]
               ) -> tuple[onnx.ModelProto, dict[str, onnx.TensorProto]]:
    """A copy of ``model`` whose large initializers that none of ``nodes`` reads are graph
    inputs of the same type and shape, and those initializers by name. Why: ORT's dynamic
    quantizer saves and reloads the whole model with shape inference (twice) and copies it;
    on GPT-2 4L the 154 MB token embedding, which it never quantizes, made each call 3-8 s.
    Its shape as an input is all the quantizer needs; :func:`_put_back` restores the data."""
    out = _copy(model)
    g = out.graph
    chosen = set(nodes)
    read = {i for n in g.node if n.name in chosen for i in n.input}
    inputs = {i.name for i in g.input}
    aside = {t.name: t for t in g.initializer if t.name not in read and t.name not in inputs
             and not t.external_data and len(t.raw_data) >= _ASIDE_BYTES}
    if aside:
        kept = [t for t in g.initializer if t.name not in aside]
        del g.initializer[:]
        g.initializer.extend(kept)
        g.input.extend(onnx.helper.make_tensor_value_info(name, t.data_type, list(t.dims))
                       for name, t in aside.items())
    return out, aside


def _put_back(model: onnx.ModelProto, aside: dict[str, onnx.TensorProto]) -> onnx.ModelProto:
    """``model`` with the initializers :func:`_set_aside` took out back in place of their
    stand-in inputs (the same bytes)."""
    if aside:
        g = model.graph
        kept = [i for i in g.input if i.name not in aside]
        del g.input[:]
        g.input.extend(kept)
        g.initializer.extend(aside.values())
    return model


def ort_dynamic_int8(model: onnx.ModelProto, nodes: list[str], *, reduce_range: bool
                     ) -> onnx.ModelProto:
    """Dynamic INT8 MatMuls: weights int8 per channel, activations uint8 per call."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    assert nodes, "an empty node list would quantize every node"
    light, aside = _set_aside(model, nodes)
    with tempfile.TemporaryDirectory(prefix="graphopt-q-") as d:
        path = Path(d) / "dynamic.onnx"
        with library_quiet(stderr=False):  # its "consider pre-processing" log, twice
            quantize_dynamic(light, path, op_types_to_quantize=["MatMul"],
                             nodes_to_quantize=list(nodes), per_channel=True,
                             reduce_range=reduce_range, weight_type=QuantType.QInt8,
                             use_external_data_format=_large(light),
                             extra_options={"MatMulConstBOnly": True})
        return _put_back(_load(path), aside)


def ort_static_qdq(model: onnx.ModelProto, nodes: list[str], op_types: list[str],
                   calibration: list[dict[str, np.ndarray]], fmt: str, *, symmetric: bool,
                   reduce_range: bool = False) -> onnx.ModelProto:
    """Static QDQ of ``nodes``: ``fmt`` "int8" (activations uint8, or int8 if ``symmetric``;
    weights int8 per channel) or "fp8" (float8e4m3fn, per tensor)."""
    from onnxruntime.quantization import (
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    assert nodes, "an empty node list would quantize every node"
    inputs = [i.name for i in model.graph.input
              if i.name not in {t.name for t in model.graph.initializer}]
    src = _own_constants(_copy(model), nodes)
    if fmt == "fp8":
        act = weight = QuantType.QFLOAT8E4M3FN
        method, per_channel = CalibrationMethod.Distribution, False
        opset = next((o.version for o in src.opset_import if o.domain in ("", "ai.onnx")), 0)
        if opset < 19:  # float8 Q/DQ needs opset 19; convert instead of relabelling
            from onnx import version_converter
            src = version_converter.convert_version(src, 19)
    else:
        act = QuantType.QInt8 if symmetric else QuantType.QUInt8
        weight, method, per_channel = QuantType.QInt8, CalibrationMethod.MinMax, True
    with tempfile.TemporaryDirectory(prefix="graphopt-q-") as d:
        path = Path(d) / "static.onnx"
        with library_quiet(stderr=False):  # its "consider pre-processing" log, twice
            quantize_static(src, path, _reader(calibration, inputs),
                            quant_format=QuantFormat.QDQ,
                            op_types_to_quantize=op_types, per_channel=per_channel,
                            reduce_range=reduce_range, activation_type=act, weight_type=weight,
                            nodes_to_quantize=list(nodes), calibrate_method=method,
                            use_external_data_format=_large(model),
                            extra_options={"ActivationSymmetric": symmetric,
                                           "WeightSymmetric": True})
        return _load(path)


def ort_int4(model: onnx.ModelProto, nodes: list[str]) -> onnx.ModelProto:
    """4-bit weight-only MatMulNBits (com.microsoft): symmetric RTN, blocks of
    ``INT4_BLOCK_SIZE`` along K; the matmul dequantizes to the activation dtype."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    assert nodes, "an empty node list would quantize every node"
    chosen = set(nodes)
    others = [n.name for n in model.graph.node if n.op_type == "MatMul" and n.name not in chosen]
    q = MatMulNBitsQuantizer(_copy(model), bits=4, block_size=INT4_BLOCK_SIZE,
                             is_symmetric=True, nodes_to_exclude=others)
    with library_quiet(stderr=False):
        q.process()
    return q.model.model
