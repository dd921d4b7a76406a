"""Label normalisation and the ID filter every vocabulary builder applies (ID names and their WordNet synonyms)."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence

from .lexicon import Lexicon

__all__ = ["normalize_label", "dedupe", "IdFilter"]

_SPACES = re.compile(r"\s+")
# Quotes, bullets and sentence punctuation that LLM replies and word lists leave around a name.
_EDGE = " \t\"'`*_.,;:!?()[]{}<>•·–—-"


def normalize_label(text: str) -> str:
    """Canonical form of a label: NFKC, lower case, underscores as spaces, single spaces, no edge punctuation."""
    text = unicodedata.normalize("NFKC", str(text)).replace("_", " ")
    text = _SPACES.sub(" ", text).strip(_EDGE)
    return _SPACES.sub(" ", text).lower()


def dedupe(labels: Iterable[str]) -> list[str]:
    """Normalised labels without empties or repeats, first occurrence first."""
    seen: dict[str, None] = {}
    for label in labels:
        key = normalize_label(label)
        if key and key not in seen:
            seen[key] = None
    return list(seen)


class IdFilter:
    """Recognises ID class names and their WordNet synonyms, so negatives and outliers never duplicate an ID label."""

    def __init__(
        self, names: Sequence[str], wnids: Sequence[str | None] | None = None, lexicon: Lexicon | None = None
    ) -> None:
        self.names = frozenset(normalize_label(n) for n in names)
        blocked = set(self.names)
        if lexicon is not None:
            wnid_list = list(wnids) if wnids is not None else [None] * len(names)
            for name, wnid in zip(names, wnid_list, strict=True):
                blocked |= lexicon.synonyms(name, wnid)
        self.blocked = frozenset(blocked)

    def __contains__(self, label: str) -> bool:
        return normalize_label(label) in self.blocked

    def keep(self, labels: Iterable[str]) -> tuple[list[str], list[str]]:
        """(kept, dropped): normalised, de-duplicated labels split by whether they name an ID class."""
        kept, dropped = [], []
        for label in dedupe(labels):
            (dropped if label in self.blocked else kept).append(label)
        return kept, dropped
