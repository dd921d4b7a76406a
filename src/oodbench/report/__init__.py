"""Tables and figures in the paper's layouts, rendered from tidy result rows, and the self-contained HTML report.

Only the detector table is imported eagerly (``oodbench evaluate`` needs it); everything that pulls in matplotlib
is loaded on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from .detector_table import detector_table_markdown

_LAZY = {
    "write_html_report": ".html_report",
    "render_html_document": ".html_report",
    "build_report": ".build",
    "ReportOptions": ".build",
    "write_report": ".output",
    "render_markdown": ".markdown",
    "render_latex": ".latex",
    "render_html": ".html",
    "Table": ".table_model",
    "Cell": ".table_model",
    "Vocabulary": ".tables",
    "table1": ".tables",
    "table_a1": ".tables",
    "table_a2": ".tables",
    "table2": ".tables",
    "table_a6": ".tables",
    "table_detectors": ".tables",
}

__all__ = ["detector_table_markdown", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
