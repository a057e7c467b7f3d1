"""The package's face: ``plan``, ``optimize`` (the :class:`Optimized` result), ``plan_llm``.

Each entry point runs the pipeline stages below it: a frontend, the planner, the decisions and a
backend. ``graphopt/__init__.py`` re-exports them; import them from ``graphopt``.
"""
