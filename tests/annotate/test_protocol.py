"""The three-stage protocol: every agreement and disagreement path, and the rules on events."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oodbench.annotate.protocol import (
    NO_CONSENSUS,
    Event,
    EventKind,
    ImageRecord,
    Judgement,
    LabelMatcher,
    Status,
    Verdict,
    agree,
    label_match_key,
    replay,
)
from oodbench.core.errors import AnnotateError

NOW = datetime(2025, 1, 1, tzinfo=UTC)


def ood(label: str, fine: bool = False) -> Judgement:
    return Judgement(Verdict.OOD, label=label, fine_grained=fine)


def id_(cls: int, fine: bool = False) -> Judgement:
    return Judgement(Verdict.ID, class_index=cls, fine_grained=fine)


def amb(reason: str) -> Judgement:
    return Judgement(Verdict.AMBIGUOUS, reason=reason)


class Log:
    """Builds an event sequence for one image and applies it strictly."""

    def __init__(self, matcher: LabelMatcher | None = None) -> None:
        self.record = ImageRecord()
        self.events: list[Event] = []
        self.matcher = matcher

    def do(self, who: str, kind: EventKind, judgement: Judgement | None = None) -> Log:
        event = Event(1, who, kind, judgement, NOW, len(self.events) + 1)
        self.record.apply(event, self.matcher)
        self.events.append(event)
        return self

    def s1(self, who: str, j: Judgement) -> Log:
        return self.do(who, EventKind.STAGE1, j)

    def s3(self, who: str, j: Judgement) -> Log:
        return self.do(who, EventKind.STAGE3, j)

    def close(self, who: str) -> Log:
        return self.do(who, EventKind.CLOSE)

    @property
    def outcome(self):
        return self.record.outcome(self.matcher)


# -- judgements and labels ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"verdict": "ood"}, "needs a proposed label"),
        ({"verdict": "ood", "label": "  ?! "}, "needs a proposed label"),
        ({"verdict": "ood", "label": "cat", "class_index": 3}, "label only"),
        ({"verdict": "id"}, "needs the ID class"),
        ({"verdict": "id", "class_index": -1}, "non-negative"),
        ({"verdict": "id", "class_index": True}, "needs the ID class"),
        ({"verdict": "id", "class_index": 2, "label": "x"}, "class only"),
        ({"verdict": "ambiguous"}, "needs a reason"),
        ({"verdict": "ambiguous", "reason": "boring"}, "needs a reason"),
        ({"verdict": "ambiguous", "reason": "corrupted", "class_index": 1}, "reason only"),
        ({"verdict": "maybe"}, "unknown verdict"),
    ],
)
def test_judgement_validation(kwargs, message):
    with pytest.raises(AnnotateError, match=message):
        Judgement(**kwargs)


def test_judgement_coerces_and_strips():
    j = Judgement("ood", label="  hot-air balloon ", fine_grained=1)
    assert j.verdict is Verdict.OOD and j.label == "hot-air balloon" and j.fine_grained is True


@pytest.mark.parametrize(
    "raw, norm",
    [
        ("Hot-Air  Balloon", "hot air balloon"),
        ("the Golden_Gate bridge.", "golden gate bridge"),
        ("An apple", "apple"),
        ("ＦＵＬＬ width", "full width"),
        ("Anteater", "anteater"),  # 'an' only as a separate word
        ("driver's seat", "driver's seat"),
    ],
)
def test_label_match_key(raw, norm):
    assert label_match_key(raw) == norm


def test_matcher_is_transitive_and_order_independent():
    a = LabelMatcher([("cell phone", "mobile phone"), ("Mobile-Phone", "cellular telephone")])
    b = LabelMatcher([("cellular telephone", "mobile phone"), ("mobile phone", "cell phone")])
    assert a.same("cellular telephone", "Cell Phone")
    assert a.concept("mobile phone") == b.concept("mobile phone") == "cell phone"
    assert not a.same("cell phone", "telephone")
    with pytest.raises(AnnotateError):
        a.add("", "x")


def test_agree_rules():
    assert agree(id_(3), id_(3)) and not agree(id_(3), id_(4))
    assert agree(ood("Sea lion"), ood("sea-lion"))
    assert not agree(ood("sea lion"), ood("seal"))
    assert agree(ood("sea lion"), ood("seal"), LabelMatcher([("seal", "sea lion")]))
    assert agree(amb("corrupted"), amb("degraded"))  # reasons are kept, not compared
    assert not agree(ood("cat"), id_(3)) and not agree(id_(3), amb("unresolvable"))


# -- Stage 1 and Stage 2 -----------------------------------------------------------------------
def test_one_verdict_waits_and_can_be_revised():
    log = Log().s1("a", id_(1))
    assert log.outcome.status is Status.STAGE1 and log.outcome.verdict is None
    log.s1("a", id_(2)).s1("b", id_(2))
    out = log.outcome
    assert out.status is Status.FINAL and out.decided_in == 2 and out.class_index == 2
    assert out.annotators == ["a", "b"]


def test_agreement_on_ood_after_normalisation_merges_flags():
    out = Log().s1("a", ood("Hot-air balloon")).s1("b", ood("hot air balloon", fine=True)).outcome
    assert (out.status, out.verdict, out.decided_in) == (Status.FINAL, Verdict.OOD, 2)
    assert out.label == "Hot-air balloon" and out.concept == "hot air balloon" and out.fine_grained


def test_agreement_on_ambiguous_keeps_both_reasons():
    out = Log().s1("a", amb("degraded")).s1("b", amb("corrupted")).outcome
    assert out.verdict is Verdict.AMBIGUOUS and out.reason == "corrupted+degraded" and out.decided_in == 2


@pytest.mark.parametrize(
    "first, second",
    [
        (ood("dog sled"), id_(5)),
        (id_(5), id_(6)),
        (ood("kayak"), ood("canoe")),
        (amb("corrupted"), id_(1)),
        (ood("kayak"), amb("no-object")),
    ],
)
def test_disagreement_goes_to_stage3(first, second):
    out = Log().s1("a", first).s1("b", second).outcome
    assert out.status is Status.STAGE3 and out.verdict is None and out.decided_in is None


def test_explicit_match_settles_stage2():
    log = Log().s1("a", ood("kayak")).s1("b", ood("sea kayak"))
    assert log.outcome.status is Status.STAGE3
    out = log.record.outcome(LabelMatcher([("sea kayak", "kayak")]))
    assert out.status is Status.FINAL and out.decided_in == 2 and out.concept == "kayak"


# -- Stage 3 -----------------------------------------------------------------------------------
def disputed() -> Log:
    return Log().s1("a", ood("bobsled")).s1("b", id_(7))


def test_full_consensus_yields_verdict():
    log = disputed().s3("a", ood("Bobsled")).s3("b", ood("bobsled")).s3("c", ood("the bobsled.", fine=True))
    out = log.outcome
    assert (out.status, out.verdict, out.decided_in, out.concept) == (Status.FINAL, Verdict.OOD, 3, "bobsled")
    assert out.fine_grained and out.annotators == ["a", "b", "c"]


def test_consensus_on_id_class():
    out = disputed().s3("c", id_(7)).s3("d", id_(7)).s3("e", id_(7)).outcome
    assert out.verdict is Verdict.ID and out.class_index == 7 and out.decided_in == 3


def test_no_consensus_stays_open_until_closed_then_ambiguous():
    log = disputed().s3("a", ood("bobsled")).s3("b", id_(7))
    assert log.outcome.status is Status.STAGE3
    with pytest.raises(AnnotateError, match="needs 3 votes"):
        log.close("a")
    log.s3("c", ood("bobsled"))
    assert log.outcome.status is Status.STAGE3  # 2 of 3 is not consensus
    with pytest.raises(AnnotateError, match="member of the panel"):
        log.close("z")
    log.close("c")
    out = log.outcome
    assert (out.status, out.verdict, out.reason, out.decided_in) == (Status.FINAL, Verdict.AMBIGUOUS, NO_CONSENSUS, 3)


def test_panel_member_can_revise_towards_consensus():
    log = disputed().s3("a", ood("bobsled")).s3("b", id_(7)).s3("c", ood("bobsled"))
    log.s3("b", ood("bobsled"))
    out = log.outcome
    assert out.verdict is Verdict.OOD and out.stage3["b"] == ood("bobsled")


def test_protocol_refusals():
    log = Log().s1("a", id_(1)).s1("b", id_(1))
    with pytest.raises(AnnotateError, match="Stage 1 is over"):
        log.s1("c", id_(1))
    with pytest.raises(AnnotateError, match="Stage 1 is over"):
        log.s1("a", id_(2))
    with pytest.raises(AnnotateError, match="not in Stage 3"):
        log.s3("c", id_(1))
    with pytest.raises(AnnotateError, match="not in Stage 3"):
        Log().s1("a", id_(1)).s3("b", id_(1))
    log = disputed().s3("a", id_(7)).s3("b", id_(6)).s3("c", id_(7))
    with pytest.raises(AnnotateError, match="panel of this image is full"):
        log.s3("d", id_(7))
    log.s3("b", id_(7))  # consensus now
    with pytest.raises(AnnotateError, match="not in Stage 3"):
        log.s3("a", id_(6))
    with pytest.raises(AnnotateError, match="only an open Stage 3"):
        log.close("a")


def test_replay_skips_refused_events_and_groups_images():
    events = [
        Event("x", "a", EventKind.STAGE1, id_(1), NOW, 1),
        Event("y", "a", EventKind.STAGE1, ood("yurt"), NOW, 2),
        Event("x", "b", EventKind.STAGE1, id_(1), NOW, 3),
        Event("x", "c", EventKind.STAGE1, id_(2), NOW, 4),  # a third annotator: refused
        Event("y", "b", EventKind.STAGE1, ood("ger"), NOW, 5),
    ]
    out = replay(events)
    assert out["x"].class_index == 1 and list(out["x"].stage1) == ["a", "b"]
    assert out["y"].status is Status.STAGE3
    assert replay(events, [("ger", "yurt")])["y"].concept == "ger"


# -- invariants over random event sequences ----------------------------------------------------
JUDGEMENTS = st.one_of(
    st.builds(ood, st.sampled_from(["kayak", "Kayak", "canoe", "sea kayak"]), st.booleans()),
    st.builds(id_, st.integers(0, 2), st.booleans()),
    st.builds(amb, st.sampled_from(["corrupted", "unresolvable"])),
)
STEPS = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c", "d", "e"]), st.sampled_from(list(EventKind)), JUDGEMENTS),
    max_size=25,
)


@settings(max_examples=300, deadline=None)
@given(STEPS)
def test_random_sequences_keep_the_protocol_invariants(steps):
    record = ImageRecord()
    accepted = []
    final = None
    for seq, (who, kind, judgement) in enumerate(steps):
        event = Event(1, who, kind, None if kind is EventKind.CLOSE else judgement, NOW, seq)
        try:
            record.apply(event)
        except AnnotateError:
            continue
        accepted.append(event)
        out = record.outcome()
        assert len(out.stage1) <= 2 and len(out.stage3) <= 3
        assert not out.stage3 or len(out.stage1) == 2  # nobody reviews before Stage 1 is complete
        if final is not None:  # a final outcome never changes
            assert out == final
        if out.status is Status.FINAL:
            final = out
            votes = list(out.stage1.values()) if out.decided_in == 2 else list(out.stage3.values())
            if out.reason != NO_CONSENSUS:
                # The final verdict is one every counted judgement agrees with.
                assert all(agree(votes[0], v) for v in votes) and out.verdict is votes[0].verdict
    # Replaying the accepted events, in any interleaving with refused ones, gives the same state.
    assert ImageRecord.from_events(accepted).outcome() == record.outcome()
    everything = [Event(1, w, k, None if k is EventKind.CLOSE else j, NOW, s) for s, (w, k, j) in enumerate(steps)]
    assert ImageRecord.from_events(everything).outcome() == record.outcome()
