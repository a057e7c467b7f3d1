"""OpenVINO runs graphopt's optimized ONNX model on this machine's CPU: the same decisions as the
ONNX Runtime artifact, compiled by OpenVINO at the inference precision of its compile config.

``openvino`` is optional (``pip install openvino``, or ``graphopt[cpu]``) and heavy, so it is
imported only here, when a model is compiled: without it every other artifact still works, and
:func:`openvino_module` says how to get it. Every OpenVINO failure (reading, compiling, running)
becomes a GraphoptError that names what failed.

:class:`OpenVinoModel` is shaped like an ``onnxruntime.InferenceSession`` (``get_inputs()``,
``run(output_names, feeds)`` on numpy arrays), so the deploy code feeds and times both alike.
"""

from __future__ import annotations

import functools
import logging
import os
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import onnx

from graphopt.backends.onnx.save import PROTO_LIMIT
from graphopt.backends.onnx.session import host_cpus
from graphopt.backends.openvino.config import (
    CompileConfig,
    compile_config_path,
    read_compile_config,
)
from graphopt.errors import GraphoptError
from graphopt.files.read import check_regular

__all__ = ["INSTALL", "OpenVinoModel", "cpu_capabilities", "load_openvino", "openvino_module",
           "openvino_version"]

logger = logging.getLogger(__name__)

#: how to get the runtime (the ``cpu`` extra pins the same package)
INSTALL = "pip install openvino (or graphopt[cpu])"
#: OpenVINO's names of the precisions it reports (``INFERENCE_PRECISION_HINT``) -> its hints
_TYPE_NAMES = {"f32": "f32", "float32": "f32", "bf16": "bf16", "bfloat16": "bf16"}


def openvino_module() -> Any:
    """The ``openvino`` package; GraphoptError naming the fix when it cannot be imported."""
    try:
        import openvino
    except ModuleNotFoundError as e:
        if (e.name or "openvino").split(".")[0] != "openvino":  # one of its own dependencies
            raise GraphoptError(f"openvino cannot be imported: {e}", INSTALL) from None
        raise GraphoptError(f"openvino is not installed: {INSTALL}", INSTALL) from None
    except (ImportError, OSError) as e:  # a broken install: a missing shared library
        raise GraphoptError(f"openvino cannot be imported: {' '.join(str(e).split())[:200]}",
                            f"reinstall it: {INSTALL}") from None
    return openvino


def openvino_version() -> str:
    return str(openvino_module().__version__).split("-")[0]


def _core() -> Any:
    """One ``openvino.Core`` per process (it holds the plugins; compiling is thread-safe),
    behind the import check: a runtime that became unimportable is refused, never reused."""
    openvino_module()
    return _cached_core()


@functools.cache
def _cached_core() -> Any:
    return openvino_module().Core()


def cpu_capabilities() -> tuple[str, ...]:
    """OpenVINO's ``OPTIMIZATION_CAPABILITIES`` of this CPU (``BF16`` only where native)."""
    return tuple(str(c) for c in _core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))


class _Input(NamedTuple):
    """What ``onnxruntime.InferenceSession.get_inputs()`` gives, as far as feeding needs."""

    name: str


class OpenVinoModel:
    """An ONNX model (a ModelProto, or a path with its external data beside it) compiled by
    OpenVINO on the CPU with ``config``; ``precision``: the one the compiled model reports.
    Calls are serialized on one infer request (thread-safe, not concurrent)."""

    def __init__(self, model: onnx.ModelProto | str | os.PathLike[str], config: CompileConfig,
                 what: str = "the optimized ONNX model") -> None:
        core = _core()
        self.config, self.what = config, what
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        try:
            if not isinstance(model, onnx.ModelProto):
                read = core.read_model(os.fspath(model))
            elif model.ByteSize() < PROTO_LIMIT:
                read = core.read_model(model.SerializeToString())
            else:  # protobuf's 2 GiB limit: through a file with external data, kept alive
                self._tmp = tempfile.TemporaryDirectory()
                path = Path(self._tmp.name) / "model.onnx"
                onnx.save_model(model, str(path), save_as_external_data=True,
                                location="model.onnx.data")
                read = core.read_model(str(path))
            self.compiled = core.compile_model(read, "CPU", _properties(config, what))
        except GraphoptError:
            raise
        except Exception as e:  # OpenVINO raises RuntimeError for all of it: one message
            raise GraphoptError(f"OpenVINO cannot compile {what}: {_message(e)}",
                                "check that OpenVINO's ONNX frontend supports every op of the "
                                "model (the message names the first it cannot read), or deploy "
                                "another artifact") from None
        hint = self.compiled.get_property("INFERENCE_PRECISION_HINT")
        name = hint.get_type_name() if hasattr(hint, "get_type_name") else str(hint)
        self.precision = _TYPE_NAMES.get(name, name)
        self.input_names = [p.get_any_name() for p in self.compiled.inputs]
        self.output_names = [p.get_any_name() for p in self.compiled.outputs]
        self._request = self.compiled.create_infer_request()
        self._lock = threading.Lock()

    def get_inputs(self) -> list[_Input]:
        return [_Input(n) for n in self.input_names]

    def run(self, output_names: Sequence[str] | None, feeds: dict[str, np.ndarray]
            ) -> list[np.ndarray]:
        """The outputs named (None: all, in the model's order) for ``feeds`` {input: array},
        as ``onnxruntime.InferenceSession.run`` returns them (copies: the next call keeps
        them)."""
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise GraphoptError(f"no value for input(s) {', '.join(missing)} of {self.what}",
                                f"pass one array per input: {', '.join(self.input_names)}")
        wanted = list(range(len(self.output_names))) if output_names is None else \
            [self._output_index(n) for n in output_names]
        with self._lock:
            try:
                for i, name in enumerate(self.input_names):
                    self._feed(i, name, np.asarray(feeds[name]))
                self._request.infer()
                return [self._request.get_output_tensor(i).data.copy() for i in wanted]
            except GraphoptError:
                raise
            except Exception as e:
                raise GraphoptError(f"OpenVINO failed running {self.what}: {_message(e)}",
                                    "pass the inputs the model was optimized with (their "
                                    "dtypes and shapes)") from None

    def _feed(self, index: int, name: str, array: np.ndarray) -> None:
        """Copy ``array`` into the request's own input tensor (resized for a dynamic input):
        a copy of the input costs less than wrapping it in a new tensor each call (measured:
        2 us against 7-15 us of Python per input)."""
        tensor = self._request.get_input_tensor(index)
        held = tensor.data  # numpy's view of it (its shape reads 50x faster than ov.Shape's)
        if array.dtype != held.dtype:
            raise GraphoptError(f"input {name!r} of {self.what} is {held.dtype}, a "
                                f"{array.dtype} array was given",
                                f"pass it as {held.dtype} (array.astype(numpy.{held.dtype}))")
        if held.shape != array.shape:
            tensor.shape = list(array.shape)
            held = tensor.data
        held[...] = array

    def _output_index(self, name: str) -> int:
        for i, port in enumerate(self.compiled.outputs):
            if name in port.get_names():
                return i
        raise GraphoptError(f"{self.what} has no output {name!r}",
                            f"ask for one of: {', '.join(self.output_names)}, or None for all")


def _properties(config: CompileConfig, what: str) -> dict[str, Any]:
    """``compile_model``'s properties: the config's precision, latency mode (one request at a
    time, as the other artifacts run), and its thread count lowered to this machine's CPUs."""
    props: dict[str, Any] = {"INFERENCE_PRECISION_HINT": config.inference_precision,
                             "PERFORMANCE_HINT": "LATENCY"}
    if config.num_threads:
        cpus = host_cpus()
        if config.num_threads > cpus:
            logger.warning("%s: num_threads %d is more than this machine's %d CPUs; using %d",
                           what, config.num_threads, cpus, cpus)
        props["INFERENCE_NUM_THREADS"] = min(config.num_threads, cpus)
    return props


def _message(e: Exception) -> str:
    return " ".join(str(e).split())[:400]


def load_openvino(model_path: Path) -> OpenVinoModel:
    """A deploy folder's ONNX model compiled with its compile config (``model.openvino.json``
    beside it). A folder checked at bf16, loaded on a CPU without native bf16, runs f32 (more
    accurate; OpenVINO's own fallback), and a warning says so."""
    check_regular(model_path, f"the model file {model_path}", "give the deploy folder graphopt "
                  "wrote", missing=f"model file {model_path} does not exist")
    config = read_compile_config(compile_config_path(model_path))
    model = OpenVinoModel(model_path, config, f"the OpenVINO model {model_path}")
    if model.precision != config.inference_precision:
        logger.warning("%s was checked at %s inference precision; OpenVINO runs it at %s on "
                       "this CPU", model_path, config.inference_precision, model.precision)
    return model
