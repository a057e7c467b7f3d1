"""The kernels family: each node's execution path (MMA engine, data mover) and kernel
configuration (tile, stages, launch), from what the hardware's instructions allow
(:mod:`.tiles`). Entry: :func:`exec_path`.
"""

from __future__ import annotations

from graphopt.decisions.kernels.exec_path import exec_path

__all__ = ["exec_path"]
