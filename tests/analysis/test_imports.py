"""Layering: `analysis` sits below `report` and must never import it (the report renders analysis results)."""

from __future__ import annotations

import ast
from pathlib import Path

import oodbench.analysis

PACKAGE = Path(oodbench.analysis.__file__).parent


def _imported_modules(path: Path) -> set[str]:
    """Absolute names of the oodbench modules a source file imports (relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = "oodbench.analysis"
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_analysis_never_imports_report() -> None:
    offenders = {
        path.name: sorted(
            n for n in _imported_modules(path) if n == "oodbench.report" or n.startswith("oodbench.report.")
        )
        for path in PACKAGE.glob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}
