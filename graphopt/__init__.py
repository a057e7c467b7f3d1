"""graphopt: a graph optimizer for ML models (trace -> analyze -> cost -> decide -> emit)."""

from __future__ import annotations

from graphopt._version import __version__
from graphopt.api import compile_plans as _compile_plans
from graphopt.api.compile_plans import last_plan
from graphopt.api.planning import plan
from graphopt.errors import GraphoptError
from graphopt.hardware.profile import HardwareProfile
from graphopt.ir.plan import Decision, NodePlan, Plan, PlanSet

__all__ = ["Decision", "GraphoptError", "HardwareProfile", "NodePlan", "Optimized", "Plan",
           "PlanSet", "__version__", "calibrate", "last_plan", "load", "optimize", "ort_session",
           "plan", "plan_llm", "profile"]

# torch.compile(backend="graphopt"): named in dynamo's registry if torch loaded it already (a
# dict entry, no import); otherwise torch finds the backend through its entry point
_compile_plans.register_dynamo_backend()

_LAZY = ("Optimized", "calibrate", "load", "optimize", "ort_session", "plan_llm", "profile")


def __dir__() -> list[str]:
    """The module's names with the lazily imported ones (``dir``, tab completion, help)."""
    return sorted({*globals(), *_LAZY})


# Lazy on purpose (tests/test_inner_imports.py counts these imports): the modules behind these
# names import no torch at load, but loading all six with graphopt made `import graphopt` about
# 20 % slower on the development VM (0.80-1.02 s against 1.00-1.14 s).
def __getattr__(name: str):
    # optimize needs torch; importing it lazily keeps `graphopt targets` and ONNX planning fast
    if name in ("optimize", "Optimized"):
        from graphopt.api import optimized

        return getattr(optimized, name)
    if name == "load":  # torch is imported only when a saved module is loaded
        from graphopt.api.deploy_folder import load

        return load
    if name == "plan_llm":  # traces with torch: imported when asked for
        from graphopt.api.llm import plan_llm

        return plan_llm
    if name == "profile":  # runs the model under a profiler: torch/onnxruntime when asked for
        from graphopt.measure import profile

        return profile
    if name == "calibrate":  # times torch ops on this CPU: torch imported when asked for
        from graphopt.measure.calibrate import calibrate_host

        return calibrate_host
    if name == "ort_session":  # onnxruntime is imported only when a session is asked for
        from graphopt.backends.onnx.session import ort_session

        return ort_session
    raise AttributeError(f"module 'graphopt' has no attribute {name!r}")
