"""The ``graphopt`` command: one module per subcommand, wired in :mod:`graphopt.cli.main`."""

from graphopt.cli.main import main

__all__ = ["main"]
