"""The report package keeps its functions short enough to read whole: at most 80 lines, def line to last line."""

from __future__ import annotations

import ast
from pathlib import Path

import oodbench.report

LIMIT = 80


def test_no_report_function_exceeds_the_limit() -> None:
    package = Path(oodbench.report.__file__).parent
    long = []
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if length > LIMIT:
                    long.append(f"{path.name}:{node.lineno} {node.name} ({length} lines)")
    assert not long, long
