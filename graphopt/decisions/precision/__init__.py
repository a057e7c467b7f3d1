"""The precision family: each node's compute format on a target, and the model's.

:mod:`.gemm` decides per node (its cases are numbered there), asking :mod:`.gpu_formats` for a
weight GEMM's low-bit format on a GPU and :mod:`graphopt.decisions.quantization.cpu_int8` for
INT8 on a CPU; :mod:`.format` is the model-level compute format, :mod:`.by_op` and
:mod:`.islands` keep ops fp32 under a reduced compute dtype, :mod:`.roles` is the rule table both
backends apply, :mod:`.cost` re-costs a node at another format. Entry: :func:`plan_precisions`.
"""

from __future__ import annotations

from graphopt.decisions.precision.format import choose_precision
from graphopt.decisions.precision.gemm import node_precision, plan_precisions

__all__ = ["choose_precision", "node_precision", "plan_precisions"]
