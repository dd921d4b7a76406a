"""Vocabularies as versioned artefacts: labels, the data to re-select them at another size, parameters, provenance, hash.

A vocabulary directory holds one folder per vocabulary name and one JSON file per version,
``<root>/<name>/v<NNN>-<hash12>.json``. Saving content that is already stored returns the existing version (the
cache); different content under the same name becomes the next version. The hash covers everything that
determines the labels (kind, labels, rankings, per-class lists, parameters) and is checked on every load.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...core.errors import ZeroShotError
from ...core.names import is_name
from ...util.atomic import atomic_write_text
from .labels import dedupe

__all__ = ["Vocabulary", "VocabStore", "KINDS", "NOUN", "ADJECTIVE", "split_prefix"]

FORMAT_VERSION = 1
# kind -> column of the Fi-ImageNet-1k paper's Table 2 it feeds.
KINDS = {
    "wordnet": "WN",
    "siblings": "LLM siblings",
    "union": "WN+LLM",
    "oracle": "oracle",
    "eoe": "EOE",
    "custom": "custom",
}
NOUN, ADJECTIVE = "noun", "adjective"
_FILE = re.compile(r"^v(\d{3,})-([0-9a-f]{12})\.json\Z")


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def split_prefix(num_nouns: int, num_adjectives: int, m: int) -> tuple[int, int]:
    """How many of the top nouns and adjectives make a prefix of size m (shared fraction, as NegLabel's top-k ratio)."""
    total = num_nouns + num_adjectives
    if isinstance(m, bool) or not isinstance(m, int) or m < 0:
        raise ZeroShotError(f"m must be a non-negative integer; got {m!r}")
    if m > total:
        raise ZeroShotError(f"asked for M={m} negatives but only {total} ranked candidates exist")
    nouns = min(num_nouns, int(round(m * num_nouns / total))) if total else 0
    return nouns, m - nouns


@dataclass
class Vocabulary:
    """A label vocabulary (negatives or outliers) with everything needed to rebuild, resize and trace it."""

    name: str
    kind: str
    labels: list[str]
    params: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    ranked: dict[str, list[str]] | None = None  # wordnet/union: candidates per part of speech, farthest first
    per_class: dict[str, list[str]] | None = None  # siblings/union: ID class -> siblings in seeded random order
    deployable: bool = True
    version: int | None = None

    def __post_init__(self) -> None:
        if not is_name(self.name, allow_at=False):
            raise ZeroShotError(f"invalid vocabulary name {self.name!r}: use letters, digits and . _ + = , -")
        if self.kind not in KINDS:
            raise ZeroShotError(f"unknown vocabulary kind {self.kind!r}; kinds: {', '.join(KINDS)}")
        if self.kind == "oracle":
            self.deployable = False
        self.labels = list(self.labels)

    def __len__(self) -> int:
        return len(self.labels)

    def __repr__(self) -> str:
        return f"Vocabulary({self.name!r}, kind={self.kind!r}, {len(self)} labels, hash={self.hash[:12]})"

    # ----------------------------------------------------------------- identity
    def content(self) -> dict[str, Any]:
        """The fields the hash covers."""
        return {
            "kind": self.kind,
            "labels": self.labels,
            "ranked": self.ranked,
            "per_class": self.per_class,
            "params": self.params,
            "deployable": self.deployable,
        }

    @property
    def hash(self) -> str:
        """SHA-256 of the canonical JSON of `content()`."""
        canonical = json.dumps(self.content(), sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    @property
    def ref(self) -> str:
        """'name@v<N>' once stored, else 'name'."""
        return f"{self.name}@v{self.version}" if self.version is not None else self.name

    # ----------------------------------------------------------------- resizing (sweeps)
    def select(self, *, m: int | None = None, k: int | None = None) -> list[str]:
        """Labels at WordNet prefix size `m` and/or `k` siblings per class (defaults: the vocabulary's own m and k).

        Vocabularies without a ranking or per-class lists return their labels.
        """
        if self.ranked is None and self.per_class is None and m is None and k is None:
            return list(self.labels)
        if m is not None and self.ranked is None:
            raise ZeroShotError(f"vocabulary {self.name!r} ({self.kind}) has no WordNet ranking: M cannot be varied")
        if k is not None and self.per_class is None:
            raise ZeroShotError(f"vocabulary {self.name!r} ({self.kind}) has no per-class lists: k cannot be varied")
        parts: list[str] = []
        if self.ranked is not None:
            size = m if m is not None else int(self.params.get("m", 0))
            nouns, adjectives = split_prefix(len(self.ranked.get(NOUN, [])), len(self.ranked.get(ADJECTIVE, [])), size)
            parts += self.ranked.get(NOUN, [])[:nouns] + self.ranked.get(ADJECTIVE, [])[:adjectives]
        if self.per_class is not None:
            per = k if k is not None else int(self.params.get("k", 0))
            if per < 0:
                raise ZeroShotError(f"k must be non-negative; got {per}")
            parts += [label for siblings in self.per_class.values() for label in siblings[:per]]
        return dedupe(parts)

    # ----------------------------------------------------------------- serialisation
    def to_json(self) -> dict[str, Any]:
        """The artefact as a JSON-ready dict (with its hash)."""
        return {
            "format": FORMAT_VERSION,
            "name": self.name,
            "version": self.version,
            "hash": self.hash,
            "size": len(self.labels),
            **self.content(),
            "provenance": self.provenance,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, origin: str = "") -> Vocabulary:
        """Rebuild from `to_json` output, verifying the recorded hash."""
        try:
            vocab = cls(
                name=data["name"],
                kind=data["kind"],
                labels=list(data["labels"]),
                params=dict(data.get("params") or {}),
                provenance=dict(data.get("provenance") or {}),
                ranked=data.get("ranked"),
                per_class=data.get("per_class"),
                deployable=bool(data.get("deployable", True)),
                version=data.get("version"),
            )
        except (KeyError, TypeError) as exc:
            raise ZeroShotError(
                f"{origin or 'vocabulary'} is not a vocabulary artefact: missing or bad field {exc}"
            ) from None
        recorded = data.get("hash")
        if recorded is not None and recorded != vocab.hash:
            raise ZeroShotError(
                f"{origin or vocab.name}: content does not match its recorded hash "
                f"({recorded[:12]} vs {vocab.hash[:12]}); the file was edited or is corrupt"
            )
        return vocab


class VocabStore:
    """A directory of versioned vocabulary artefacts."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"VocabStore({str(self.root)!r})"

    def _versions(self, name: str) -> list[tuple[int, str, Path]]:
        folder = self.root / name
        if not folder.is_dir():
            return []
        found = [(int(m[1]), m[2], p) for p in folder.iterdir() if (m := _FILE.match(p.name))]
        return sorted(found)

    def names(self) -> list[str]:
        """Vocabulary names with at least one stored version."""
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and self._versions(p.name))

    def save(self, vocab: Vocabulary) -> Vocabulary:
        """Store `vocab` (a new version unless identical content is stored); returns it with its version set."""
        digest = vocab.hash
        versions = self._versions(vocab.name)
        for _number, short, path in versions:
            if short == digest[:12]:
                return self._read(path)
        vocab.version = (versions[-1][0] + 1) if versions else 1
        vocab.provenance.setdefault("created", _now())
        path = self.root / vocab.name / f"v{vocab.version:03d}-{digest[:12]}.json"
        atomic_write_text(path, json.dumps(vocab.to_json(), indent=1, ensure_ascii=False, default=str) + "\n")
        return vocab

    def _read(self, path: Path) -> Vocabulary:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ZeroShotError(f"cannot read vocabulary {path}: {exc}") from None
        return Vocabulary.from_json(data, origin=str(path))

    def load(self, ref: str) -> Vocabulary:
        """'name' (latest version), 'name@v3' or 'name@<hash prefix>'; a path to a .json artefact also works."""
        if ref.endswith(".json") and Path(ref).is_file():
            return self._read(Path(ref))
        name, _, wanted = ref.partition("@")
        versions = self._versions(name)
        if not versions:
            known = ", ".join(self.names()) or "none"
            raise ZeroShotError(f"no vocabulary {name!r} in {self.root} (stored: {known}); build or import it first")
        if not wanted:
            return self._read(versions[-1][2])
        for number, short, path in versions:
            if wanted in (f"v{number}", f"v{number:03d}") or (len(wanted) >= 4 and short.startswith(wanted)):
                return self._read(path)
        raise ZeroShotError(
            f"vocabulary {name!r} has no version {wanted!r}; versions: "
            + ", ".join(f"v{n} ({s})" for n, s, _ in versions)
        )

    def summaries(self) -> list[dict[str, Any]]:
        """One summary per stored version: name, version, hash, kind, size, deployable, created."""
        rows = []
        for name in self.names():
            for number, short, path in self._versions(name):
                vocab = self._read(path)
                rows.append(
                    {
                        "name": name,
                        "version": number,
                        "hash": short,
                        "kind": vocab.kind,
                        "size": len(vocab),
                        "deployable": vocab.deployable,
                        "created": vocab.provenance.get("created", ""),
                        "source": vocab.provenance.get("source", ""),
                    }
                )
        return rows

    def load_many(self, refs: Sequence[str]) -> list[Vocabulary]:
        """Several vocabularies; 'all' stands for the latest version of every stored name."""
        expanded: list[str] = []
        for ref in refs:
            expanded.extend(self.names() if ref == "all" else [ref])
        return [self.load(ref) for ref in dict.fromkeys(expanded)]
