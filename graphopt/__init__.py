"""graphopt: a graph optimizer for ML models (trace -> analyze -> cost -> decide -> emit)."""

from __future__ import annotations

from graphopt.errors import GraphoptError

__version__ = "0.1.0"

__all__ = ["GraphoptError", "__version__"]
