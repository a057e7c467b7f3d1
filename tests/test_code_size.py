"""Size limits on the package's code (issue 20): no module over 400 lines, no function or method
over 80.

Why: a long module or function is where unrelated decisions pile up and a review stops reading;
the limits make a split along the code's seams the default. A module that is a pure data table
(one entry per op, read line by line against its source) may be longer: it is listed below with
the reason. A function's size is its whole span, docstring and nested functions included
(``end_lineno - lineno + 1``; decorators not counted). The source is read with ``ast``, so
nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import graphopt

ROOT = Path(graphopt.__file__).resolve().parents[1]
PACKAGE = ROOT / "graphopt"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80

#: modules that are data tables and may be longer, each with the reason
DATA_TABLES: dict[str, str] = {
    "graphopt/frontends/aten_ops.py": "the ATen -> canonical op table: one entry per ATen op, "
                                      "each read against its schema",
}


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _functions(tree: ast.AST) -> list[tuple[str, int]]:
    """(qualified name, lines) of every function and method, nested ones included."""
    out: list[tuple[str, int]] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = prefix + child.name
                assert child.end_lineno is not None
                out.append((name, child.end_lineno - child.lineno + 1))
                walk(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                walk(child, prefix + child.name + ".")
            else:
                walk(child, prefix)

    walk(tree, "")
    return out


def test_modules_are_at_most_400_lines() -> None:
    over = {}
    for path in _modules():
        rel = _rel(path)
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > MAX_MODULE_LINES and rel not in DATA_TABLES:
            over[rel] = n
    assert not over, (f"modules over {MAX_MODULE_LINES} lines (split them along their seams, "
                      f"or list a pure data table in DATA_TABLES with why): {over}")


def test_functions_are_at_most_80_lines() -> None:
    over = {}
    for path in _modules():
        rel = _rel(path)
        for name, n in _functions(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            key = f"{rel}::{name}"
            if n > MAX_FUNCTION_LINES:
                over[key] = n
    assert not over, (f"functions over {MAX_FUNCTION_LINES} lines (split them into named "
                      f"helpers): {over}")


@pytest.mark.parametrize("rel", sorted(DATA_TABLES))
def test_data_table_exceptions_are_still_needed(rel: str) -> None:
    """An allowed data table still exists and is still over the limit (else drop its entry)."""
    path = ROOT / rel
    assert path.is_file(), f"{rel} is listed in DATA_TABLES but does not exist"
    assert len(path.read_text(encoding="utf-8").splitlines()) > MAX_MODULE_LINES, (
        f"{rel} is within {MAX_MODULE_LINES} lines now: remove it from DATA_TABLES")


def test_the_walk_counts_methods_and_nested_functions() -> None:
    """The counter sees what the limit is about: methods by class, nested functions."""
    src = "class A:\n    def f(self):\n        def g():\n            pass\n        return 1\n"
    assert _functions(ast.parse(src)) == [("A.f", 4), ("A.f.g", 2)]
