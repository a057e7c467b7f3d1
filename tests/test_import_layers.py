"""The package imports one way, down the pipeline, with no cycles (imports inside functions count).

The folders are the compiler's stages: the face (``graphopt/__init__``, ``api/``, ``cli/``) calls
frontends, which build the IR; analysis, cost and the hardware facts annotate it; ``decisions/``
decides; ``backends/`` apply the decisions; ``partition/``, ``measure/`` and ``report/`` work on
plans; ``files/`` writes outputs. An import that points back up (the cost model calling the face,
a backend deciding through the face, the hardware table reading decisions) is how cycles and
decisions in the wrong place start, so this test lists every such edge, and every cycle, by
module. It reads the source with ``ast``: an import inside a function is an import too, since a
cycle dodged that way is a cycle still. An import under ``if TYPE_CHECKING:`` is not: it never
runs, and names a type for the reader (the report's renderers annotate with ``ir.plan.Plan``,
whose emitters the report package provides).
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

import graphopt

PACKAGE = Path(graphopt.__file__).parent

#: the stage of each top-level part of the package
STAGES = {
    "graphopt": "face", "__main__": "face", "api": "face", "cli": "face",
    "frontends": "frontends", "ir": "ir", "analysis": "analysis", "cost": "cost",
    "hardware": "hardware", "decisions": "decisions", "backends": "backends",
    "partition": "partition", "measure": "measure", "report": "report", "files": "files",
    "errors": "base", "_version": "base",
}

#: stage -> the stages it must never import (the issue's rules, then the face's)
FORBIDDEN = {
    "face": set(),
    "frontends": {"backends", "face", "report", "measure", "partition"},
    "ir": {"backends", "face", "measure", "partition", "decisions", "frontends"},
    "analysis": {"backends", "face", "report", "measure", "partition", "decisions"},
    "cost": {"backends", "face", "report", "measure", "partition", "decisions"},
    "hardware": {"backends", "face", "report", "measure", "partition", "decisions",
                 "frontends", "analysis", "cost"},
    "decisions": {"backends", "face", "report", "measure"},
    "backends": {"face", "measure"},
    "partition": {"face", "measure"},
    "measure": {"face"},
    "report": {"face", "backends", "measure", "decisions", "frontends", "partition"},
    "files": {"face", "backends", "measure", "decisions", "partition", "report"},
    "base": set(STAGES.values()) - {"base"},
}


def _modules(root: Path = PACKAGE) -> dict[str, Path]:
    found = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def import_graph(root: Path = PACKAGE) -> nx.DiGraph:
    """Module -> module edges inside the package at ``root``, from every import anywhere in a
    file."""
    modules = _modules(root)
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)

    def owner(dotted: str) -> str | None:  # the module a dotted name lives in
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(), str(path))
        type_only = {id(n) for block in ast.walk(tree) if _is_type_checking(block)
                     for stmt in block.body for n in ast.walk(stmt)}  # its else branch runs
        for node in ast.walk(tree):
            if id(node) in type_only:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                # `from pkg import sub` imports the submodule; `from mod import name`, mod
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                           for a in node.names]
            for t in targets:
                if (mod := owner(t)) and mod != name:
                    graph.add_edge(name, mod)
    return graph


def _is_type_checking(node: ast.AST) -> bool:
    """``if TYPE_CHECKING:`` or ``if typing.TYPE_CHECKING:``: imports only a type checker runs."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def stage(module: str) -> str:
    parts = module.split(".")
    return STAGES["graphopt" if len(parts) == 1 else parts[1]]


def test_every_module_has_a_stage() -> None:
    loose = sorted(m for m in _modules() if m.count(".") == 1 and m.split(".")[1] not in STAGES)
    assert loose == [], f"modules outside the pipeline's folders: {loose}"


def test_no_import_cycles() -> None:
    cycles = [sorted(c) for c in nx.strongly_connected_components(import_graph()) if len(c) > 1]
    assert cycles == [], f"{len(cycles)} import cycle(s): {cycles}"


def test_imports_point_down_the_pipeline() -> None:
    wrong = sorted(f"{a} -> {b}" for a, b in import_graph().edges
                   if stage(b) in FORBIDDEN[stage(a)])
    assert wrong == [], "imports against the pipeline:\n  " + "\n  ".join(wrong)


@pytest.mark.parametrize("source, expected", [
    ("from pkg.ir.plan import Plan\n", "pkg.ir.plan"),
    ("import pkg.ir.plan as p\n", "pkg.ir.plan"),
    ("def f():\n    from pkg.ir import plan\n", "pkg.ir.plan"),
    ("from . import plan\n", "pkg.ir.plan"),
    ("from .plan import Plan\n", "pkg.ir.plan"),
    ("from .. import api\n", "pkg.api"),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import api\n"
     "from .plan import Plan\n", "pkg.ir.plan"),
])
def test_the_graph_sees_every_import_form(source: str, expected: str, tmp_path: Path) -> None:
    """The checker itself: top level, inside a function, relative; it must not miss one."""
    root = tmp_path / "pkg"
    for f in ("__init__.py", "api.py", "ir/__init__.py", "ir/plan.py"):
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).write_text("")
    (root / "ir" / "probe.py").write_text(source)
    assert set(import_graph(root).successors("pkg.ir.probe")) == {expected}
