"""How audit documents become HTML: a renderer handed in from above.

The audit package sits below `report`, which owns HTML rendering, so it cannot import it. The command line (and the
demo) hand in `report.html_report.render_audit_html` here; without one, audit documents are written as Markdown and
JSON only. This module imports nothing heavy, so the CLI can wire it at start-up.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

# (title, [(key, section title, text, tables)], subject) -> one self-contained HTML page
HtmlRenderer = Callable[[str, Sequence[tuple[str, str, str, list[Any]]], str], str]

_renderer: HtmlRenderer | None = None


def use_html_renderer(renderer: HtmlRenderer | None) -> None:
    """Set the function that renders audit documents as HTML (None: Markdown and JSON only)."""
    global _renderer
    _renderer = renderer


def html_renderer() -> HtmlRenderer | None:
    """The renderer set by `use_html_renderer`, if any."""
    return _renderer
