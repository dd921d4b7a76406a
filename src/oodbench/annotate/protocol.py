"""The three-stage annotation protocol as pure functions over judgements and events.

Stage 1: two annotators judge an image independently. Stage 2: agreement between them is final,
any disagreement sends the image to Stage 3. Stage 3: a panel of three annotators reviews it
together; only full consensus yields a verdict, otherwise the image is `ambiguous`.
Nothing here touches a database: the web app and the exporter both replay events through
`ImageRecord`, so they cannot disagree about an outcome.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from ..core.errors import AnnotateError

STAGE1_ANNOTATORS = 2
PANEL_SIZE = 3


class Verdict(StrEnum):
    """What an annotator says an image is."""

    OOD = "ood"
    ID = "id"
    AMBIGUOUS = "ambiguous"


class Status(StrEnum):
    """Where an image stands in the protocol."""

    STAGE1 = "stage1"  # waiting for independent verdicts
    STAGE3 = "stage3"  # the two verdicts disagree: waiting for the joint review
    FINAL = "final"


AMBIGUITY_REASONS: tuple[str, ...] = ("unresolvable", "corrupted", "no-object", "degraded")
NO_CONSENSUS = "no-consensus"  # set by the protocol when a Stage 3 panel cannot agree
MAX_LABEL_LENGTH = 200
MAX_NOTE_LENGTH = 2000  # a Stage 3 note; the database column has this width


class EventKind(StrEnum):
    """Kinds of append-only events attached to an image."""

    STAGE1 = "stage1"  # an independent verdict (a later one by the same annotator revises it)
    STAGE3 = "stage3"  # a panel member's vote in the joint review
    CLOSE = "close"  # the panel ends the review without consensus


# Control characters (NUL, newlines, escapes), surrogates and bidirectional overrides: invisible or
# misleading in a label, and harmful in the exported files.
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def check_label_text(text: str) -> None:
    """Refuse a free-text label holding control characters, surrogates or bidirectional overrides."""
    for char in text:
        if unicodedata.category(char) in ("Cc", "Cs") or char in _BIDI:
            raise AnnotateError(f"a label may not contain the control character U+{ord(char):04X}")


_ARTICLE = re.compile(r"^(?:a|an|the)\s+")
_NOT_WORD = re.compile(r"[^\w\s']+")
_SPACES = re.compile(r"\s+")


def label_match_key(text: str) -> str:
    """The key two annotators' free-text labels are matched by: case, width, punctuation, spacing, leading article.

    Looser than `oodbench.text.classes.normalize_label` (the key of vocabularies and class names): it also drops
    hyphens, punctuation and a leading article, so "A sea-lion" and "sea lion" are one OOD label.
    """
    folded = unicodedata.normalize("NFKC", text).casefold().replace("_", " ").replace("-", " ")
    folded = _NOT_WORD.sub(" ", folded)
    folded = _SPACES.sub(" ", folded).strip().strip("'").strip()
    return _ARTICLE.sub("", folded)


@dataclass(frozen=True)
class Judgement:
    """One annotator's verdict on one image, validated on construction."""

    verdict: Verdict
    label: str | None = None  # OOD: the proposed (open-vocabulary) label
    class_index: int | None = None  # ID: the in-distribution class
    reason: str | None = None  # ambiguous: one of AMBIGUITY_REASONS (or NO_CONSENSUS)
    fine_grained: bool = False

    def __post_init__(self) -> None:
        try:
            verdict = Verdict(self.verdict)
        except ValueError:
            raise AnnotateError(
                f"unknown verdict {self.verdict!r}; expected one of {[v.value for v in Verdict]}"
            ) from None
        object.__setattr__(self, "verdict", verdict)
        label = self.label.strip() if isinstance(self.label, str) else self.label
        object.__setattr__(self, "label", label or None)
        if verdict is Verdict.OOD:
            if not self.label or not label_match_key(self.label):
                raise AnnotateError("an OOD verdict needs a proposed label (a word or phrase)")
            if len(self.label) > MAX_LABEL_LENGTH:
                raise AnnotateError(f"an OOD label has at most {MAX_LABEL_LENGTH} characters")
            if self.class_index is not None or self.reason is not None:
                raise AnnotateError("an OOD verdict takes a label only, not a class or a reason")
        elif verdict is Verdict.ID:
            if self.class_index is None or isinstance(self.class_index, bool):
                raise AnnotateError("an ID verdict needs the ID class it belongs to")
            if int(self.class_index) != self.class_index or self.class_index < 0:
                raise AnnotateError(f"class index must be a non-negative integer, got {self.class_index!r}")
            object.__setattr__(self, "class_index", int(self.class_index))
            if self.label is not None or self.reason is not None:
                raise AnnotateError("an ID verdict takes a class only, not a label or a reason")
        else:
            if self.reason not in AMBIGUITY_REASONS and self.reason != NO_CONSENSUS:
                raise AnnotateError(
                    f"an ambiguous verdict needs a reason among {list(AMBIGUITY_REASONS)}, got {self.reason!r}"
                )
            if self.label is not None or self.class_index is not None:
                raise AnnotateError("an ambiguous verdict takes a reason only, not a label or a class")
        object.__setattr__(self, "fine_grained", bool(self.fine_grained))


class LabelMatcher:
    """Equivalence of OOD labels: equal after normalisation, or declared the same concept."""

    def __init__(self, matches: Iterable[tuple[str, str]] = ()) -> None:
        self._parent: dict[str, str] = {}
        for first, second in matches:
            self.add(first, second)

    def _root(self, norm: str) -> str:
        parent = self._parent.get(norm, norm)
        if parent == norm:
            return norm
        root = self._root(parent)
        self._parent[norm] = root
        return root

    def add(self, first: str, second: str) -> None:
        """Declare two labels the same concept (an explicit match)."""
        a, b = label_match_key(first), label_match_key(second)
        if not a or not b:
            raise AnnotateError("an explicit label match needs two non-empty labels")
        ra, rb = self._root(a), self._root(b)
        if ra != rb:
            # The lexicographically smaller root wins so the concept name is order-independent.
            low, high = sorted((ra, rb))
            self._parent[high] = low
            self._parent.setdefault(low, low)

    def concept(self, label: str) -> str:
        """The canonical concept a label belongs to."""
        return self._root(label_match_key(label))

    def same(self, first: str, second: str) -> bool:
        """Whether two labels name the same concept."""
        return self.concept(first) == self.concept(second)


def agree(first: Judgement, second: Judgement, matcher: LabelMatcher | None = None) -> bool:
    """Whether two judgements agree: same verdict, and the same class (ID) or concept (OOD)."""
    if first.verdict is not second.verdict:
        return False
    if first.verdict is Verdict.ID:
        return first.class_index == second.class_index
    if first.verdict is Verdict.OOD:
        return (matcher or LabelMatcher()).same(first.label or "", second.label or "")
    return True  # both ambiguous; their reasons are kept, not compared


@dataclass(frozen=True)
class Event:
    """An append-only protocol event: who did what to which image, and when."""

    image: int | str
    annotator: str
    kind: EventKind
    judgement: Judgement | None
    at: datetime
    seq: int = 0


@dataclass(frozen=True)
class Outcome:
    """The protocol state of one image derived from its events."""

    status: Status
    verdict: Verdict | None = None
    label: str | None = None
    concept: str | None = None
    class_index: int | None = None
    reason: str | None = None
    fine_grained: bool = False
    decided_in: int | None = None  # 2 (agreement of Stage 1) or 3 (joint review)
    stage1: Mapping[str, Judgement] = field(default_factory=dict)
    stage3: Mapping[str, Judgement] = field(default_factory=dict)

    @property
    def annotators(self) -> list[str]:
        """Everyone whose judgement counted, Stage 1 first."""
        names = list(self.stage1)
        names += [name for name in self.stage3 if name not in names]
        return names


def _merge(judgements: list[Judgement], matcher: LabelMatcher) -> dict:
    """Final fields of a set of agreeing judgements (the first one names the label)."""
    first = judgements[0]
    reasons = sorted({j.reason for j in judgements if j.reason})
    return {
        "verdict": first.verdict,
        "label": first.label,
        "concept": matcher.concept(first.label) if first.label else None,
        "class_index": first.class_index,
        "reason": "+".join(reasons) or None,
        # A concept flagged fine-grained by any annotator stays flagged: the flag marks a risk.
        "fine_grained": any(j.fine_grained for j in judgements),
    }


class ImageRecord:
    """The events of one image, replayed into the protocol state they imply."""

    def __init__(self) -> None:
        self.stage1: dict[str, Judgement] = {}  # latest verdict per annotator, first-come order
        self.stage3: dict[str, Judgement] = {}  # latest vote per panel member, first-come order
        self.closed_by: str | None = None

    @classmethod
    def from_events(cls, events: Iterable[Event], matcher: LabelMatcher | None = None) -> ImageRecord:
        """Replay events in sequence order, skipping any the protocol would have refused."""
        record = cls()
        for event in sorted(events, key=lambda e: e.seq):
            try:
                record.apply(event, matcher)
            except AnnotateError:
                continue
        return record

    def apply(self, event: Event, matcher: LabelMatcher | None = None) -> None:
        """Apply one event, or raise `AnnotateError` if the protocol does not allow it now."""
        self.check(event, matcher)
        if event.kind is EventKind.STAGE1:
            self.stage1[event.annotator] = event.judgement  # type: ignore[assignment]
        elif event.kind is EventKind.STAGE3:
            self.stage3[event.annotator] = event.judgement  # type: ignore[assignment]
        else:
            self.closed_by = event.annotator

    def outcome(self, matcher: LabelMatcher | None = None) -> Outcome:
        """The image's current status and, once final, its verdict."""
        matcher = matcher or LabelMatcher()
        seen = {"stage1": dict(self.stage1), "stage3": dict(self.stage3)}
        if len(self.stage1) < STAGE1_ANNOTATORS:
            return Outcome(Status.STAGE1, **seen)
        pair = list(self.stage1.values())[:STAGE1_ANNOTATORS]
        if agree(pair[0], pair[1], matcher):
            return Outcome(Status.FINAL, decided_in=2, **_merge(pair, matcher), **seen)
        votes = list(self.stage3.values())
        if len(votes) >= PANEL_SIZE and all(agree(votes[0], v, matcher) for v in votes[1:]):
            return Outcome(Status.FINAL, decided_in=3, **_merge(votes, matcher), **seen)
        if self.closed_by is not None:
            return Outcome(
                Status.FINAL,
                verdict=Verdict.AMBIGUOUS,
                reason=NO_CONSENSUS,
                fine_grained=any(v.fine_grained for v in votes),
                decided_in=3,
                **seen,
            )
        return Outcome(Status.STAGE3, **seen)

    def check(self, event: Event, matcher: LabelMatcher | None = None) -> None:
        """Raise `AnnotateError` if the protocol does not allow this event now."""
        state = self.outcome(matcher)
        if event.kind is EventKind.STAGE1:
            if event.judgement is None:
                raise AnnotateError("a Stage 1 event needs a judgement")
            if state.status is not Status.STAGE1:
                raise AnnotateError("Stage 1 is over for this image: both independent verdicts are in")
            if event.annotator not in self.stage1 and len(self.stage1) >= STAGE1_ANNOTATORS:
                raise AnnotateError("this image already has its two Stage 1 annotators")
        elif event.kind is EventKind.STAGE3:
            if event.judgement is None:
                raise AnnotateError("a Stage 3 vote needs a judgement")
            if state.status is not Status.STAGE3:
                raise AnnotateError(f"this image is not in Stage 3 review (it is {state.status.value})")
            if event.annotator not in self.stage3 and len(self.stage3) >= PANEL_SIZE:
                raise AnnotateError(f"the Stage 3 panel of this image is full ({', '.join(self.stage3)})")
        elif event.kind is EventKind.CLOSE:
            if state.status is not Status.STAGE3:
                raise AnnotateError(f"only an open Stage 3 review can be closed (it is {state.status.value})")
            if len(self.stage3) < PANEL_SIZE:
                raise AnnotateError(
                    f"the panel needs {PANEL_SIZE} votes before it can close without consensus "
                    f"({len(self.stage3)} so far)"
                )
            if event.annotator not in self.stage3:
                raise AnnotateError("only a member of the panel can close its review")
        else:  # pragma: no cover - EventKind is closed
            raise AnnotateError(f"unknown event kind {event.kind!r}")


def replay(events: Iterable[Event], matches: Iterable[tuple[str, str]] = ()) -> dict[int | str, Outcome]:
    """Outcome of every image mentioned in an event log."""
    matcher = LabelMatcher(matches)
    by_image: dict[int | str, list[Event]] = {}
    for event in events:
        by_image.setdefault(event.image, []).append(event)
    return {image: ImageRecord.from_events(evs, matcher).outcome(matcher) for image, evs in by_image.items()}
