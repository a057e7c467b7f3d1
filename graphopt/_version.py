"""The package version, in one place: the package root, the plan report and pyproject read it.

A module with no imports, so ``plan.py`` can read the version without importing the package
root (which imports the planner, which imports ``plan.py``).
"""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
