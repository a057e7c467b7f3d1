"""The memory and runtime family: what a model occupies on a target and how to run it there.

:mod:`.memory` (parameters, activation peak, workspace, reserve, max batch; from
:mod:`.footprint` and :mod:`.batch_advice`), :mod:`.runtime` (PyTorch runtime settings),
:mod:`.compile_mode` (the ``torch.compile`` mode) and :mod:`.ort_session` (the ONNX Runtime
session config). Entries: :func:`memory_plan`, :func:`runtime_settings`, :func:`compile_mode`,
:func:`decide_ort_session`.
"""

from __future__ import annotations

from graphopt.decisions.memory_runtime.compile_mode import compile_mode
from graphopt.decisions.memory_runtime.memory import MemoryPlan, memory_plan
from graphopt.decisions.memory_runtime.ort_session import SessionConfig, decide_ort_session
from graphopt.decisions.memory_runtime.runtime import RuntimeSettings, runtime_settings

__all__ = ["MemoryPlan", "RuntimeSettings", "SessionConfig", "compile_mode",
           "decide_ort_session", "memory_plan", "runtime_settings"]
