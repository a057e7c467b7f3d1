"""The ``graphopt`` command line: one module per subcommand, wired here.

Errors a user can fix print as one message with the fix and exit with status 2; no tracebacks.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from graphopt._version import __version__
from graphopt.cli import calibrate, cost, lint, llm, optimize, plan, profile, targets
from graphopt.cli.args import add_reports
from graphopt.cli.terminal import SafeFormatter, SafeStream, terminal_safe
from graphopt.errors import GraphoptError, UserCodeExit
from graphopt.files.progress import set_quiet
from graphopt.files.quiet import library_quiet, set_verbose

__all__ = ["build_parser", "main"]


class DefaultsFormatter(argparse.HelpFormatter):
    """Help that shows each option's default, where it has one worth saying (not None, not a
    flag's False): a user reads ``--target`` is h100 without opening the docs."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (not action.option_strings or default in (None, False, argparse.SUPPRESS)
                or "default" in text.lower()):  # the help already says it
            return text
        return f"{text} (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    """Every subcommand's parser shows its defaults (:class:`DefaultsFormatter`)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="graphopt", description="Plan and optimize ML models.")
    p.add_argument("--version", action="version", version=f"graphopt {__version__}")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="log what each pass does, and show the libraries' own output "
                   "(profiler, exporter, warnings), which graphopt otherwise drops")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress lines on stderr for long steps (tracing, export, save)")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    plan.add_parser(sub)
    lint.add_parser(sub)
    optimize.add_parser(sub)
    llm.add_parser(sub, add_reports)
    cost.add_parser(sub)
    profile.add_parser(sub, add_reports)
    calibrate.add_parser(sub)
    targets.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    set_quiet(args.quiet)
    set_verbose(args.verbose)
    handler = logging.StreamHandler()
    handler.setFormatter(SafeFormatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        handlers=[handler])
    stdout = sys.stdout
    sys.stdout = SafeStream(stdout)  # every report line names nodes and files
    try:
        return _run(args)
    finally:
        sys.stdout = stdout


def _run(args: argparse.Namespace) -> int:
    """The command, with every way it can end turned into an exit status and a message."""
    try:
        with library_quiet(stderr=False):  # the known library warnings and logs, anywhere
            code = args.func(args)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # the reader (``| head``) has gone: exit quietly, as cat or grep do; point stdout at
        # devnull so the interpreter's final flush does not raise again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, the shell's status for a process ended by a closed pipe
    except GraphoptError as e:
        return _run_error(e)
    except SystemExit as e:  # user code graphopt ran outside a user_code() guard
        return _run_error(UserCodeExit(f"the model's code called sys.exit({e.code!r}); "
                                       "graphopt stopped without writing anything",
                                       "remove the sys.exit call (return instead)"))
    except KeyboardInterrupt:
        print("graphopt: interrupted; nothing was written", file=sys.stderr)
        return 130


def _run_error(e: GraphoptError) -> int:
    print(terminal_safe(f"graphopt: error: {e.problem}"), file=sys.stderr)
    if e.fix:
        print(terminal_safe(f"  fix: {e.fix}"), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
