"""graphopt imports its own modules at the top (issue 32, item 5).

An import inside a function hides a dependency from the reader and from the import-layer test
(``tests/test_import_layers.py`` reads module-level imports). Inner imports stay only where a
graphopt module would pull a heavy package in on a path that does not need it (torch on the ONNX
paths, ``tests/test_onnx_without_torch.py``) and for ``graphopt``'s lazy attributes
(``graphopt/__init__.py``). This counts the inner imports of graphopt's own modules and keeps
them at or under the issue's limit.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "graphopt"
LIMIT = 30  # issue 32, item 5


def _own(node: ast.Import | ast.ImportFrom) -> bool:
    if isinstance(node, ast.ImportFrom):
        return node.level > 0 or (node.module or "").split(".")[0] == "graphopt"
    return any(a.name.split(".")[0] == "graphopt" for a in node.names)


def inner_imports(root: Path = PACKAGE) -> list[str]:
    """``file:line module`` of every import of a graphopt module inside a function."""
    found: set[tuple[str, int, str]] = set()
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Import | ast.ImportFrom) and _own(node):
                    module = (node.module or "") if isinstance(node, ast.ImportFrom) \
                        else node.names[0].name
                    found.add((str(path.relative_to(root.parent)), node.lineno,
                               "." * getattr(node, "level", 0) + module))
    return [f"{f}:{line} {m}" for f, line, m in sorted(found)]


def test_the_counter_sees_an_inner_import(tmp_path: Path) -> None:
    pkg = tmp_path / "graphopt"
    pkg.mkdir()
    (pkg / "a.py").write_text("from graphopt.b import x\n\n\ndef f():\n"
                              "    from graphopt.c import y\n    from . import d\n"
                              "    import numpy\n    return y\n")
    assert inner_imports(pkg) == ["graphopt/a.py:5 graphopt.c", "graphopt/a.py:6 ."]


# what stays: graphopt/__init__'s lazy names (import time) and imports of graphopt modules that
# load torch, on paths the ONNX flow shares (api/, cli/optimize, measure/, partition/)
def test_inner_imports_of_graphopt_modules_within_limit() -> None:
    found = inner_imports()
    assert len(found) <= LIMIT, (f"{len(found)} imports of graphopt modules inside functions "
                                 f"(limit {LIMIT}); move them to the module top:\n"
                                 + "\n".join(found))
