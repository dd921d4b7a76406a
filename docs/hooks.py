"""MkDocs hook: the site's home page is the README, so the front page has one source.

The README links to `docs/<page>.md` (right on GitHub); on the site those pages sit beside the home page, and files
outside `docs/` (configs, CONTRIBUTING.md) are not pages, so their links become plain code names.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

README = Path(__file__).resolve().parents[1] / "README.md"


def on_page_read_source(page: Any, config: Any) -> str | None:
    """Serve README.md (links rewritten for the site) as index.md."""
    if page.file.src_uri != "index.md":
        return None
    text = README.read_text(encoding="utf-8").replace("](docs/", "](")
    docs = Path(config["docs_dir"])

    def link(match: re.Match[str]) -> str:
        label, target = match[1], match[2]
        if target.startswith(("http://", "https://", "#")) or (docs / target.split("#", 1)[0]).is_file():
            return match[0]
        return label  # a repository file that is not a page: keep the name, drop the link

    return re.sub(r"\[([^\]]+)\]\(([^)\s]+)\)", link, text)
