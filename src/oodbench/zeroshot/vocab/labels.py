"""Label de-duplication and the ID filter every vocabulary builder applies (ID names and their WordNet synonyms)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ...text.classes import normalize_label
from .lexicon import Lexicon

__all__ = ["dedupe", "IdFilter"]


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
