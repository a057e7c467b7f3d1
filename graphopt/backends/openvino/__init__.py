"""The OpenVINO artifact: graphopt's optimized ONNX model compiled by OpenVINO on the CPU
(:mod:`.runner`), with its compile config (:mod:`.config`). ``openvino`` is optional: imported
only when a model is compiled."""

from __future__ import annotations

from graphopt.backends.openvino.config import CompileConfig, compile_config_path
from graphopt.backends.openvino.runner import OpenVinoModel, load_openvino, openvino_module

__all__ = ["CompileConfig", "OpenVinoModel", "compile_config_path", "load_openvino",
           "openvino_module"]
