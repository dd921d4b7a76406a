"""Class-list scan (no images): which OOD classes of a suite a training label space already covers, via WordNet.

For every OOD class and a training label space S, the strongest relation found is recorded:

- ``exact``: the OOD synset is a class of S (the model was trained on it; its training data sits in the fit set).
- ``hyponym``: the OOD synset is a kind of a class of S (e.g. a duck species under ImageNet-1k's 'drake'):
  images of S's class may show it, so the fit set can contain it.
- ``hypernym``: a class of S is a kind of the OOD synset (e.g. OOD 'dog' against ID dog breeds): the OOD
  images can show ID objects.
- ``lemma``: no taxonomic link, but a lemma (name) of the OOD class is also a lemma of a class of S: a name
  collision that matters for text-based (vision-language) detectors and for human labelling.
- ``none``.

Name-only suites (NINCO) are related through their own names: a name that is a WordNet lemma is looked up as
those synsets (every sense; relations marked 'via name'). The authors' own ImageNet-21K overlap annotations are
evidence shown beside the finding (each with its own relation to the label space), not the class's relation: an
annotated class A often only resembles the OOD class (NINCO's 'marbled newt' is annotated with 'newt', a hypernym of
ImageNet-1k's 'common newt'; the marbled newt itself is a sibling of it). One inference from an annotation is
sound and is used: when the name's head (its last words; hyphens read as spaces; before any 'of') is a lemma of A,
the class is a kind of A ('Lumholtz's tree-kangaroo' under 'tree wallaby, tree kangaroo'), so it is a hyponym of
whatever A is or lies under (marked 'via annotation'). Relations that A has only downwards or by name (a training
class under A, a lemma of A) say nothing about the class and are not carried over. When the whole name *is* a lemma
of A (its last word in either number: 'yellow trumpets' for 'yellow_trumpet'), the class is A itself and takes A's
own relation at A's distance: an exact match where A is a class of the space, not a hyponym one step below A.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..core.errors import AuditError
from ..text.classes import normalize_label as normalize_lemma
from .suites import SuiteManifest
from .wordnet import LabelSpace, WordNet, load_wordnet

__all__ = ["ClassFinding", "SuiteScan", "scan_suite", "scan_suites", "RELATIONS", "suite_scope"]

RELATIONS = ("exact", "hyponym", "hypernym", "lemma", "none")


@dataclass(frozen=True)
class ClassFinding:
    """The strongest relation of one OOD class to the label space, with the label-space classes involved."""

    ood: str
    name: str
    relation: str
    matches: tuple[str, ...] = ()
    distance: int = 0
    via: str = "wnid"
    evidence: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Plain-data view."""
        return {
            "ood": self.ood,
            "name": self.name,
            "relation": self.relation,
            "matches": list(self.matches),
            "distance": self.distance,
            "via": self.via,
            "evidence": list(self.evidence),
        }


@dataclass
class SuiteScan:
    """One suite scanned against one label space."""

    suite: str
    label_space: str
    available: bool
    findings: list[ClassFinding] = field(default_factory=list)
    unknown: tuple[str, ...] = ()
    note: str = ""

    def count(self, relation: str) -> int:
        """Number of OOD classes whose strongest relation is `relation`."""
        return sum(f.relation == relation for f in self.findings)

    @property
    def num_classes(self) -> int:
        """OOD classes scanned."""
        return len(self.findings)

    @property
    def verdict(self) -> str:
        """'leaks' (exact overlap), 'may leak' (taxonomic overlap), 'name collisions only', 'no overlap found',
        or 'no class list'."""
        if not self.available:
            return "no class list"
        if self.count("exact"):
            return "leaks"
        if self.count("hyponym") or self.count("hypernym"):
            return "may leak"
        if self.count("lemma"):
            return "name collisions only"
        return "no overlap found"

    def to_dict(self) -> dict[str, Any]:
        """Plain-data view."""
        return {
            "suite": self.suite,
            "label_space": self.label_space,
            "available": self.available,
            "verdict": self.verdict,
            "counts": {r: self.count(r) for r in RELATIONS},
            "num_classes": self.num_classes,
            "unknown": list(self.unknown),
            "note": self.note,
            "findings": [f.to_dict() for f in self.findings],
        }


class _SpaceIndex:
    """A label space prepared for relation queries: members, descendants-by-ancestor, lemma index."""

    def __init__(self, space: LabelSpace, wordnet: WordNet) -> None:
        self.space = space
        self.wordnet = wordnet
        self.members = frozenset(w for w in space.wnids if w in wordnet)
        self.unknown = tuple(w for w in space.wnids if w not in wordnet)
        below: dict[str, list[tuple[str, int]]] = {}
        lemmas: dict[str, set[str]] = {}
        for wnid in self.members:
            for ancestor, distance in wordnet.ancestors(wnid).items():
                below.setdefault(ancestor, []).append((wnid, distance))
            for lemma in wordnet.get(wnid).lemmas:
                lemmas.setdefault(normalize_lemma(lemma), set()).add(wnid)
        for name in space.names:
            lemmas.setdefault(normalize_lemma(name), set()).add(name)
        self.below = below
        self.lemmas = lemmas

    def relate(self, wnid: str, via: str = "wnid") -> ClassFinding:
        """Strongest relation of one synset to the space."""
        name = self.wordnet.name(wnid)
        if wnid in self.members:
            return ClassFinding(wnid, name, "exact", (wnid,), 0, via)
        up = [(a, d) for a, d in self.wordnet.ancestors(wnid).items() if a in self.members]
        if up:
            nearest = min(d for _, d in up)
            return ClassFinding(wnid, name, "hyponym", tuple(sorted(a for a, d in up if d == nearest)), nearest, via)
        down = self.below.get(wnid, [])
        if down:
            nearest = min(d for _, d in down)
            return ClassFinding(
                wnid, name, "hypernym", tuple(sorted({w for w, d in down if d == nearest})), nearest, via
            )
        hits = set()
        for lemma in self.wordnet.get(wnid).lemmas:
            hits |= self.lemmas.get(normalize_lemma(lemma), set())
        if hits:
            return ClassFinding(wnid, name, "lemma", tuple(sorted(hits)), 0, via)
        return ClassFinding(wnid, name, "none", (), 0, via)

    def relate_name(self, name: str, annotated: Sequence[str] = ()) -> ClassFinding:
        """Strongest relation of a named class, computed for the class itself (its name), with the authors'
        annotated classes shown as evidence; an annotation counts only where the name says the class is a kind of
        it (see the module docstring)."""
        candidates = [self.relate(w, "name") for w in sorted(self._name_synsets(name))]
        candidates = [
            ClassFinding(name, name, c.relation, c.matches, c.distance, f"{c.via} {c.ood}") for c in candidates
        ]
        known = [w for w in annotated if w in self.wordnet]
        for wnid in known:
            if self._names_the_synset(name, wnid):  # the class is A itself: A's own relation, whatever it is
                same = self.relate(wnid)
                if same.relation != "none":
                    candidates.append(
                        replace(same, ood=name, name=name, via=f"annotation {wnid}, the same synset by name")
                    )
            elif self._names_a_kind_of(name, wnid):
                above = self.relate(wnid)
                if above.relation in ("exact", "hyponym"):  # the class lies under A, so under what A lies under
                    candidates.append(
                        ClassFinding(
                            name,
                            name,
                            "hyponym",
                            above.matches,
                            above.distance + 1,
                            f"annotation {wnid}, a kind of it by name",
                        )
                    )
        hits = set()
        for key in self._name_keys(name):
            hits |= self.lemmas.get(key, set())
        if hits:
            candidates.append(ClassFinding(name, name, "lemma", tuple(sorted(hits)), 0, "name"))
        evidence = tuple(self._describe(wnid) for wnid in known) + tuple(
            f"{wnid}: not a WordNet 3.0 noun" for wnid in annotated if wnid not in self.wordnet
        )
        if not candidates:
            return ClassFinding(name, name, "none", (), 0, "name", evidence)
        best = min(candidates, key=lambda c: (RELATIONS.index(c.relation), c.distance))
        return replace(best, evidence=evidence)

    def _describe(self, wnid: str) -> str:
        """An annotated class and its own relation to the space, e.g. 'n01630284 newt: hypernym of n01630670'."""
        own = self.relate(wnid)
        text = f"{wnid} {own.name}: {own.relation}"
        if own.matches and own.relation != "exact":
            text += (" of " if own.relation in ("hyponym", "hypernym") else " with ") + ", ".join(own.matches[:6])
            text += " …" if len(own.matches) > 6 else ""
        return text

    def _names_a_kind_of(self, name: str, wnid: str) -> bool:
        """True when the name's head (its last words, before any 'of') is a lemma of `wnid`."""
        words = _words(re.sub(r"\s*\(.*?\)\s*", " ", name).split(" of ")[0])
        for lemma in self.wordnet.get(wnid).lemmas:
            head = _words(lemma)
            if head and words[-len(head) :] == head:
                return True
        return False

    def _names_the_synset(self, name: str, wnid: str) -> bool:
        """True when the name (without a parenthesis) is a lemma of `wnid`, its last word in either number."""
        words = _words(re.sub(r"\s*\(.*?\)\s*", " ", name))
        for lemma in self.wordnet.get(wnid).lemmas:
            other = _words(lemma)
            if other and len(other) == len(words) and other[:-1] == words[:-1]:
                if other[-1] in _singulars(words[-1]) or words[-1] in _singulars(other[-1]):
                    return True
        return False

    @staticmethod
    def _name_keys(name: str) -> set[str]:
        base = re.sub(r"\s*\(.*?\)\s*", " ", name).strip()
        return {normalize_lemma(name), normalize_lemma(base)} - {""}

    def _name_synsets(self, name: str) -> frozenset[str]:
        found: set[str] = set()
        for key in self._name_keys(name):
            found |= self.wordnet.lookup(key)
        return frozenset(found)


# WordNet's own noun detachment rules (morphy): a plural ending and what replaces it.
_NOUN_ENDINGS = (
    ("s", ""),
    ("ses", "s"),
    ("xes", "x"),
    ("zes", "z"),
    ("ches", "ch"),
    ("shes", "sh"),
    ("men", "man"),
    ("ies", "y"),
)


def _singulars(word: str) -> set[str]:
    """The word and every singular WordNet's detachment rules derive from it ('trumpets' → 'trumpet')."""
    return {word} | {
        word[: -len(end)] + base for end, base in _NOUN_ENDINGS if word.endswith(end) and len(word) > len(end)
    }


def _words(text: str) -> list[str]:
    """Lower-case words of a name, hyphens and underscores read as spaces."""
    return normalize_lemma(text.replace("-", " ")).split()


def scan_suite(
    suite: SuiteManifest, space: LabelSpace, wordnet: WordNet | None = None, *, _index: _SpaceIndex | None = None
) -> SuiteScan:
    """Relate every OOD class of `suite` to the training label space `space`."""
    wordnet = wordnet or load_wordnet()
    if not suite.available:
        return SuiteScan(suite.name, space.name, False, note=suite.notes)
    index = _index or _SpaceIndex(space, wordnet)
    findings: list[ClassFinding] = []
    unknown = tuple(w for w in suite.ood_wnids if w not in wordnet)
    findings += [index.relate(w) for w in suite.ood_wnids if w in wordnet]
    annotated = suite.annotations.get("related_21k_wnids", {}) if suite.kind == "names" else {}
    findings += [index.relate_name(name, annotated.get(name, ())) for name in suite.ood_names]
    note = suite.notes
    if index.unknown:
        note = (note + " " if note else "") + f"{len(index.unknown)} label-space ids are not WordNet 3.0 nouns."
    return SuiteScan(suite.name, space.name, True, findings, unknown, note)


def scan_suites(
    suites: Iterable[SuiteManifest], spaces: Iterable[LabelSpace], wordnet: WordNet | None = None
) -> list[SuiteScan]:
    """Every suite against every label space (each space indexed once)."""
    wordnet = wordnet or load_wordnet()
    suites = list(suites)
    results = []
    for space in spaces:
        if len(space) == 0:
            raise AuditError(f"label space {space.name!r} is empty")
        index = _SpaceIndex(space, wordnet)
        results += [scan_suite(suite, space, wordnet, _index=index) for suite in suites]
    return results


def suite_scope(scans: Sequence[SuiteScan], base: str = "imagenet-1k", wide: str = "imagenet-21k") -> dict[str, str]:
    """Per suite: can it leak for a `base`-trained backbone, only for a `wide`-pretrained one, or neither."""
    by_key = {(s.suite, s.label_space): s for s in scans}
    out: dict[str, str] = {}
    for suite in dict.fromkeys(s.suite for s in scans):
        narrow, broad = by_key.get((suite, base)), by_key.get((suite, wide))
        if (narrow and not narrow.available) or (broad and not broad.available):
            out[suite] = "no class list published"
        elif narrow and narrow.verdict == "leaks":
            out[suite] = f"leaks for {base} backbones"
        elif broad and broad.verdict == "leaks":
            extra = " (taxonomic overlap with " + base + ")" if narrow and narrow.verdict == "may leak" else ""
            out[suite] = f"leaks only for {wide}-pretrained backbones{extra}"
        elif narrow and narrow.verdict == "may leak":
            out[suite] = f"may leak for {base} backbones (taxonomic overlap only)"
        else:
            out[suite] = "no overlap found" + ("" if broad else f" (not scanned against {wide})")
    return out
