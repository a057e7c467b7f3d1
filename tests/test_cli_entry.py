"""The command's entry points: ``python -m graphopt``, ``--version``, and help that shows each
option's default (issue 35, item 2)."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

import graphopt
from graphopt.cli.main import build_parser, main


def test_python_dash_m_graphopt_runs_the_cli() -> None:
    done = subprocess.run([sys.executable, "-m", "graphopt", "--version"], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"graphopt {graphopt.__version__}"


def test_version_flag_agrees_with_the_package(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"graphopt {graphopt.__version__}"


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions
                  if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("command", sorted(_subparsers()))
def test_every_subcommand_help_shows_its_defaults(command: str) -> None:
    """Each option with a default worth saying (not None, not a flag's False) shows it."""
    parser = _subparsers()[command]
    for action in parser._actions:
        if (not action.option_strings or action.default in (None, False, argparse.SUPPRESS)
                or action.help == argparse.SUPPRESS):
            continue
        shown = " ".join(parser._get_formatter()._format_action(action).split())
        assert "default" in shown.lower(), f"{command}: {shown}"


def test_the_target_default_is_in_plan_help() -> None:
    assert "(default: h100)" in " ".join(_subparsers()["plan"].format_help().split())
