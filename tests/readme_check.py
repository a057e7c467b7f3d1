"""Check the command outputs README.md quotes against what the commands print now.

Run ``python -m tests.readme_check`` (or ``make readme-check``); CI runs it through
``tests/test_readme_outputs.py``. It checks two kinds of quote:

1. A ```` ```text ```` block after a ``<!-- readme-check: COMMAND -->`` marker. COMMAND names a
   runner in ``RUNNERS``; every quoted line must appear in the runner's output, in order
   (whitespace runs compare equal, so column alignment is not checked; a README line may wrap one
   long output line over several lines; the quote may leave output lines out). Every
   ```` ```text ```` block needs a marker, so a new quoted output cannot go unchecked.
2. A number in prose (``CLAIMS``): a pattern in the README and the values the command gives.

Each mismatch is reported with the README's version and the command's.

Only deterministic output is checked: plans and cost predictions for datasheet targets (h100),
which are the same on every machine. Left out, and why:

- ``examples/llm_decode.py`` part 2 (the tiny Llama optimized for *this* CPU: its passes and
  error depend on the host's ISA) and its ``done in N s`` line (a timing). The README quotes
  neither, so the runner calls part 1 (``plan_7b``, ``compare_formats``) in-process.
- Timings the README states (``about 30 s``, calibration seconds, benchmark ratios such as
  ``1.46-3.85x`` or ``0.80-1.12x``): measured on a host, and from ``benchmarks/`` scripts whose
  results are kept in ``benchmarks/RESULTS.md``, not quoted command output.
- The 2-D recipe's ``# [[0, 41], [41, 80]] for Llama-70B`` comment and the Llama-70B
  tensor-parallel milliseconds: they come from ``benchmarks/bench_tensor_parallel.py`` (a 70B
  trace and every strategy), too slow for CI; RESULTS.md holds them.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from importlib import util
from pathlib import Path

__all__ = ["CLAIMS", "RUNNERS", "Mismatch", "check", "main"]

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MARKER = re.compile(r"<!--\s*readme-check:\s*(.+?)\s*-->")


@dataclass(frozen=True)
class Mismatch:
    """One quoted line (or prose number) that differs from the command's output."""

    command: str
    readme_line: int  # 1-based line in README.md; 0 when the quote itself is missing
    readme: str
    now: str

    def __str__(self) -> str:
        where = f"README.md:{self.readme_line}" if self.readme_line else "README.md"
        return f"{where} ({self.command})\n  README: {self.readme}\n  now:    {self.now}"


@dataclass
class Run:
    """What a command gave: its printed lines and any values a prose claim needs."""

    lines: list[str]
    values: dict[str, str]


def _make_demo() -> Run:
    """``make demo``: the Makefile's own recipe, with the output folder in a temp dir."""
    recipe = re.search(r"^demo:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M)
    if recipe is None:
        raise RuntimeError("the Makefile has no `demo:` recipe")
    cmd = recipe.group(1).replace("\\\n", " ").strip()
    graphopt = f"{shlex.quote(sys.executable)} -m graphopt.cli"  # the `graphopt` entry point
    with tempfile.TemporaryDirectory() as out:
        cmd = cmd.replace("$(VENV)/bin/graphopt", graphopt).replace("$(OUT)", out)
        env = {**os.environ, "GRAPHOPT_NO_CALIBRATE": "1"}
        proc = subprocess.run(shlex.split(cmd), cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=300, check=False)
        if proc.returncode:
            raise RuntimeError(f"make demo failed ({proc.returncode}): {proc.stderr[-2000:]}")
        mem = json.loads((Path(out) / "plan.json").read_text())["memory"]
    return Run(proc.stdout.splitlines(), {
        "recommended_batch": f"{mem['recommended_batch_size']:,}",
        "knee_percent": f"{mem['knee_fraction'] * 100:.0f}",
        "decided_by": mem["batch_decided_by"],
        "max_batch": f"{mem['max_batch_size']:,}"})


def _llm_decode() -> Run:
    """``python examples/llm_decode.py``, part 1 only (part 2 depends on this CPU)."""
    spec = util.spec_from_file_location("_readme_llm_decode", ROOT / "examples/llm_decode.py")
    mod = util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        sections = mod.compare_formats(mod.plan_7b())
    values = {}
    for label, s in sections.items():  # "11747 samples fit; rounded down ..."
        fit = re.match(r"(\d+) samples fit", s.memory.batch_note or "")
        values[f"{label}_fit"] = fit.group(1) if fit else str(s.memory.max_batch_size)
        values[f"{label}_max"] = str(s.memory.max_batch_size)
    return Run(buf.getvalue().splitlines(), values)


RUNNERS: dict[str, Callable[[], Run]] = {
    "make demo": _make_demo,
    "python examples/llm_decode.py": _llm_decode,
}

# (command, README pattern): each named group must equal the runner's value of that name
CLAIMS: list[tuple[str, str]] = [
    ("make demo", r"The ResNet-like demo on an H100:\s+batch (?P<recommended_batch>[\d,]+) "
                  r"\((?P<knee_percent>\d+) % of the best samples/s\), where memory would "
                  r"allow (?P<max_batch>[\d,]+)\."),
    ("python examples/llm_decode.py",
     r"FP8's (?P<FP8_fit>\d+) and INT4's (?P<INT4_fit>\d+) both\s+show as (?P<FP8_max>\d+)"),
]
# a claim read as "(90 % of the best samples/s)" says the throughput knee decided
_CLAIM_IMPLIES = {"make demo": {"decided_by": "throughput"}}


def _norm(s: str) -> str:
    return " ".join(s.split())


def _quoted_blocks(text: str) -> tuple[list[tuple[str, int, list[str]]], list[int]]:
    """The marked ```text blocks as (command, first line number, lines), and the line numbers
    of ```text blocks without a marker."""
    lines = text.splitlines()
    blocks, unmarked = [], []
    for i, line in enumerate(lines):
        if line.strip() != "```text":
            continue
        j = i - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        marker = MARKER.fullmatch(lines[j].strip()) if j >= 0 else None
        end = next(k for k in range(i + 1, len(lines)) if lines[k].strip() == "```")
        if marker is None:
            unmarked.append(i + 1)
        else:
            blocks.append((marker.group(1), i + 2, lines[i + 1:end]))
    return blocks, unmarked


def _compare_block(command: str, first: int, quoted: list[str], out: list[str]) -> list[Mismatch]:
    """Every quoted line in order in ``out``; a README line may wrap one output line."""
    records = [_norm(o) for o in out if o.strip()]
    found: list[Mismatch] = []
    pos, i = 0, 0
    while i < len(quoted):
        if not quoted[i].strip():
            i += 1
            continue
        exact = None
        for k in range(1, 4):  # this line alone, or wrapped over k README lines
            joined = _norm(" ".join(quoted[i:i + k]))
            hit = next((r for r in range(pos, len(records)) if records[r] == joined), None)
            if hit is not None:
                exact = (k, hit)
                break
        if exact is None:  # report the closest output line after the last match
            best = max(((difflib.SequenceMatcher(None, _norm(" ".join(quoted[i:i + k])),
                                                 records[r]).ratio(), k, r)
                        for k in range(1, 4) for r in range(pos, len(records))),
                       default=None)
            if best is None:
                found.append(Mismatch(command, first + i, quoted[i].strip(), "(no line)"))
                i += 1
                continue
            _, k, r = best
            found.append(Mismatch(command, first + i, _norm(" ".join(quoted[i:i + k])),
                                  records[r]))
            exact = (k, r)
        i += exact[0]
        pos = exact[1] + 1
    return found


def check(readme: Path = README) -> list[Mismatch]:
    """Run every command the README quotes; return the mismatches (empty when all agree)."""
    text = readme.read_text()
    blocks, unmarked = _quoted_blocks(text)
    found = [Mismatch("?", n, "```text block without a <!-- readme-check: COMMAND --> marker",
                      "add a marker naming a command in tests/readme_check.py RUNNERS")
             for n in unmarked]
    needed = {c for c, _, _ in blocks} | {c for c, _ in CLAIMS}
    unknown = needed - RUNNERS.keys()
    found += [Mismatch(c, 0, f"marker names {c!r}", f"RUNNERS has {sorted(RUNNERS)}")
              for c in sorted(unknown)]
    runs = {c: RUNNERS[c]() for c in sorted(needed - unknown)}
    for command, first, quoted in blocks:
        if command in runs:
            found += _compare_block(command, first, quoted, runs[command].lines)
    for command, pattern in CLAIMS:
        m = re.search(pattern, text)
        if m is None:
            found.append(Mismatch(command, 0, f"(no sentence matching {pattern!r})",
                                  "update CLAIMS in tests/readme_check.py with the README"))
            continue
        line = text.count("\n", 0, m.start()) + 1
        values = runs[command].values
        expect = {**{g: values[g] for g in m.groupdict()}, **_CLAIM_IMPLIES.get(command, {})}
        now = {g: values[g] for g in expect}
        said = {**m.groupdict(), **_CLAIM_IMPLIES.get(command, {})}
        if said != now:
            found.append(Mismatch(command, line, _norm(m.group(0)),
                                  ", ".join(f"{g}={v}" for g, v in now.items()
                                            if said[g] != v)))
    return found


def main() -> int:
    found = check()
    for m in found:
        print(m)
    print(f"README outputs: {len(found)} mismatch(es)" if found else "README outputs: all match")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
