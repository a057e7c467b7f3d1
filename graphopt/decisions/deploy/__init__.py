"""The deploy family: which of graphopt's artifacts to deploy (:mod:`.artifact`), and how sure a
measured speedup is (:mod:`.confidence`). Entries: :func:`predict_deploy`,
:func:`pick_measured`.
"""

from __future__ import annotations

from graphopt.decisions.deploy.artifact import DeployChoice, pick_measured, predict_deploy

__all__ = ["DeployChoice", "pick_measured", "predict_deploy"]
