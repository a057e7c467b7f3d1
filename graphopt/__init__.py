"""graphopt: a graph optimizer for ML models (trace -> analyze -> cost -> decide -> emit)."""

from __future__ import annotations

__version__ = "0.1.0"

from graphopt.api import plan  # noqa: E402
from graphopt.errors import GraphoptError  # noqa: E402
from graphopt.plan import Decision, NodePlan, Plan  # noqa: E402

__all__ = ["Decision", "GraphoptError", "NodePlan", "Plan", "__version__", "plan"]
