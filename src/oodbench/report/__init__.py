"""Tables and figures in the paper's layouts, rendered from tidy result rows, and the self-contained HTML report.

Everything is loaded on first use (matplotlib is heavy). The renderer-neutral `Table`, its Markdown rendering and
the detector table live in the core module `oodbench.tabular` (the evaluation layer writes tables with them).
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "write_html_report": ".html_report",
    "render_html_document": ".html_report",
    "build_report": ".build",
    "ReportOptions": ".build",
    "write_report": ".output",
    "render_markdown": "..tabular",
    "detector_table_markdown": "..tabular",
    "render_latex": ".latex",
    "render_html": ".html",
    "Table": "..tabular",
    "Cell": "..tabular",
    "Vocabulary": ".tables",
    "table1": ".tables",
    "table_a1": ".tables",
    "table_a2": ".tables",
    "table2": ".tables",
    "table_a6": ".tables",
    "table_detectors": ".tables",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
