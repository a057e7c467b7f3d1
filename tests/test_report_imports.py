"""``graphopt/report/`` imports itself one way: entry points -> sections -> formatters.

An import cycle there once needed function-level imports to load at all (``markdown`` and
``sections_md`` imported each other, ``html -> sections_html -> partition_html -> html``), so
the graph here counts imports inside functions too, not only the module's top level.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

import graphopt.report

REPORT = Path(graphopt.report.__file__).parent


def import_graph(folder: Path, package: str) -> nx.DiGraph:
    """Module -> module edges between the ``*.py`` files of ``folder`` (the package ``package``),
    from every ``import`` and ``from ... import`` anywhere in a file."""
    modules = {p.stem for p in folder.glob("*.py")}
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)

    def local(dotted: str) -> str | None:
        if dotted == package:
            return "__init__"
        if dotted.startswith(package + "."):
            head = dotted[len(package) + 1:].split(".")[0]
            return head if head in modules else None
        return None

    for path in folder.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str | None] = []
            if isinstance(node, ast.Import):
                targets = [local(a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from . import x / from .x import y
                    base = package + ("." + base if base else "")
                mod = local(base)
                if mod == "__init__":  # from package import submodule names the submodule
                    subs = [a.name for a in node.names if a.name in modules]
                    targets = subs if len(subs) == len(node.names) else [*subs, "__init__"]
                else:
                    targets = [mod]
            graph.add_edges_from((path.stem, t) for t in targets if t and t != path.stem)
    return graph


def test_report_package_has_no_import_cycle() -> None:
    graph = import_graph(REPORT, "graphopt.report")
    assert graph.number_of_edges() > 10  # the walk found the package's imports
    assert nx.is_directed_acyclic_graph(graph), list(nx.simple_cycles(graph))
    # the formatters are a leaf of the package: the renderers import them, never the reverse
    assert set(graph.successors("format")) == set()
    assert {"markdown", "sections_md", "sections_html", "html"} <= set(graph.predecessors("format"))


def test_import_graph_sees_a_cycle_through_a_function_level_import(tmp_path: Path) -> None:
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "a.py").write_text("from pkg.b import f\n")
    (tmp_path / "b.py").write_text("def f():\n    from pkg import a\n    return a\n")
    (tmp_path / "c.py").write_text("from . import b\nimport pkg.a\n")
    graph = import_graph(tmp_path, "pkg")
    assert set(graph.edges) == {("a", "b"), ("b", "a"), ("c", "b"), ("c", "a")}
    assert list(nx.simple_cycles(graph)) in ([["a", "b"]], [["b", "a"]])
