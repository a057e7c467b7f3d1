"""Test-wide settings.

``target="cpu"`` plans with this machine's cached calibration (``graphopt.measure.host_cache``),
made on first use in about 10 s and different on every machine. The suite plans ``cpu`` in many
places and must stay fast and deterministic, so it runs with the uncalibrated host:
``GRAPHOPT_NO_CALIBRATE=1``, set before collection (some test modules plan at import) and
inherited by the subprocesses tests start. The cache's own tests (``tests/test_host_cache.py``)
turn it back on, with their cache folder in ``tmp_path``.

For the same reason the deploy choice is predicted, not measured (``GRAPHOPT_NO_DEPLOY_MEASURE``):
measuring compiles the module with ``torch.compile`` and exports it to ONNX, tens of seconds on
every ``cpu`` optimize. ``tests/test_deploy.py`` turns it back on where it measures.
"""

from __future__ import annotations

import os

import pytest

from graphopt.api.deploy import NO_DEPLOY_MEASURE_ENV
from graphopt.measure.host_cache import NO_CALIBRATE_ENV


def pytest_configure(config: pytest.Config) -> None:
    os.environ[NO_CALIBRATE_ENV] = "1"
    os.environ[NO_DEPLOY_MEASURE_ENV] = "1"
