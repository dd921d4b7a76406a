"""Tables and figures in the paper's layouts, rendered from tidy result rows, and the self-contained HTML report.

Every name is imported from its module on first use (`oodbench.util.lazy`): matplotlib and pyarrow load only when a
report is built. The renderer-neutral `Table`, its Markdown rendering and the detector table live in the core
module `oodbench.core.tabular` (the evaluation layer writes tables with them).
"""

from __future__ import annotations

from ..util.lazy import lazy_package

_EXPORTS = {
    "detector_table_markdown": "..core.tabular",
    "write_html_report": ".html_report",
    "render_html_document": ".html_report",
    "build_report": ".build",
    "ReportOptions": ".build",
    "write_report": ".output",
    "render_markdown": "..core.tabular",
    "render_latex": ".latex",
    "render_html": ".html",
    "Table": "..core.tabular",
    "Cell": "..core.tabular",
    "Vocabulary": ".tables",
    "table1": ".tables",
    "table_a1": ".tables",
    "table_a2": ".tables",
    "table2": ".tables",
    "table_a6": ".tables",
    "table_detectors": ".tables",
}

__all__ = list(_EXPORTS)
lazy_package(__name__, _EXPORTS)
