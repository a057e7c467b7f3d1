"""The Python API: ``graphopt.plan(model, example_inputs, target=...)``."""

from __future__ import annotations

from typing import Any

from graphopt.frontends import load_graph
from graphopt.hardware import get_target
from graphopt.hardware.profile import HardwareProfile
from graphopt.plan import Plan
from graphopt.planner import build_plan

__all__ = ["plan"]


def plan(model: Any, example_inputs: Any = None,
         target: str | HardwareProfile = "h100") -> Plan:
    """Trace or load ``model`` and plan it for ``target``.

    Args:
        model: a ``torch.nn.Module`` (with ``example_inputs``), an ``.onnx`` path, an
            ``onnx.ModelProto``, or ``"file.py:function"`` returning ``(module, inputs)``.
        example_inputs: a tensor, tuple of tensors, or dict of keyword inputs (torch only).
        target: a target name (``graphopt targets`` lists them) or a ``HardwareProfile``.
    """
    profile = target if isinstance(target, HardwareProfile) else get_target(target)
    return build_plan(load_graph(model, example_inputs), profile)
