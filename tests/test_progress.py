"""Progress lines for long steps (``graphopt/files/progress.py``): shown on a terminal only,
after a delay, never when quiet; ``graphopt --quiet`` turns them off."""

from __future__ import annotations

import io
import threading
import time

import pytest

from graphopt.cli.main import build_parser
from graphopt.files import progress as prog


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture()
def terminal(monkeypatch: pytest.MonkeyPatch) -> Terminal:
    """A terminal as stderr. pytest's capture puts its own stderr back when the test starts,
    so the stream is swapped in by ``progress`` itself through ``_stderr``."""
    out = Terminal()
    monkeypatch.setattr(prog, "_stderr", lambda: out)
    monkeypatch.setattr(prog, "DELAY_S", 0.05)
    monkeypatch.setattr(prog, "_REFRESH_S", 0.02)
    monkeypatch.delenv(prog.QUIET_ENV, raising=False)
    prog.set_quiet(False)
    return out


def test_a_long_step_on_a_terminal_shows_what_runs(terminal: Terminal) -> None:
    with prog.progress("tracing the model"):
        time.sleep(0.3)
    assert "graphopt: tracing the model" in terminal.getvalue()


def test_a_short_step_shows_nothing(terminal: Terminal) -> None:
    with prog.progress("tracing the model"):
        pass
    assert terminal.getvalue() == ""


@pytest.mark.parametrize("how", ["set_quiet", "env"])
def test_quiet_shows_nothing(terminal: Terminal, how: str,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    if how == "env":
        monkeypatch.setenv(prog.QUIET_ENV, "1")
    else:
        prog.set_quiet(True)
    try:
        with prog.progress("saving"):
            time.sleep(0.2)
    finally:
        prog.set_quiet(False)
    assert terminal.getvalue() == ""


def test_not_a_terminal_shows_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    monkeypatch.setattr(prog, "_stderr", lambda: out)
    monkeypatch.setattr(prog, "DELAY_S", 0.01)
    with prog.progress("exporting"):
        time.sleep(0.1)
    assert out.getvalue() == ""


def test_an_error_inside_ends_the_line(terminal: Terminal) -> None:
    with pytest.raises(ValueError), prog.progress("calibrating"):
        time.sleep(0.15)
        raise ValueError("boom")
    assert not any(t.name == "graphopt-progress" for t in threading.enumerate())


def test_cli_quiet_flag() -> None:
    assert build_parser().parse_args(["--quiet", "targets"]).quiet
    assert not build_parser().parse_args(["targets"]).quiet
