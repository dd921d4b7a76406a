"""Write the detector table, generated from the detector classes, into README.md and docs/detectors.md.

Each file holds the table between ``<!-- detector-table -->`` and ``<!-- /detector-table -->``; the rows come
from `oodbench.detectors.catalog.markdown_table` (each class's summary, paper, requirements and defaults), so the
two tables are one source. Run it after adding or changing a detector; `--check` exits 1 when a file is stale
(tests/detectors/test_catalog.py checks the same).

Usage: python tools/detector_tables.py [--check]
"""

from __future__ import annotations

import sys
from pathlib import Path

from oodbench.detectors.catalog import markdown_table, replace_table

ROOT = Path(__file__).resolve().parents[1]
FILES = (ROOT / "README.md", ROOT / "docs" / "detectors.md")


def main(argv: list[str]) -> int:
    """Rewrite (or with --check, compare) the tables; 1 when a file is stale under --check."""
    check = "--check" in argv
    table = markdown_table()
    stale = []
    for path in FILES:
        text = path.read_text(encoding="utf-8")
        fresh = replace_table(text, table, str(path))
        if fresh != text:
            stale.append(path)
            if not check:
                path.write_text(fresh, encoding="utf-8")
    for path in stale:
        print(f"{path.relative_to(ROOT)}: detector table {'is stale' if check else 'rewritten'}")
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
